"""How a routing sink applies each source table's changes: ``mode`` and ``deletes``, for all tables or per table pattern.

Format-independent (``flinkish.delta``, ``flinkish.iceberg`` and ``flinkish.postgres`` with ``{table}`` in their target
option; ``flinkish mirror``'s ``--sink-option`` and its pipeline file's ``sink.table-modes``):

* ``mode`` = ``upsert`` (default: the target holds each key's last version) | ``history`` (SCD type 2: one row per
  version with ``_valid_from``, ``_valid_to``, ``_current``, as the single-table sinks write it);
* ``deletes`` = ``true`` (default: a delete removes the key) | ``soft`` (the key's last version stays with
  ``_deleted = true``; upsert only) | ``false`` (deletes ignored; the target keeps every key it ever held);
* ``trackHistoryColumns`` (history only; Databricks' ``track_history_column_list``): the columns whose change makes
  a new version; a change of only other columns updates the key's current version in place (``_valid_from``
  kept). ``trackHistoryColumns.except`` (``track_history_except_column_list``): every column but these is tracked.
  Default: every column. Key columns are never listed (a key does not change); a name the table does not have is
  refused when its schema arrives (:meth:`TableMode.tracked`);
* ``tableModes``: a JSON list of rules ``{"tables": "<patterns>", "mode": ..., "deletes": ...,
  "trackHistoryColumns": [...], "partitionBy": [...]}`` (``partitionBy``: a rule's own, never the sink's -- the
  target's partition columns, Delta and Iceberg; PostgreSQL refuses it) -- the first rule whose patterns (the source's ``tables`` syntax,
  :class:`~flinkish_spark.connectors.cdc.patterns.TablePatterns`) match a table gives its mode, deletes and tracked
  columns; a key a rule leaves out is the sink's ``mode`` / ``deletes`` / tracked columns (these only for a table in
  history mode); a table no rule matches gets those.

The guarantee it serves: a table's shape is decided once, by its name, before anything is written -- every epoch,
every restart and every replay applies a table's changes with the same mode (a rule list that changes between runs
would change a target's shape; the sinks check a target's columns against its mode, see each routed sink).
Every bad rule is one :class:`~flinkish_spark.errors.ConfigError` naming the rule and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, cast

from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.lakehouse.changes import DELETED, HISTORY_COLUMNS, Deletes
from flinkish_spark.errors import ConfigError

RoutedMode = Literal["upsert", "history"]
MODES: tuple[RoutedMode, ...] = ("upsert", "history")
DELETES: tuple[Deletes, ...] = ("true", "soft", "false")
#: The sink options this module reads (each routing sink adds them to its own).
TRACK, TRACK_EXCEPT = "trackHistoryColumns", "trackHistoryColumns.except"
PARTITION_BY = "partitionBy"  # a rule's key only: a routing sink's own 'partitionBy' option is refused
TABLE_MODE_OPTIONS = ("mode", "deletes", "tableModes", TRACK, TRACK_EXCEPT)
#: Why a format's routed targets refuse a rule's ``partitionBy`` (Iceberg takes it).
NO_PARTITIONS = {
    "postgres": "a partitioned PostgreSQL table needs the partition columns in its primary key and every partition "
                "created ahead; index the column instead, or create and partition the target yourself",
}
_RULE_KEYS = ("tables", "mode", "deletes", TRACK, TRACK_EXCEPT, PARTITION_BY)


@dataclass(frozen=True)
class TableMode:
    """One table's shape in its target."""

    mode: RoutedMode = "upsert"
    deletes: Deletes = "true"
    #: history: the columns whose change makes a new version (None: every column) ...
    track: tuple[str, ...] | None = None
    #: ... or every column but these (``trackHistoryColumns.except``)
    track_except: tuple[str, ...] = ()
    #: a rule's ``partitionBy``: the target's partition columns (Delta, Iceberg identity; PostgreSQL refuses it)
    partition_by: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[str, str]:
        """What the target holds per key (``mode``, ``deletes``), whatever the tracking and partitioning."""
        return self.mode, self.deletes

    def check_partitions(self, columns: list[str], table: str) -> None:
        """A partition column the table does not have: one :class:`ConfigError` naming the fix."""
        missing = [c for c in self.partition_by if c not in columns]
        if missing:
            raise ConfigError(f"source table {table}: the tableModes rule's partitionBy names {', '.join(map(repr, missing))}, "
                              f"which the table does not have (its columns: {', '.join(columns)}); name one of its "
                              "columns, or give the table a rule of its own")

    def tracked(self, columns: list[str], key: tuple[str, ...], table: str) -> tuple[str, ...] | None:
        """The tracked columns among the table's data ``columns`` (None: every column is, today's history); a
        listed name the table does not have, or a key column, is one :class:`ConfigError` naming the fix."""
        if self.mode != "history" or (self.track is None and not self.track_except):
            return None
        given = self.track if self.track is not None else self.track_except
        option = TRACK if self.track is not None else TRACK_EXCEPT
        keys = [c for c in given if c in key]
        if keys:
            raise ConfigError(f"source table {table}: {option} lists the key column(s) {', '.join(keys)}; a key does "
                              "not change (a version is per key): leave them out")
        unknown = [c for c in given if c not in columns]
        if unknown:
            raise ConfigError(f"source table {table}: {option} lists {', '.join(map(repr, unknown))}, which the table "
                              f"does not have (its columns: {', '.join(columns)}); correct the name, or give the table "
                              "a rule of its own in 'tableModes'")
        if self.track is not None:
            return tuple(c for c in columns if c in self.track)
        return tuple(c for c in columns if c not in key and c not in self.track_except)

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """The columns the target holds besides the source table's: ``_deleted`` (soft) or the history columns."""
        if self.mode == "history":
            return HISTORY_COLUMNS
        return (DELETED,) if self.deletes == "soft" else ()

    def describe(self) -> str:
        """The shape (the mode's columns) and the tracking; not the partitioning."""
        out = self.mode if self.deletes == "true" else f"{self.mode}, deletes {self.deletes}"
        if self.track is not None:
            out += f", tracking {', '.join(self.track)}"
        elif self.track_except:
            out += f", tracking all but {', '.join(self.track_except)}"
        return out


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

    def refuse_partitions(self, component: str, fmt: str) -> None:
        """For a format whose routed targets are unpartitioned: a rule with ``partitionBy`` is one error."""
        rules = [r.tables for r in self.rules if r.mode.partition_by]
        if rules:
            raise ConfigError(f"{component}: the tableModes rule(s) for {', '.join(map(repr, rules))} give partitionBy, "
                              f"which this sink's routed targets do not take ({NO_PARTITIONS[fmt]}). Drop it from "
                              "the rule(s) (Delta and Iceberg targets take it)")

    def of(self, table: str) -> TableMode:
        """The mode of source table ``schema.table``."""
        for rule in self.rules:
            if rule.patterns.matches(table):
                return rule.mode
        return self.default


