"""The columns a multi-table ``flinkish.postgres`` source reads of each table: its option ``transforms``.

The option takes the routing sinks' rules (:mod:`flinkish_spark.connectors.lakehouse.transform.rules`, the same JSON,
first matching rule wins) and uses only their column part: ``columns`` / ``columns.exclude`` / a ``projection``'s
column list or ``* EXCEPT (...)``. A column a rule leaves out -- and that its ``filter`` and ``computed`` columns do
not read (the sink evaluates those on the source row) -- is never read: the guarantee is that its values never leave
PostgreSQL:

* the snapshot's ``SELECT`` names only the kept columns, and the stream's schema rows (``s``) list only them;
* the source's own publication carries a column list per table (PostgreSQL 15+), so pgoutput never sends an
  excluded column -- also one added later (a new column is in no column list until the catalog poll puts it in,
  when it is kept: that poll then snapshots the table again, since changes between its ``ADD COLUMN`` and the poll
  lacked its values);
* where no column list can keep them out -- PostgreSQL before 15, a publication the user gave (``publication``:
  its lists are the user's), a table with ``REPLICA IDENTITY FULL`` (PostgreSQL refuses its updates and deletes
  under a list lacking a column) -- the reader drops them as it decodes, before any row is made: they leave
  PostgreSQL, never the source task (a warning says so once);
* the catalog signature (DDL detection) sees only the kept columns: a DDL on an excluded column re-snapshots nothing.

A rule that leaves out a key column is refused (:class:`~flinkish_spark.errors.ConfigError`), as the sink refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flinkish_spark.connectors.lakehouse.transform.names import resolve
from flinkish_spark.connectors.lakehouse.transform.rules import TRANSFORM_OPTION, Transforms, parse_transforms
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.errors import ConfigError


@dataclass(frozen=True)
class SourceColumns:
    """The column part of the ``transforms`` rules, as the source applies it."""

    transforms: Transforms = Transforms()

    def __bool__(self) -> bool:
        return any(r.columns is not None or r.exclude for r in self.transforms.rules)

    def kept(self, table: str, names: Sequence[str], key: Sequence[str], what: str) -> list[str] | None:
        """The columns of ``table`` (columns ``names``, key ``key``) the source reads, in table order; None: every
        one. A rule that leaves out a key column is refused (the sink refuses it too)."""
        rule = self.transforms.of(table)
        if rule is None or (rule.columns is None and not rule.exclude):
            return None
        reads = {n for c in rule._reads() if (n := resolve(c, list(names))) is not None}
        kept = set(rule._kept(list(names))) | reads
        dropped_keys = [k for k in key if k not in kept]
        if dropped_keys:
            raise ConfigError(f"{what}: source table {table}: {rule.where} leaves out its key column(s) "
                              f"{', '.join(dropped_keys)}, which every change and every target row needs. Change the "
                              f"rule (the option {TRANSFORM_OPTION!r})")
        out = [n for n in names if n in kept]
        return None if len(out) == len(names) else out

    def schema(self, schema: TableSchema, what: str) -> TableSchema:
        """``schema`` with only the kept columns."""
        kept = self.kept(schema.table, schema.names, schema.key, what)
        if kept is None:
            return schema
        chosen = set(kept)
        return TableSchema(schema.table, tuple(c for c in schema.columns if c.name in chosen), schema.key)


def source_columns(get: Callable[[str], str | None], component: str) -> SourceColumns:
    return SourceColumns(parse_transforms(get, f"{component}: option {TRANSFORM_OPTION!r}"))


def lists_unsupported(conn: Any) -> bool:
    """Whether the server has no publication column lists (before PostgreSQL 15)."""
    return int(conn.execute("SHOW server_version_num").fetchone()[0]) < 150000


def identity_full(conn: Any, oids: Sequence[int]) -> set[int]:
    """The tables of ``oids`` with REPLICA IDENTITY FULL."""
    if not oids:
        return set()
    rows = conn.execute("SELECT oid::int8 FROM pg_class WHERE relreplident = 'f' AND oid = ANY(%s::oid[])",
                        (list(oids),)).fetchall()
    return {int(r[0]) for r in rows}
