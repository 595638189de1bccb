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
* the catalog signature (DDL detection) sees only the kept columns: a DDL on an excluded column re-snapshots nothing.

Refused with one clear error (:class:`~flinkish_spark.errors.ConfigError` at start, or when such a table joins):
PostgreSQL before 15 (no column lists), a publication the user gave (its column lists are the user's), a rule that
leaves out a key column, and a table with ``REPLICA IDENTITY FULL`` (PostgreSQL then refuses the table's own updates
and deletes unless the list holds every column).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flinkish_spark.connectors.lakehouse.transform.evaluate import resolve
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


def check_server(conn: Any, columns: SourceColumns, publication_given: bool, component: str) -> None:
    """Refuse a server or publication that cannot keep the columns out (see the module docstring)."""
    if not columns:
        return
    if publication_given:
        raise ConfigError(f"{component}: option {TRANSFORM_OPTION!r} leaves columns out through the column lists of "
                          "the source's own publication; with the option 'publication' the publication is yours. "
                          "Leave 'publication' out, or leave the columns out in the sink's 'transforms' only")
    version = int(conn.execute("SHOW server_version_num").fetchone()[0])
    if version < 150000:
        raise ConfigError(f"{component}: option {TRANSFORM_OPTION!r} needs PostgreSQL 15 or later (publication column "
                          f"lists) to keep columns out of the change stream; this server is {version // 10000}. "
                          "Leave the columns out in the sink's 'transforms' only (they are then read, never written)")


def check_identity(conn: Any, tables: Sequence[tuple[int, str]], columns: SourceColumns, component: str) -> None:
    """Refuse a table with REPLICA IDENTITY FULL whose columns a rule leaves out (``tables``: oid, schema.table)."""
    ruled = [(oid, name) for oid, name in tables if (r := columns.transforms.of(name)) is not None
             and (r.columns is not None or r.exclude)]
    if not ruled:
        return
    full = {int(r[0]) for r in conn.execute("SELECT oid::int8 FROM pg_class WHERE relreplident = 'f' AND oid = "
                                            "ANY(%s::oid[])", ([o for o, _ in ruled],)).fetchall()}
    bad = [name for oid, name in ruled if oid in full]
    if bad:
        raise ConfigError(f"{component}: option {TRANSFORM_OPTION!r} leaves columns of {', '.join(bad)} out, which "
                          "has REPLICA IDENTITY FULL: PostgreSQL refuses its updates and deletes while a publication's "
                          "column list lacks a column. Give it a key identity (ALTER TABLE ... REPLICA IDENTITY "
                          "DEFAULT, with a primary key), or leave its columns out in the sink's 'transforms' only")
