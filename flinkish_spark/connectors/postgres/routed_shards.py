"""Merged shards in routed ``flinkish.postgres`` targets: several source tables, one target (:mod:`~flinkish_spark.connectors.lakehouse.routes`).

* **Prepare**: a shard's staged rows carry ``_source_table`` (``schema.table``) as one more column, and its parts
  the shard's schema as its target takes it (:func:`~flinkish_spark.connectors.lakehouse.routes.shard_schema`:
  ``_source_table`` text, keyed by the key and ``_source_table`` unless keys are unique across shards)
  (:func:`tag_shards`). From there each shard is applied as a table of its own -- evolved, upserted, in its mode.
* **Commit**: in the epoch's one transaction, each shard of a target in turn; what takes rows away without naming
  them -- a truncate, a re-snapshot's end -- is scoped to the shard's rows (:func:`scope`), its re-snapshot keys are
  remembered apart (:func:`seen_name`), and the target gets one ``flinkish_commits`` row per epoch whatever the
  number of its shards. Exactly once across the shards is the transaction's: all of them or none.
* **Types**: a shard's column narrower than its target's (another shard widened it) fits and is written as is --
  the merged target holds the widest type of its shards; a column of another kind of type is the routed sink's
  stop naming the fix. Shards with different key columns: :func:`check_keys`, before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Sequence

import pyarrow as pa

from flinkish_spark.connectors.lakehouse.routes import SOURCE_TABLE, Routes, check_shard_keys, shard_schema
from flinkish_spark.connectors.lakehouse.routing import Route, SchemaStep
from flinkish_spark.connectors.postgres.routed_apply import literal
from flinkish_spark.connectors.postgres.rows import TableSchema


def merged(route: Route, table: str) -> bool:
    return isinstance(route, Routes) and route.merged(table) is not None


def _shard_json(route: Routes, text: str) -> str:
    if not text:
        return text
    schema = TableSchema.from_json(text)
    rule = route.merged(schema.table)
    return text if rule is None else shard_schema(schema, rule).to_json()


def tag_shards(route: Route, staged: pa.Table, parts: tuple[Any, ...]) -> tuple[pa.Table, tuple[Any, ...]]:
    """The staged rows of merged shards with ``_source_table`` in their row, their parts with the shard schemas."""
    if not isinstance(route, Routes) or not route.merging:
        return staged, parts
    shards = {p.table for p in parts if route.merged(p.table) is not None}
    if not shards:
        return staged, parts
    tables, rows = staged.column("_table").to_pylist(), staged.column("_row").to_pylist()
    tagged = [row if row is None or table not in shards else
              row[:-1] + ("," if row != "{}" else "") + f"{json.dumps(SOURCE_TABLE)}:{json.dumps(table)}}}"
              for table, row in zip(tables, rows)]
    staged = staged.set_column(staged.schema.get_field_index("_row"), "_row", pa.array(tagged, pa.string()))
    parts = tuple(p if p.table not in shards else
                  replace(p, schema=_shard_json(route, p.schema), earlier=tuple(_shard_json(route, e) for e in p.earlier))
                  for p in parts)
    return staged, parts


def check_keys(route: Route, tables: Sequence[Any], read_key: Any) -> None:
    """Refuse shards of one target whose key columns differ: among the epoch's shards, and against the key the target
    has (``read_key(target)``: its key, or None when there is no target yet)."""
    by_target: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for t in tables:
        schemas = [TableSchema.from_json(p.schema) for p in t.parts if p.schema]
        if schemas and merged(route, t.table):
            by_target.setdefault(route.target(t.table), []).append((t.table, schemas[-1].key))
    for target, keys in by_target.items():
        have = read_key(target)
        check_shard_keys(target, keys + ([(f"the target {target}", tuple(have))] if have else []))


def steps(route: Route, table: str, steps: list[SchemaStep]) -> list[SchemaStep]:
    """A shard's schema steps as its merged target's evolution takes them: as snapshot schemas (a column narrower than
    the target's fits; the target's type is the widest of its shards), the others as they are."""
    if not merged(route, table):
        return steps
    return [s._replace(announced=False) for s in steps]


def scope(route: Route, table: str) -> str:
    """The condition (`` AND ...``, on the target's alias ``t``) that keeps a statement to the shard's rows."""
    return f" AND t.{SOURCE_TABLE} = {literal(table)}" if merged(route, table) else ""


def seen_name(route: Route, target: str, table: str) -> str:
    """What the re-snapshot keys of ``table`` are remembered by: per shard in a merged target."""
    return f"{target}\0{table}" if merged(route, table) else target

