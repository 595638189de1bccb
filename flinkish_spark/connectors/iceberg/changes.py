"""Keyed change application, format-independent part: options, the table's columns, and the
within-epoch resolution of a change stream (``_op``, ``_lsn``, ``_commit_ts`` columns).

*Interim*: the shared core (connectors/lakehouse/, branch ``keyed-delta``) owns these
rules for both table formats; this module holds the Iceberg sink's copy of them until
that core is merged, with the same semantics:

* ``mode=upsert``: the last change of a key in the epoch wins -- ordered by ``_lsn``
  (nulls first: snapshot rows), then by input order (Spark partition, then row); a key
  deleted and inserted again ends inserted. ``deletes=true`` removes the key's row,
  ``soft`` keeps it with ``_deleted = true``, ``false`` ignores deletes. The change
  columns are not written.
* ``mode=history`` (SCD type 2): every change is a version with ``_valid_from`` (its
  ``_commit_ts``), ``_valid_to`` (the next change's ``_commit_ts``, null while current)
  and ``_current``; a delete closes the current version and adds none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T
from pyspark.sql.types import StructType

from flinkish_spark.errors import ChangeDataError, ConfigError
from flinkish_spark.options import Options

Mode = Literal["append", "upsert", "history"]
Deletes = Literal["true", "soft", "false"]
MergeMode = Literal["mergeOnRead", "copyOnWrite"]
CHANGE_COLUMNS = ("_op", "_lsn", "_commit_ts")
OPS = ("r", "c", "u", "d")
PART, ROW = "_part", "_row"  # input order, added by the task that staged the rows
DELETED = "_deleted"
VALID_FROM, VALID_TO, CURRENT = "_valid_from", "_valid_to", "_current"
PRIMARY_KEY_METADATA = "flinkish.primaryKey"  # what a source marks its key columns with


@dataclass(frozen=True)
class Keyed:
    mode: Mode = "append"
    key: tuple[str, ...] = ()
    deletes: Deletes = "true"
    merge_mode: MergeMode = "mergeOnRead"
    compact_every: int = 0

    @property
    def keyed(self) -> bool:
        return self.mode != "append"

    @classmethod
    def from_options(cls, opts: Options) -> "Keyed":
        mode: Mode = opts.choice("mode", ("append", "upsert", "history"), "append")
        raw = opts.get("key") or ""
        deletes: Deletes = opts.choice("deletes", ("true", "soft", "false"), "true")
        merge: MergeMode = opts.choice("mergeMode", ("mergeOnRead", "copyOnWrite"), "mergeOnRead")
        every = opts.integer("compactEvery", 0, minimum=0) or 0
        return cls(mode, tuple(k.strip() for k in raw.split(",") if k.strip()), deletes, merge, every)

    def resolved(self, schema: StructType, component: str) -> "Keyed":
        """These options checked against the query's columns, the key taken from the schema when not given."""
        names = schema.fieldNames()
        if not self.keyed:
            return self
        key = self.key or carried_key(schema)
        if not key:
            raise ConfigError(
                f"{component}: mode '{self.mode}' needs option 'key' (the comma-separated key columns); the query's "
                f"columns carry no primary key ({schema.simpleString()})")
        missing = [k for k in key if k not in names]
        if missing:
            raise ConfigError(f"{component}: option 'key' names {missing}, which the query does not write "
                              f"({schema.simpleString()})")
        if self.deletes != "false" and "_op" not in names:
            raise ConfigError(f"{component}: deletes '{self.deletes}' needs a column '_op' ('d' marks a delete); set "
                              f"deletes to false for a stream without deletes ({schema.simpleString()})")
        if self.mode == "history" and "_commit_ts" not in names:
            raise ConfigError(f"{component}: mode 'history' needs a column '_commit_ts' (when each change happened)")
        return Keyed(self.mode, tuple(key), self.deletes, self.merge_mode, self.compact_every)

    def table_schema(self, schema: StructType) -> StructType:
        """The table's columns for the query's schema: the change columns are not written."""
        if not self.keyed:
            return schema
        fields = [f for f in schema.fields if f.name not in CHANGE_COLUMNS]
        if self.mode == "upsert" and self.deletes == "soft":
            fields.append(T.StructField(DELETED, T.BooleanType()))
        if self.mode == "history":
            fields += [T.StructField(VALID_FROM, T.TimestampType()), T.StructField(VALID_TO, T.TimestampType()),
                       T.StructField(CURRENT, T.BooleanType())]
        return T.StructType(fields)


