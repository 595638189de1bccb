"""Keyed change application for the lakehouse sinks: the options, the plan, the input checks.

Format-independent: ``flinkish.delta`` and ``flinkish.iceberg`` parse the same options
into the same :class:`ChangePlan`, check every task's rows with :func:`check_rows`, and
resolve an epoch's changes with :mod:`flinkish_spark.connectors.lakehouse.resolve`.

Options (the names and meanings of the ``flinkish.postgres`` sink's):

* ``mode`` = ``append`` (default: rows are appended as they come) | ``upsert`` (the table
  holds one row per key: the key's last change) | ``history`` (SCD type 2: every version
  of a key, with ``_valid_from``, ``_valid_to``, ``_current``, from ``_commit_ts``).
* ``key``: comma-separated key columns; default the primary key the stream's schema
  carries (:mod:`flinkish_spark.connectors.primary_key`; ``flinkish.postgres`` marks it).
* ``deletes`` = ``false`` (default: a row with ``_op = 'd'`` changes nothing) | ``true``
  (it deletes its key; in history mode it closes the key's current version) | ``soft``
  (upsert only: the key's row stays, with ``_deleted = true``).
* ``mergeMode`` = ``mergeOnRead`` (default: replaced rows are marked deleted -- Delta
  deletion vectors, Iceberg position deletes) | ``copyOnWrite`` (files that hold replaced
  rows are rewritten without them, for readers that cannot apply deletes).

The change columns ``_op``, ``_lsn``, ``_commit_ts`` and ``_unchanged`` (a list of the columns
a change did not carry, whose values the table keeps: the multi-table stream's unchanged TOASTed
values) steer the keyed modes and are not written to the table. Order of changes within an epoch: ``_lsn`` (a row without one, a
snapshot read, comes first), then the order of the input (Spark partition, then row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from flinkish_spark.connectors.primary_key import carried_key, partial_key
from flinkish_spark.errors import ChangeDataError, ConfigError
from flinkish_spark.options import Options

Mode = Literal["append", "upsert", "history"]
Deletes = Literal["true", "soft", "false"]
MergeMode = Literal["mergeOnRead", "copyOnWrite"]

OP, LSN, COMMIT_TS = "_op", "_lsn", "_commit_ts"
#: list<string>: the columns a change did not carry (an update that left a TOASTed value unchanged); the table
#: keeps that column's value -- the key's earlier version in the epoch, else its row in the table
UNCHANGED = "_unchanged"
CHANGE_COLUMNS = (OP, LSN, COMMIT_TS, UNCHANGED)
OPS = ("r", "c", "u", "d")  # snapshot read, insert (create), update, delete
DELETED = "_deleted"
VALID_FROM, VALID_TO, CURRENT = "_valid_from", "_valid_to", "_current"
HISTORY_COLUMNS = (VALID_FROM, VALID_TO, CURRENT)
TIMESTAMP = pa.timestamp("us", tz="UTC")

#: The options this module parses; a sink adds them to its own.
KEYED_SINK_OPTIONS = ("mode", "key", "deletes", "mergeMode")


@dataclass(frozen=True)
class KeyedOptions:
    """The keyed options as given (the key may still be empty: the input's carried key is the default)."""

    mode: Mode = "append"
    key: tuple[str, ...] = ()
    deletes: Deletes = "false"
    merge_mode: MergeMode = "mergeOnRead"

    @property
    def keyed(self) -> bool:
        return self.mode != "append"


def parse_keyed_options(opts: Options) -> KeyedOptions:
    """Read ``mode``, ``key``, ``deletes``, ``mergeMode``; refuse combinations that mean nothing."""
    mode: Mode = opts.choice("mode", ("append", "upsert", "history"), "append")
    key = tuple(k.strip() for k in (opts.get("key") or "").split(",") if k.strip())
    deletes: Deletes = opts.choice("deletes", ("true", "soft", "false"), "false")
    merge_mode: MergeMode = opts.choice("mergeMode", ("mergeOnRead", "copyOnWrite"), "mergeOnRead")
    if mode == "append":
        given = [name for name in ("key", "deletes", "mergeMode") if opts.has(name)]
        if given:
            raise ConfigError(
                f"{opts.component}: option {', '.join(repr(g) for g in given)} applies to mode 'upsert' or "
                "'history' (changes applied by key); the mode is 'append'. Set .option('mode', 'upsert') or drop it."
            )
    if mode == "history" and deletes == "soft":
        raise ConfigError(
            f"{opts.component}: deletes 'soft' is for mode 'upsert'. In mode 'history' a delete closes the key's "
            "current version (deletes 'true') or is ignored (deletes 'false')."
        )
    return KeyedOptions(mode, key, deletes, merge_mode)


@dataclass(frozen=True)
class ChangePlan:
    """How one query's changes are applied: resolved on the driver, pickled into the tasks."""

    mode: Literal["upsert", "history"]
    key: tuple[str, ...]
    deletes: Deletes
    merge_mode: MergeMode
    input_schema: pa.Schema  # the stream's columns, change columns included
    table_schema: pa.Schema  # the table's columns
    #: history: the columns whose change makes a new version; a change of only others updates the key's current
    #: version in place (:mod:`.tracked`). None: every column (a plan pickled before the field reads the default)
    track: tuple[str, ...] | None = None

    @property
    def has_op(self) -> bool:
        return OP in self.input_schema.names

    @property
    def has_lsn(self) -> bool:
        return LSN in self.input_schema.names

    @property
    def has_unchanged(self) -> bool:
        return UNCHANGED in self.input_schema.names

    @property
    def data_columns(self) -> tuple[str, ...]:
        """The input's columns that the table holds as they are (not the change columns)."""
        return tuple(n for n in self.input_schema.names if n not in CHANGE_COLUMNS)

    @property
    def live_column(self) -> str | None:
        """A table column whose false value means "not a row a change replaces" (history's closed versions)."""
        return CURRENT if self.mode == "history" else None


_KEY_TYPES = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
              pa.types.is_date, pa.types.is_timestamp, pa.types.is_decimal, pa.types.is_boolean)


