"""The shape each mirrored table takes in its target: ``mode`` / ``deletes`` / ``trackHistoryColumns`` for all tables
or per table pattern.

The routing sinks apply them (:mod:`flinkish_spark.connectors.lakehouse.table_modes`); this module is what
``flinkish mirror`` adds: the same options from ``--sink-option mode=history`` / ``deletes=soft`` /
``tableModes=[...]`` and from the pipeline file's ``sink`` section (``mode``, ``deletes`` and the rule list
``table-modes``, whose rules take the sink option's keys; ``trackHistoryColumns`` and
``trackHistoryColumns.except`` a YAML list or a comma-separated string), checked before anything starts -- a bad rule is the preflight's one error, nothing written.
"""

from __future__ import annotations

from typing import Any, Mapping

from flinkish_spark.connectors.lakehouse.table_modes import (
    NO_PARTITIONS, TRACK, TRACK_EXCEPT, TableModes, parse_table_modes, table_modes_option,
)
from flinkish_spark.errors import ConfigError

#: The pipeline file's key for the rule list (Flink CDC style, a YAML list); the sink option is ``tableModes``.
YAML_RULES = "table-modes"


def check_modes(extra: Mapping[str, str], what: str, fmt: str = "") -> TableModes:
    """The sink options' table modes, or the one error naming ``what`` (``--sink-option`` / ``pipeline file: sink``);
    a rule's ``partitionBy`` for a format whose targets do not take it (``fmt``: delta, postgres) is one too."""
    modes = parse_table_modes(extra.get, what)
    if fmt in NO_PARTITIONS:
        modes.refuse_partitions(what, fmt)
    return modes


def yaml_modes(sink: Mapping[str, Any]) -> dict[str, str]:
    """The sink options of the pipeline file's ``mode``, ``deletes`` and ``table-modes`` (YAML's ``true``/``false``
    as the option's words)."""
    out: dict[str, str] = {}
    for key in ("mode", "deletes"):
        if key in sink:
            value = sink[key]
            if isinstance(value, (dict, list)):
                raise ConfigError(f"pipeline file: sink.{key} must be a single value, not a {type(value).__name__}")
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    for key in (TRACK, TRACK_EXCEPT):
        if key in sink:
            value = sink[key]
            if isinstance(value, dict) or (isinstance(value, list) and not all(isinstance(c, str) for c in value)):
                raise ConfigError(f"pipeline file: sink.{key} must be a list of column names, not {value!r}")
            out[key] = ",".join(value) if isinstance(value, list) else str(value)
    if YAML_RULES in sink:
        rules = sink[YAML_RULES]
        if not isinstance(rules, list):
            raise ConfigError(f"pipeline file: sink.{YAML_RULES} must be a list of rules "
                              "(- tables: public.orders\\n  mode: history), not a " + type(rules).__name__)
        out["tableModes"] = table_modes_option(
            [{k: (str(v).lower() if isinstance(v, bool) else v) for k, v in r.items()} if isinstance(r, dict) else r
             for r in rules])
    return out