def carried_key(schema: StructType) -> tuple[str, ...]:
    """The primary key the stream's schema carries in its column metadata, in key order (empty: none)."""
    marked = []
    for f in schema.fields:
        pos = (f.metadata or {}).get(PRIMARY_KEY_METADATA)
        if isinstance(pos, int) and not isinstance(pos, bool):
            marked.append((pos, f.name))
    return tuple(name for _, name in sorted(marked))


def checked(table: pa.Table, spec: Keyed, partition: int, component: str) -> pa.Table:
    """A task's rows with their input order, refused when a key is null or an ``_op`` unknown."""
    for k in spec.key:
        nulls = table[k].null_count
        if nulls:
            raise ChangeDataError(f"{component}: {nulls} row(s) have a null in the key column {k!r}; a keyed write "
                                  "needs every key column set. Filter or fill them before the sink.")
    if "_op" in table.column_names:
        bad = pc.invert(pc.fill_null(pc.is_in(table["_op"], pa.array(OPS)), False))
        if pc.any(bad).as_py():
            seen = sorted({str(v) for v in table.filter(bad)["_op"].to_pylist()})[:5]
            raise ChangeDataError(f"{component}: column '_op' holds {seen}; the change operations are r, c, u, d")
        if spec.deletes == "false":
            table = table.filter(pc.not_equal(table["_op"], "d"))
    n = table.num_rows
    return table.append_column(PART, pa.array(np.full(n, partition), pa.int32())).append_column(
        ROW, pa.array(np.arange(n), pa.int64()))


def ordered(table: pa.Table, spec: Keyed) -> pa.Table:
    """Changes sorted by key, then ``_lsn`` (nulls first), then input order."""
    keys = [(k, "ascending", "at_start") for k in spec.key]
    if "_lsn" in table.column_names:
        keys.append(("_lsn", "ascending", "at_start"))
    keys += [(PART, "ascending", "at_start"), (ROW, "ascending", "at_start")]
    return table.take(pc.sort_indices(table, sort_keys=keys))


def last_per_key(table: pa.Table, spec: Keyed) -> pa.Table:
    """The last change of every key (upsert)."""
    t = ordered(table, spec)
    t = t.append_column("__i", pa.array(np.arange(t.num_rows), pa.int64()))
    last = t.group_by(list(spec.key), use_threads=False).aggregate([("__i", "max")])
    return t.take(np.sort(last["__i_max"].to_numpy())).drop_columns(["__i"])


def same_key_as_next(t: pa.Table, spec: Keyed) -> np.ndarray:
    """For changes sorted by key: does row i+1 have the key of row i?"""
    n = t.num_rows
    same = np.ones(max(n - 1, 0), dtype=bool)
    for k in spec.key:
        col = t[k].combine_chunks()
        same &= pc.equal(col.slice(0, n - 1), col.slice(1)).to_numpy(zero_copy_only=False) if n > 1 else same
    return np.append(same, False) if n else np.zeros(0, dtype=bool)


def history_versions(table: pa.Table, spec: Keyed) -> tuple[pa.Table, pa.Table]:
    """SCD2 rows of an epoch's changes: (new versions, first change per key with its ``_commit_ts``
    -- what closes the key's current version in the table)."""
    t = ordered(table, spec)
    n = t.num_rows
    same_next = same_key_as_next(t, spec)
    ts = t["_commit_ts"].combine_chunks()
    next_ts = pa.concat_arrays([ts.slice(1), pa.nulls(1, ts.type)]) if n else ts
    valid_to = pc.if_else(pa.array(same_next), next_ts, pa.nulls(n, ts.type))
    is_delete = pc.fill_null(pc.equal(t["_op"], "d"), False) if "_op" in t.column_names else pa.array(np.zeros(n, bool))
    current = pc.and_(pa.array(~same_next), pc.invert(is_delete))
    versions = (t.append_column(VALID_FROM, ts).append_column(VALID_TO, valid_to).append_column(CURRENT, current)
                .filter(pc.invert(is_delete)))
    first = np.ones(n, dtype=bool)
    first[1:] = ~same_next[:-1]
    return versions, t.filter(pa.array(first))
