"""How a transform names things: a column of the row (Spark's case-insensitive resolution) and the change metadata an
expression may use.

Kept apart from :mod:`.parse` and :mod:`.evaluate` because those import ``sqlglot`` (and what it pulls in): every
routing sink's module and the PostgreSQL source's column choice need these names, but only a sink with a
``transforms`` option needs the parser. A Python worker Spark starts for a query without transforms (the data source
lookup, the planning, the commit runner) then never pays for importing it (docs/testing.md, "Where a Python worker's
start goes").
"""

from __future__ import annotations

#: The change metadata an expression may name besides the row's columns: the change's ``_op`` (``r`` snapshot read,
#: ``c`` insert, ``u`` update), its commit time ``_commit_ts`` (null for snapshot rows) and log position ``_lsn``, and
#: the source table -- ``_source_table`` (``schema.table``) or Flink CDC's ``__schema_name__`` / ``__table_name__``.
METADATA = ("_op", "_commit_ts", "_lsn", "_source_table", "__schema_name__", "__table_name__")


def resolve(name: str, names: list[str] | tuple[str, ...]) -> str | None:
    """The column ``name`` names among ``names``: exactly, else case-insensitively (Spark's default)."""
    if name in names:
        return name
    folded = [n for n in names if n.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None
