"""A followed table's catalog signature: what the catalog shows of the changes the WAL does not carry.

PostgreSQL changes a table's rows without any row change in the WAL for several everyday
statements: a table rewrite (``ALTER COLUMN ... TYPE ... USING``, ``VACUUM FULL``, ``CLUSTER``,
``TRUNCATE``) gives it a new ``relfilenode``; ``ADD COLUMN ... DEFAULT x`` (catalog-only since
PostgreSQL 11) a column with ``atthasmissing``; ``RENAME COLUMN`` another name for the same
``attnum``; ``DETACH PARTITION`` / ``DROP TABLE <partition>`` / ``TRUNCATE <partition>`` under
``publish_via_partition_root`` another set of leaf partitions or a partition's new
``relfilenode``. The multi-table enumerator records a :class:`Signature` per table and compares
it at every catalog poll (:func:`signatures`: one query for all followed tables); :func:`change`
says whether the difference needs a re-snapshot, and why.

What it does not flag (the Relation message of the next change carries it, or no value
changes): an added column without a missing value (nullable, no default), a dropped column, a
type change without a rewrite (``varchar(10)`` -> ``text``, ``numeric(12,2)`` -> ``numeric(14,2)``),
an empty new partition. What it cannot tell apart: ``VACUUM FULL`` and ``CLUSTER`` rewrite the
table with the same values -- they cost a re-snapshot all the same. Generated columns are left
out (the source never mirrors them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from flinkish_spark.errors import PostgresSourceError

#: A column: (attnum, name, has a missing value -- ADD COLUMN ... DEFAULT without a rewrite; for a partitioned
#: table: in one of its partitions).
ColumnSig = tuple[int, str, bool]


@dataclass(frozen=True)
class Signature:
    relfilenode: int  # 0 for a partitioned table (no storage of its own)
    columns: tuple[ColumnSig, ...]
    partitions: tuple[tuple[int, int], ...] | None  # a partitioned table's leaves: (oid, relfilenode)

    def to_json(self) -> list[Any]:
        return [self.relfilenode, [list(c) for c in self.columns],
                None if self.partitions is None else [list(p) for p in self.partitions]]

    @classmethod
    def from_json(cls, data: Any) -> "Signature":
        rel, cols, parts = data
        return cls(int(rel), tuple((int(a), str(n), bool(m)) for a, n, m in cols),
                   None if parts is None else tuple((int(o), int(f)) for o, f in parts))


_SQL = """
SELECT c.oid::int8, c.relfilenode::int8,
  (SELECT coalesce(json_agg(json_build_array(a.attnum, a.attname, a.atthasmissing OR CASE WHEN c.relkind = 'p' THEN
       -- a partitioned table has no storage: its partitions hold the missing value of ADD COLUMN ... DEFAULT
       EXISTS (SELECT 1 FROM pg_partition_tree(c.oid) t JOIN pg_attribute l ON l.attrelid = t.relid
               AND l.attname = a.attname WHERE t.isleaf AND l.atthasmissing) ELSE false END) ORDER BY a.attnum), '[]')
     FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
  CASE WHEN c.relkind = 'p' THEN
    (SELECT coalesce(json_agg(json_build_array(p.oid::int8, p.relfilenode::int8) ORDER BY p.oid), '[]')
       FROM pg_partition_tree(c.oid) t JOIN pg_class p ON p.oid = t.relid WHERE t.isleaf)
  END
FROM pg_class c WHERE c.oid = ANY(%s::oid[])
"""


def signatures(conn: Any, oids: Iterable[int]) -> dict[int, Signature]:
    """The signatures of the tables ``oids`` that exist, in one query (psycopg)."""
    ids = sorted({int(o) for o in oids})
    if not ids:
        return {}
    out = {}
    for oid, rel, cols, parts in conn.execute(_SQL, (ids,)).fetchall():
        out[int(oid)] = Signature(int(rel), tuple((int(a), str(n), bool(m)) for a, n, m in cols),
                                  None if parts is None else tuple((int(o), int(f)) for o, f in parts))
    return out


def change(old: Signature, new: Signature, empty: Any = None) -> str | None:
    """Why the table must be snapshotted again (None: the change stream carries what changed).

    ``empty(oid) -> bool`` says whether a new partition holds no rows (one attached with rows
    brought them without any WAL row change; an empty one, created or attached, did not).
    """
    if new.relfilenode != old.relfilenode:
        return "its rows were rewritten without row changes (ALTER COLUMN ... TYPE, VACUUM FULL, CLUSTER or TRUNCATE)"
    names = {a: n for a, n, _ in old.columns}
    numbers = {n: a for a, n, _ in old.columns}
    for a, n, missing in new.columns:
        if a in names and names[a] != n:
            return f"column {names[a]!r} was renamed to {n!r}"
        if a not in names and n in numbers:
            return f"column {n!r} was dropped and added again"
        if a not in names and missing:
            return f"column {n!r} was added with a default value the existing rows take without row changes"
    if old.partitions is not None and new.partitions is not None and new.partitions != old.partitions:
        before, after = dict(old.partitions), dict(new.partitions)
        gone = sorted(set(before) - set(after))
        if gone:
            return f"{len(gone)} partition(s) were detached or dropped"
        if any(after[o] != before[o] for o in before):
            return "a partition was truncated or rewritten"
        added = [o for o in after if o not in before]
        if empty is not None and not all(empty(o) for o in added):
            return "a partition holding rows was attached"
    return None


def fixed_schema_change(old: Signature, new: Signature) -> str | None:
    """For a source with a fixed schema (option ``table``): :func:`change`, and any column added or dropped too
    (its stream's columns are fixed when the query starts: an added column's values would be lost, a
    dropped one's null)."""
    why = change(old, new)
    if why is None and [c[:2] for c in old.columns] != [c[:2] for c in new.columns]:
        before, after = {c[1] for c in old.columns}, {c[1] for c in new.columns}
        added, dropped = sorted(after - before), sorted(before - after)
        why = ", ".join(([f"column(s) {', '.join(map(repr, added))} added"] if added else [])
                        + ([f"column(s) {', '.join(map(repr, dropped))} dropped"] if dropped else [])) or "columns reordered"
    return why


def fixed_schema_error(component: str, table: str, why: str, slot: str) -> PostgresSourceError:
    """The error of a single-table source whose table changed in a way it cannot follow."""
    return PostgresSourceError(
        f"{component}: {table} changed while the query runs -- {why} -- and a source with the option 'table' "
        "cannot carry that to its target as row changes (its columns are fixed when the query starts); the epochs "
        "before are committed, no later one starts. Start over with a new snapshot: "
        f"SELECT pg_drop_replication_slot('{slot}') and restart with onSlotLost=resnapshot (a keyed flinkish.postgres "
        "sink then also deletes the keys the table no longer holds), or use a new uid; or follow it with the option "
        "'tables', which snapshots such a table again by itself"
    )