def plan_changes(options: KeyedOptions, schema: StructType, arrow_input: pa.Schema, component: str) -> ChangePlan:
    """Resolve the keyed options against the query's schema; every error names the option and the fix."""
    assert options.keyed
    mode: Literal["upsert", "history"] = "history" if options.mode == "history" else "upsert"
    names = arrow_input.names
    key = options.key or carried_key(schema)
    partial = [] if options.key else partial_key(schema)
    if partial:
        raise ConfigError(
            f"{component}: the query's columns carry only part of a primary key "
            f"({', '.join(f'{name!r} is column {pos} of it' for pos, name in partial)}): a column of the source "
            "table's key was dropped, and the rest would make rows it tells apart replace each other. Keep every "
            "key column in the query, or set .option('key', 'col1,col2') to the key the target table should have."
        )
    if not key:
        raise ConfigError(
            f"{component}: mode '{mode}' needs a key, and the query's columns carry no primary key "
            f"({schema.simpleString()}). Set .option('key', 'col1,col2'), or read from a source that "
            "carries its table's primary key (flinkish.postgres does; a computed column does not keep it)."
        )
    missing = [k for k in key if k not in names]
    if missing:
        raise ConfigError(f"{component}: option 'key' names {missing}, which the query does not have "
                          f"({schema.simpleString()})")
    reserved = [k for k in key if k in CHANGE_COLUMNS + (DELETED,) + HISTORY_COLUMNS]
    if reserved:
        raise ConfigError(f"{component}: option 'key' names {reserved}, which steer the change application "
                          "and are not table columns; name the table's own key columns")
    for k in key:
        t = arrow_input.field(k).type
        if not any(check(t) for check in _KEY_TYPES):
            raise ConfigError(f"{component}: key column {k!r} has the type {t}; a key column must be an "
                              "integer, string, binary, date, timestamp, decimal or boolean column")
    if options.deletes != "false" and OP not in names:
        raise ConfigError(f"{component}: option deletes={options.deletes!r} needs a column '_op' ('d' marks a "
                          f"delete); the query writes {schema.simpleString()}")
    if UNCHANGED in names and not (pa.types.is_list(arrow_input.field(UNCHANGED).type)
                                   and pa.types.is_string(arrow_input.field(UNCHANGED).type.value_type)):
        raise ConfigError(f"{component}: the column '_unchanged' steers the change application (per row, the names "
                          f"of the columns the change did not carry: array<string>) but has the type "
                          f"{arrow_input.field(UNCHANGED).type}; rename it")
    if mode == "history" and COMMIT_TS not in names:
        raise ConfigError(f"{component}: mode 'history' needs a column '_commit_ts' (when each change was "
                          f"committed: it becomes _valid_from/_valid_to); the query writes {schema.simpleString()}")
    extra = [DELETED] if options.deletes == "soft" else list(HISTORY_COLUMNS) if mode == "history" else []
    clash = [c for c in extra if c in names]
    if clash:
        raise ConfigError(f"{component}: the query has the column(s) {clash}, which mode {mode!r} with "
                          f"deletes={options.deletes!r} writes itself; rename them")
    fields = [f for f in arrow_input if f.name not in CHANGE_COLUMNS] + mode_fields(mode, options.deletes)
    return ChangePlan(mode, tuple(key), options.deletes, options.merge_mode, arrow_input, pa.schema(fields))


def mode_fields(mode: Literal["upsert", "history"], deletes: Deletes) -> list[pa.Field]:
    """The columns a keyed table holds besides its data in ``mode``: ``_deleted`` (soft deletes) or history's."""
    if mode == "history":
        return [pa.field(VALID_FROM, TIMESTAMP), pa.field(VALID_TO, TIMESTAMP), pa.field(CURRENT, pa.bool_())]
    return [pa.field(DELETED, pa.bool_())] if deletes == "soft" else []


def check_rows(plan: ChangePlan, table: pa.Table, component: str) -> None:
    """Refuse rows that cannot be applied by key: a null in a key column, an unknown ``_op``.

    Raised in the task before anything of it is committed: the epoch fails, its files are
    removed by the sink's abort, the table stays as it was.
    """
    for k in plan.key:
        nulls = table.column(k).null_count
        if nulls:
            raise ChangeDataError(
                f"{component}: {nulls} row(s) have a null in the key column {k!r}; a keyed table cannot hold "
                "them. Filter them out, or choose a key that is never null (the source table's primary key)."
            )
    if plan.has_op:
        op = table.column(OP)
        bad = pc.invert(pc.fill_null(pc.is_in(op, value_set=pa.array(OPS)), False))
        if pc.any(bad).as_py():
            values = sorted({str(v) for v in pc.filter(op, bad).to_pylist()})[:5]
            raise ChangeDataError(
                f"{component}: the column '_op' holds {', '.join(values)}; a change is one of r (snapshot read), "
                "c (insert), u (update), d (delete). Map the stream's change kinds to these."
            )


def key_type_changes(plan: ChangePlan, table_schema: pa.Schema) -> list[str]:
    """Key columns whose type in an existing table differs from the query's (for one clear error)."""
    out = []
    for k in plan.key:
        if k in table_schema.names and table_schema.field(k).type != plan.table_schema.field(k).type:
            out.append(f"{k!r} is {table_schema.field(k).type} in the table but {plan.table_schema.field(k).type} "
                       "in the query")
    return out
