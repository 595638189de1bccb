"""The multi-table stream's rows as a dialect builds them (no server): one Arrow schema, the Spark schema beside it."""

from __future__ import annotations

import pyarrow as pa

from flinkish_spark.connectors.cdc.stream import (
    RESNAPSHOT_BEGIN, STREAM_ARROW, STREAM_DDL, StreamRows, marker, schema_row, snapshot_rows, stream_schema,
)
from flinkish_spark.connectors.postgres.rows import TableSchema, make_column


def test_schema_snapshot_marker_and_change_rows_share_one_schema() -> None:
    schema = TableSchema("shop.orders", (make_column("id", "integer", "int4", -1, None),), ("id",))
    rows = pa.Table.from_batches([
        pa.RecordBatch.from_pylist([schema_row(schema, None, None, None)], schema=STREAM_ARROW),
        marker(schema, RESNAPSHOT_BEGIN),
        snapshot_rows(schema, pa.array(['{"id":1}', '{"id":2}'])),
    ])
    collected = StreamRows()
    collected.add("shop.orders", "c", 42, 0, 1_700_000_000_000_000, schema.schema_id, '{"id":3}')
    changes = collected.flush()
    assert len(collected) == 0 and changes.schema == STREAM_ARROW
    out = pa.concat_tables([rows, pa.Table.from_batches([changes])]).to_pylist()
    assert [(r["_op"], r["_lsn"], r["row"]) for r in out] == [
        ("s", None, schema.to_json()), ("B", None, None), ("r", None, '{"id":1}'), ("r", None, '{"id":2}'),
        ("c", 42, '{"id":3}')]
    assert {r["_schema_id"] for r in out} == {schema.schema_id} and {r["_table"] for r in out} == {"shop.orders"}
    assert [f.name for f in stream_schema().fields] == STREAM_ARROW.names == [
        c.split("`")[1] for c in STREAM_DDL.split(", ")]
