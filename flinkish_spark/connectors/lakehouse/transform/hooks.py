"""Where a routing sink's task applies the transforms: to its typed rows per table (Delta, Iceberg) or to the JSON
stream rows before they are staged (PostgreSQL).

The guarantee: what a target, its evolution and its commit see of a table with a rule is only the transformed schema
(:meth:`.rules.Transform.schema`: kept and computed columns, the key) and the transformed rows -- an excluded column
is gone before anything is written or staged, in every schema a task announces (the newest and the older ones its
changes passed through). A table no rule matches is passed on untouched (no decode, no copy).
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.routing import TableInput
from flinkish_spark.connectors.lakehouse.transform.rules import Transforms
from flinkish_spark.connectors.postgres.rows import TableSchema, split_tables
from flinkish_spark.connectors.lakehouse.transform.json_rows import json_rows


def transform_input(transforms: Transforms, table: str, schema: TableSchema,
                    data: TableInput) -> tuple[TableSchema, TableInput]:
    """One table's task input (:func:`~flinkish_spark.connectors.lakehouse.routing.task_tables`) as its target gets it."""
    rule = transforms.of(table)
    if rule is None:
        return schema, data
    target = rule.schema(schema)  # first: a column the rule names that the table lacks is one clear error
    changes = rule.rows(schema, data.changes)
    whole = None if data.whole is None else rule.rows(schema, data.whole)
    lsn = pc.max(changes.column("_lsn")).as_py() if changes.num_rows else None
    earlier = tuple(rule.schema(TableSchema.from_json(e), target).to_json() for e in data.earlier)
    return target, replace(data, changes=changes, whole=whole, earlier=earlier,
                                        lsn=max(data.lsn, -1 if lsn is None else int(lsn)))


def transform_stream(transforms: Transforms, stream: pa.Table) -> pa.Table:
    """The multi-table stream's rows of one task (JSON shape) with each ruled table's rows transformed: its schema rows
    (at their positions) and its data rows written again in the transformed schema (its newest in the task)."""
    if not transforms or not stream.num_rows:
        return stream
    tables = pc.unique(stream.column("_table")).to_pylist()
    ruled = [t for t in tables if t is not None and transforms.of(t) is not None]
    if not ruled:
        return stream
    mine = pc.is_in(stream.column("_table"), value_set=pa.array(ruled))
    out = [stream.filter(pc.invert(mine))]
    for name, typed in split_tables(stream.filter(mine)).items():
        rule = transforms.of(name)
        assert rule is not None
        newest = rule.schema(typed.schema)
        by_id = {s.schema_id: rule.schema(s, newest) for s in typed.schemas[:-1]}
        by_id[typed.schema.schema_id] = newest
        own = stream.filter(pc.equal(stream.column("_table"), name))
        schema_rows = own.filter(pc.equal(own.column("_op"), "s"))
        ids = [TableSchema.from_json(t).schema_id for t in schema_rows.column("row").to_pylist()]
        out.append(schema_rows.set_column(schema_rows.schema.get_field_index("_schema_id"), "_schema_id",
                                          pa.array([by_id[i].schema_id for i in ids], pa.string()))
                   .set_column(schema_rows.schema.get_field_index("row"), "row",
                               pa.array([by_id[i].to_json() for i in ids], pa.string())))
        rows = rule.rows(typed.schema, typed.rows)
        texts = json_rows(newest, rows)
        n = rows.num_rows
        out.append(pa.table({
            "_table": pa.repeat(pa.scalar(name), n) if n else pa.array([], pa.string()),
            "_op": rows.column("_op"), "_lsn": rows.column("_lsn").cast(pa.int64()),
            "_seq": rows.column("_seq").cast(pa.int32()),
            "_commit_ts": rows.column("_commit_ts").cast(pa.timestamp("us", tz="UTC")),
            "_schema_id": pa.repeat(pa.scalar(newest.schema_id), n) if n else pa.array([], pa.string()),
            "row": pa.array(texts, pa.string())}, schema=stream.schema))
    return pa.concat_tables(out)


def transformed(transforms: Transforms,
                tables: list[tuple[str, TableSchema, TableInput]]) -> list[tuple[str, TableSchema, TableInput]]:
    """:func:`~flinkish_spark.connectors.lakehouse.routing.task_tables`' result with every ruled table transformed."""
    if not transforms:
        return tables
    return [(name, *transform_input(transforms, name, schema, data)) for name, schema, data in tables]


#: Change metadata a table's current rows cannot tell: a computed column reading it is not compared.
_PER_CHANGE = ("_op", "_commit_ts", "_lsn")


def as_target(transforms: Transforms, table: str, schema: TableSchema, rows: pa.Table) -> tuple[TableSchema, pa.Table]:
    """A source table's current rows (typed, ``schema``'s columns) as its target must hold them now: the rule applied
    as to a snapshot -- the matching rows, the kept and computed columns -- without the computed columns that read the
    change's own metadata (``_op``, ``_commit_ts``, ``_lsn``: known per change, not from the table). What ``flinkish
    mirror compare`` and the tests compare a transformed target with."""
    rule = transforms.of(table)
    if rule is None:
        return schema, rows
    target = rule.schema(schema)
    snapshot = rows.append_column("_op", pa.repeat(pa.scalar("r"), rows.num_rows) if rows.num_rows
                                  else pa.array([], pa.string()))
    out = rule.rows(schema, snapshot).drop_columns(["_op"])
    unknown = {n for n, e in rule.computed if set(e.metadata) & set(_PER_CHANGE)}
    if unknown:
        target = TableSchema(target.table, tuple(c for c in target.columns if c.name not in unknown), target.key)
        out = out.drop_columns(sorted(unknown))
    return target, out
