"""The multi-table stream every CDC source of flinkish emits: one schema for every table, whatever the database.

Every row has the columns of :data:`STREAM_DDL` -- ``_table`` (``schema.table``, for MySQL
``database.table``), ``_op`` (``r`` snapshot read, ``c``/``u``/``d`` changes, ``t`` truncate,
``s`` schema, ``B``/``E`` a re-snapshot's brackets), ``_lsn`` (the dialect's log position of the
change's transaction as a non-decreasing integer: PostgreSQL's commit LSN; null for snapshot
rows), ``_seq`` (ordinal in the transaction), ``_commit_ts``, ``_schema_id`` and ``row`` (JSON).
The full contract a consumer builds on -- log order, self-describing epochs, schema changes in
order -- is :mod:`flinkish_spark.connectors.postgres.rows` (which re-exports these names: they
are part of that public module). A dialect builds its rows with the helpers here, so that every
routing sink and ``flinkish mirror`` read any database's stream unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


class DescribedSchema(Protocol):
    """What a schema row needs of a table schema (:class:`..postgres.rows.TableSchema`)."""

    @property
    def table(self) -> str: ...
    @property
    def schema_id(self) -> str: ...
    def to_json(self) -> str: ...


#: ``_op`` of the rows that bracket a table's re-snapshot after a lost slot (:mod:`..postgres.rows`), in the
#: multi-table stream and in the single-table one (where every other column is null). The
#: ``flinkish.postgres`` sink applies them for one table (:mod:`flinkish_spark.connectors.postgres.resnapshot`).
RESNAPSHOT_BEGIN, RESNAPSHOT_END = "B", "E"

STREAM_DDL = (
    "`_table` string, `_op` string, `_lsn` bigint, `_seq` int, `_commit_ts` timestamp, `_schema_id` string, "
    "`row` string"
)


def stream_schema() -> "StructType":
    """:data:`STREAM_DDL` as a Spark ``StructType`` (built without a Spark session)."""
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("_table", T.StringType()), T.StructField("_op", T.StringType()),
        T.StructField("_lsn", T.LongType()), T.StructField("_seq", T.IntegerType()),
        T.StructField("_commit_ts", T.TimestampType()), T.StructField("_schema_id", T.StringType()),
        T.StructField("row", T.StringType()),
    ])

#: :data:`STREAM_DDL` in Arrow: the batches a dialect's reader yields.
STREAM_ARROW = pa.schema([
    pa.field("_table", pa.string()), pa.field("_op", pa.string()), pa.field("_lsn", pa.int64()),
    pa.field("_seq", pa.int32()), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_schema_id", pa.string()), pa.field("row", pa.string()),
])


class StreamRows:
    """Stream rows collected column by column, flushed as Arrow batches."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in STREAM_ARROW}

    def add(self, table: str, op: str, lsn: int, seq: int, ts_us: int, schema_id: str, row: str | None) -> None:
        c = self.cols
        c["_table"].append(table)
        c["_op"].append(op)
        c["_lsn"].append(lsn)
        c["_seq"].append(seq)
        c["_commit_ts"].append(ts_us)
        c["_schema_id"].append(schema_id)
        c["row"].append(row)

    def __len__(self) -> int:
        return len(self.cols["_op"])

    def flush(self) -> pa.RecordBatch:
        # Timestamps from int64 microseconds (pa.array of ints as a zoned timestamp would import pandas).
        arrays = [pa.array(self.cols[f.name], pa.int64()).cast(f.type) if pa.types.is_timestamp(f.type)
                  else pa.array(self.cols[f.name], f.type) for f in STREAM_ARROW]
        batch = pa.RecordBatch.from_arrays(arrays, schema=STREAM_ARROW)
        self.cols = {f.name: [] for f in STREAM_ARROW}
        return batch


def schema_row(schema: DescribedSchema, lsn: int | None, seq: int | None, ts_us: int | None) -> dict[str, Any]:
    return {"_table": schema.table, "_op": "s", "_lsn": lsn, "_seq": seq, "_commit_ts": ts_us,
            "_schema_id": schema.schema_id, "row": schema.to_json()}


def marker(schema: DescribedSchema, op: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"_table": schema.table, "_op": op, "_schema_id": schema.schema_id}],
                                      schema=STREAM_ARROW)


def snapshot_rows(schema: DescribedSchema, rows: pa.Array) -> pa.RecordBatch:
    """A chunk's rows (``rows``: the JSON text of each, as the dialect read them) as ``r`` stream rows."""
    n = len(rows)
    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(schema.table), n), pa.repeat(pa.scalar("r"), n), pa.nulls(n, pa.int64()),
         pa.nulls(n, pa.int32()), pa.nulls(n, pa.timestamp("us", tz="UTC")), pa.repeat(pa.scalar(schema.schema_id), n),
         rows], schema=STREAM_ARROW)