def _columns(value: object, where: str, key: str, component: str) -> tuple[str, ...]:
    """A column list: a JSON/YAML list of names or one comma-separated string."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(c, str) for c in items):
        raise ConfigError(f"{component}: {where}: {key} is {value!r}; give a list of column names, e.g. "
                          '["status", "price"] (or "status, price")')
    names = tuple(c.strip() for c in items if c.strip())
    if not names:
        raise ConfigError(f"{component}: {where}: {key} names no column")
    return names


def _track(value: Mapping[str, object], default: TableMode, mode: str, where: str,
           component: str) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The tracked columns of a rule (or the sink): its own, else the default's when it is in history mode."""
    if TRACK in value and TRACK_EXCEPT in value:
        raise ConfigError(f"{component}: {where}: give {TRACK} (the columns tracked) or {TRACK_EXCEPT} (every "
                          "column but these), not both")
    if TRACK in value or TRACK_EXCEPT in value:
        if mode != "history":
            raise ConfigError(f"{component}: {where}: {TRACK if TRACK in value else TRACK_EXCEPT} is for mode "
                              f"'history' (which changes make a new version); the mode here is {mode!r}. Set mode "
                              "'history' or drop it")
        if TRACK in value:
            return _columns(value[TRACK], where, TRACK, component), ()
        return None, _columns(value[TRACK_EXCEPT], where, TRACK_EXCEPT, component)
    if mode != "history":
        return None, ()
    return default.track, default.track_except


def _mode(value: object, default: TableMode, where: str, component: str) -> TableMode:
    """``default`` with ``mode`` / ``deletes`` / tracked columns of ``value`` (a rule's dict or the sink's options)."""
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
    track, track_except = _track(value, default, mode, where, component)
    parts = _columns(value[PARTITION_BY], where, PARTITION_BY, component) if PARTITION_BY in value else ()
    return TableMode(cast(RoutedMode, mode), cast(Deletes, deletes), track, track_except, parts)


def parse_table_modes(get: Callable[[str], str | None], component: str) -> TableModes:
    """The sink's ``mode``, ``deletes`` and ``tableModes`` options (``get`` returns None for an option not given)."""
    given = {k: v for k in ("mode", "deletes") if (v := get(k)) is not None}
    sink_track = {k: v for k in (TRACK, TRACK_EXCEPT) if (v := get(k)) is not None}
    where = "options " + ", ".join(f"{k}={v!r}" for k, v in {**given, **sink_track}.items()) if given or sink_track else ""
    default = _mode(given, UPSERT, where, component)
    if sink_track:
        # the sink's tracked columns: for every table in history mode (the sink's, or a rule's)
        track, track_except = _track(sink_track, default, "history", where or "options", component)
        default = TableMode(default.mode, default.deletes, track, track_except)
    raw = get("tableModes")
    if raw is None or not raw.strip():
        if sink_track and default.mode != "history":
            raise ConfigError(f"{component}: option {next(iter(sink_track))} is for mode 'history' (which changes "
                              "make a new version); no table is in it. Set mode 'history' (or a 'tableModes' rule "
                              "with it) or drop the option")
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
    if sink_track and default.mode != "history" and not any(r.mode.mode == "history" for r in rules):
        raise ConfigError(f"{component}: option {next(iter(sink_track))} is for mode 'history' (which changes make a "
                          "new version); no table is in it. Set mode 'history' (or a 'tableModes' rule with it) or "
                          "drop the option")
    return TableModes(default, tuple(rules))


def table_modes_option(rules: list[dict[str, object]]) -> str:
    """The ``tableModes`` option of ``rules`` (what ``flinkish mirror`` passes from its pipeline file)."""
    return json.dumps(rules, separators=(",", ":"))
