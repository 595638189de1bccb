"""The shape each mirrored table takes in its target: ``mode`` / ``deletes`` / ``trackHistoryColumns`` for all tables
or per table pattern.

The routing sinks apply them (:mod:`flinkish_spark.connectors.lakehouse.table_modes`); this module is what
``flinkish mirror`` adds: the same options from ``--sink-option mode=history`` / ``deletes=soft`` /
``tableModes=[...]`` and from the pipeline file's ``sink`` section (``mode``, ``deletes`` and the rule list
``table-modes``, whose rules take the sink option's keys; ``trackHistoryColumns`` and
``trackHistoryColumns.except`` a YAML list or a comma-separated string), checked before anything starts -- a bad rule is the preflight's one error, nothing written.

Also the pipeline file's Flink CDC ``transform`` block (:func:`yaml_transforms`): each rule's ``source-table``,
``projection``, ``filter`` (and flinkish's ``columns``, ``columns.exclude``, ``computed``) as the routing sinks'
option ``transforms`` (:mod:`flinkish_spark.connectors.lakehouse.transform.rules`).
"""

from __future__ import annotations

from typing import Any, Mapping

from flinkish_spark.connectors.lakehouse.table_modes import (
    NO_PARTITIONS, TRACK, TRACK_EXCEPT, TableModes, parse_table_modes, table_modes_option,
)
from flinkish_spark.connectors.lakehouse.transform.rules import RULE_KEYS, parse_transforms, transforms_option
from flinkish_spark.errors import ConfigError

#: The pipeline file's key for the rule list (Flink CDC style, a YAML list); the sink option is ``tableModes``.
YAML_RULES = "table-modes"


def check_modes(extra: Mapping[str, str], what: str, fmt: str = "") -> TableModes:
    """The sink options' table modes, or the one error naming ``what`` (``--sink-option`` / ``pipeline file: sink``);
    a rule's ``partitionBy`` for a format whose targets do not take it (``fmt``: delta, postgres) is one too."""
    # ... and the transforms (columns and rows chosen): every rule's SQL is compiled here, before anything starts
    parse_transforms(extra.get, what)
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



#: Flink CDC's transform keys this mirror does not take, with why.
_NOT_TAKEN = {"primary-keys": "each target is keyed by its source table's primary key",
              "partition-keys": "partitions of routed targets are not chosen by a transform",
              "table-options": "a target's options are the sink's",
              "converter-after-transform": "no converters"}


def yaml_transforms(block: Any) -> str:
    """The ``transforms`` sink option of the pipeline file's ``transform`` list."""
    if not isinstance(block, list):
        raise ConfigError("pipeline file: 'transform' must be a list of rules (- source-table: public.users\n"
                          "  projection: \\*, upper(name) AS uname\n  filter: id > 10), not a " + type(block).__name__)
    keys = ("source-table", *(k for k in RULE_KEYS if k != "tables"))
    rules = []
    for i, rule in enumerate(block):
        where = f"pipeline file: transform[{i}]"
        if not isinstance(rule, dict):
            raise ConfigError(f"{where} must be a mapping (source-table, projection, filter)")
        for key in rule:
            if key in _NOT_TAKEN:
                raise ConfigError(f"{where}.{key} is not supported: {_NOT_TAKEN[key]}")
            if key not in keys:
                raise ConfigError(f"{where}: unknown key {key!r}; a rule has {', '.join(keys)}")
        if "source-table" not in rule:
            raise ConfigError(f"{where} has no source-table (the tables it applies to, e.g. public.users)")
        rules.append({("tables" if k == "source-table" else k): v for k, v in rule.items()})
    return transforms_option(rules)
