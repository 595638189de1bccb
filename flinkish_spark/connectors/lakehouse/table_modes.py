"""How a routing sink applies each source table's changes: ``mode`` and ``deletes``, for all tables or per table pattern.

Format-independent (``flinkish.delta``, ``flinkish.iceberg`` and ``flinkish.postgres`` with ``{table}`` in their target
option; ``flinkish mirror``'s ``--sink-option`` and its pipeline file's ``sink.table-modes``):

* ``mode`` = ``upsert`` (default: the target holds each key's last version) | ``history`` (SCD type 2: one row per
  version with ``_valid_from``, ``_valid_to``, ``_current``, as the single-table sinks write it);
* ``deletes`` = ``true`` (default: a delete removes the key) | ``soft`` (the key's last version stays with
  ``_deleted = true``; upsert only) | ``false`` (deletes ignored; the target keeps every key it ever held);
* ``tableModes``: a JSON list of rules ``{"tables": "<patterns>", "mode": ..., "deletes": ...}`` -- the first rule whose
  patterns (the source's ``tables`` syntax, :class:`~flinkish_spark.connectors.cdc.patterns.TablePatterns`) match a
  table gives its mode and deletes; a key a rule leaves out is the sink's ``mode`` / ``deletes``; a table no rule
  matches gets those.

The guarantee it serves: a table's shape is decided once, by its name, before anything is written -- every epoch,
every restart and every replay applies a table's changes with the same mode (a rule list that changes between runs
would change a target's shape; the sinks check a target's columns against its mode, see each routed sink).
Every bad rule is one :class:`~flinkish_spark.errors.ConfigError` naming the rule and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Literal, cast

from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.lakehouse.changes import DELETED, HISTORY_COLUMNS, Deletes
from flinkish_spark.errors import ConfigError

RoutedMode = Literal["upsert", "history"]
MODES: tuple[RoutedMode, ...] = ("upsert", "history")
DELETES: tuple[Deletes, ...] = ("true", "soft", "false")
#: The sink options this module reads (each routing sink adds them to its own).
TABLE_MODE_OPTIONS = ("mode", "deletes", "tableModes")
_RULE_KEYS = ("tables", "mode", "deletes")


@dataclass(frozen=True)
class TableMode:
    """One table's shape in its target."""

    mode: RoutedMode = "upsert"
    deletes: Deletes = "true"

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """The columns the target holds besides the source table's: ``_deleted`` (soft) or the history columns."""
        if self.mode == "history":
            return HISTORY_COLUMNS
        return (DELETED,) if self.deletes == "soft" else ()

    def describe(self) -> str:
        return self.mode if self.deletes == "true" else f"{self.mode}, deletes {self.deletes}"


UPSERT = TableMode()


@dataclass(frozen=True)
class TableModeRule:
    tables: str  # the patterns as given
    mode: TableMode
    patterns: TablePatterns


@dataclass(frozen=True)
class TableModes:
    """The sink's default mode and its rules, first match wins."""

    default: TableMode = UPSERT
    rules: tuple[TableModeRule, ...] = ()

    def of(self, table: str) -> TableMode:
        """The mode of source table ``schema.table``."""
        for rule in self.rules:
            if rule.patterns.matches(table):
                return rule.mode
        return self.default


def _mode(value: object, default: TableMode, where: str, component: str) -> TableMode:
    """``default`` with ``mode`` / ``deletes`` of ``value`` (a rule's dict or the sink's options) applied."""
    assert isinstance(value, dict)
    mode = value.get("mode", default.mode)
    # a rule asking for history over the sink's soft deletes: history's own (a delete closes the version)
    deletes = value.get("deletes", "true" if mode == "history" and default.deletes == "soft" else default.deletes)
    if isinstance(deletes, bool):  # YAML's true/false
        deletes = "true" if deletes else "false"
    if mode not in MODES:
        raise ConfigError(f"{component}: {where}: mode {mode!r} is not one of {', '.join(MODES)} (a routing sink "
                          "applies changes by each table's primary key; 'append' is for a single target)")
    if deletes not in DELETES:
        raise ConfigError(f"{component}: {where}: deletes {deletes!r} is not one of {', '.join(DELETES)}")
    if mode == "history" and deletes == "soft":
        raise ConfigError(f"{component}: {where}: deletes 'soft' is for mode 'upsert'. In mode 'history' a delete "
                          "closes the key's current version (deletes 'true') or is ignored (deletes 'false').")
    return TableMode(cast(RoutedMode, mode), cast(Deletes, deletes))


def parse_table_modes(get: Callable[[str], str | None], component: str) -> TableModes:
    """The sink's ``mode``, ``deletes`` and ``tableModes`` options (``get`` returns None for an option not given)."""
    given = {k: v for k in ("mode", "deletes") if (v := get(k)) is not None}
    default = _mode(given, UPSERT, "options " + ", ".join(f"{k}={v!r}" for k, v in given.items()) if given else "",
                    component)
    raw = get("tableModes")
    if raw is None or not raw.strip():
        return TableModes(default)
    hint = ('tableModes is a JSON list of rules, e.g. [{"tables": "public.orders", "mode": "history"}, '
            '{"tables": "public.*", "deletes": "soft"}]')
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{component}: option 'tableModes' is not JSON ({e.msg} at character {e.pos}); {hint}") from None
    if not isinstance(parsed, list):
        raise ConfigError(f"{component}: option 'tableModes' is a JSON {type(parsed).__name__}; {hint}")
    rules = []
    for i, rule in enumerate(parsed, start=1):
        where = f"tableModes rule {i}"
        if not isinstance(rule, dict):
            raise ConfigError(f"{component}: {where} is {rule!r}, not an object; {hint}")
        unknown = sorted(set(rule) - set(_RULE_KEYS))
        if unknown:
            raise ConfigError(f"{component}: {where} has unknown key(s) {', '.join(map(repr, unknown))}; a rule has "
                              f"{', '.join(map(repr, _RULE_KEYS))}")
        tables = rule.get("tables")
        if not isinstance(tables, str) or not tables.strip():
            raise ConfigError(f"{component}: {where} has no 'tables' (the table patterns it applies to, e.g. "
                              "'public.orders, sales.*')")
        patterns = TablePatterns.parse(tables, f"{component}: {where}")
        rules.append(TableModeRule(tables, _mode(rule, default, f"{where} ({tables!r})", component), patterns))
    return TableModes(default, tuple(rules))


def table_modes_option(rules: list[dict[str, object]]) -> str:
    """The ``tableModes`` option of ``rules`` (what ``flinkish mirror`` passes from its pipeline file)."""
    return json.dumps(rules, separators=(",", ":"))
