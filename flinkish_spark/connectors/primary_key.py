"""The primary key a source knows, carried to the sinks in the stream's schema.

A change stream is applied by key (upsert, delete, history). The source that reads a
table knows the table's primary key (``flinkish.postgres`` reads it from ``pg_index``);
a keyed sink needs it. The channel between them is Spark's own: the column metadata of
the stream's schema. Each primary-key column's ``StructField.metadata`` holds
``{"flinkish.primaryKey": <position in the key, from 1>}``.

Verified on PySpark 4.3: metadata set in a Python data source's ``schema()`` reaches a
Python stream writer's ``streamWriter(schema)`` and ``foreachBatch``'s ``df.schema``,
also through ``select`` of the column. A column that a query computes (``id + 0 AS
id``, a cast) carries no metadata: then the sink finds no key and asks for the option
``key``. That is the honest outcome: a derived column is not the source's key.
"""

from __future__ import annotations

from typing import Any, Sequence

from pyspark.sql.types import StructType

PRIMARY_KEY_METADATA = "flinkish.primaryKey"


def with_primary_key(fields: Sequence[dict[str, Any]], key: Sequence[str]) -> StructType:
    """A StructType from JSON field dicts (``{"name", "type", "nullable"}``) with ``key`` marked.

    Built from Spark's JSON form rather than DDL: DDL parsing needs a JVM, which a data
    source's Python worker does not have.
    """
    position = {name: i + 1 for i, name in enumerate(key)}
    out = []
    for f in fields:
        meta = dict(f.get("metadata") or {})
        if f["name"] in position:
            meta[PRIMARY_KEY_METADATA] = position[f["name"]]
        out.append({**f, "metadata": meta})
    return StructType.fromJson({"type": "struct", "fields": out})


def key_marks(schema: StructType) -> list[tuple[int, str]]:
    """(position in the key, column) of every column the schema marks, in key order."""
    marked = []
    for f in schema.fields:
        pos = (f.metadata or {}).get(PRIMARY_KEY_METADATA)
        if isinstance(pos, int) and not isinstance(pos, bool):
            marked.append((pos, f.name))
    return sorted(marked)


def carried_key(schema: StructType) -> tuple[str, ...]:
    """The primary key the stream's schema carries, in key order (empty: none).

    Only a whole key counts: when the query dropped one of its columns (the marks are not
    the positions 1..n), the rest is not a key -- rows the dropped column tells apart would
    replace each other -- and this returns nothing (:func:`partial_key` says what is left).
    """
    marked = key_marks(schema)
    if [p for p, _ in marked] != list(range(1, len(marked) + 1)):
        return ()
    return tuple(name for _, name in marked)


def partial_key(schema: StructType) -> list[tuple[int, str]]:
    """The marked columns of a key the query kept only part of (empty: a whole key, or none)."""
    marked = key_marks(schema)
    return [] if [p for p, _ in marked] == list(range(1, len(marked) + 1)) else marked
