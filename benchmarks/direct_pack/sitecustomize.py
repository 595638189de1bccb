"""Benchmark-only prototype (``benchmarks/mysql_source.py --direct-pack``): a ``flinkish.mysql`` snapshot chunk read
with ``rowFormat=arrow`` packed straight from the typed Arrow of ``snapshot.read_chunk`` -- no JSON text per row and
no JSON parse back, which is what the source does today (``chunk_rows.read_chunk_rows`` -> ``Packer``).

Loaded by every Python process whose ``PYTHONPATH`` holds this folder; active only while the file that
``FLINKISH_BENCH_DIRECT_PACK`` names exists (so that one Spark session runs today's path and the prototype side
by side). Production code is not changed: ``TablesReaderCore.read`` is wrapped here, at interpreter start. What it
leaves out (a prototype): the re-snapshot's B/E brackets and the retry of a chunk whose table definition changed.
The packs are what :class:`flinkish_spark.connectors.postgres.rows.packed.Packer` makes of the same rows: an ``s``
row with the chunk's schema, then packs of up to ``PACK_ROWS`` rows typed as ``TableSchema.arrow_schema()``.
"""

from __future__ import annotations

import os

_FLAG = os.environ.get("FLINKISH_BENCH_DIRECT_PACK")


def _install(flag: str) -> None:
    import json

    import pyarrow as pa

    from flinkish_spark.connectors.cdc.tables_reader import TablesReaderCore
    from flinkish_spark.connectors.mysql.chunk_rows import chunk_table
    from flinkish_spark.connectors.mysql.snapshot import begin_snapshot, read_chunk
    from flinkish_spark.connectors.mysql.stream_rows import schema_of_info
    from flinkish_spark.connectors.postgres.rows.decode import ROW_META
    from flinkish_spark.connectors.postgres.rows.packed import PACK_ROWS, PACKED_ARROW

    original = TablesReaderCore.read

    def packs(self, chunk, conn):
        begin_snapshot(conn)
        try:
            found = chunk_table(chunk, conn)
            if found is None:
                return
            info, part = found
            schema = schema_of_info(info)
            target = schema.arrow_schema()
            sid = schema.schema_id
            yield pa.RecordBatch.from_pylist([{
                "_table": schema.table, "_op": "s", "_schema_id": sid, "_lsn": None, "_seq": None, "_last_lsn": None,
                "_count": 0, "_changes": 0, "_commit_ts": None, "batch": schema.to_json().encode()}], schema=PACKED_ARROW)
            for b in read_chunk(conn, info, part):
                rows = []
                for at in range(0, b.num_rows, PACK_ROWS):
                    p = b.slice(at, PACK_ROWS)
                    n = p.num_rows
                    cols = [p.column(i).cast(target.field(i).type) for i in range(len(target))]
                    meta = [pa.array(["r"] * n, pa.string()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.int32()),
                            pa.nulls(n, pa.timestamp("us", tz="UTC")), pa.nulls(n, pa.list_(pa.string()))]
                    body = pa.Table.from_arrays(cols + meta, names=list(target.names) + list(ROW_META))
                    sink = pa.BufferOutputStream()
                    with pa.ipc.new_stream(sink, body.schema) as w:
                        w.write_table(body)
                    rows.append({"_table": schema.table, "_op": "p", "_schema_id": sid, "_lsn": None, "_seq": None,
                                 "_last_lsn": None, "_count": n, "_changes": 0, "_commit_ts": None,
                                 "batch": sink.getvalue().to_pybytes()})
                if rows:
                    yield pa.RecordBatch.from_pylist(rows, schema=PACKED_ARROW)
        finally:
            conn.rollback()

    def read(self, split, start, end):
        if (self.pack is None or start >= end or not split.split_id.startswith("snapshot-")
                or type(self.dialect).__name__ != "MysqlDialect" or not os.path.exists(flag)):
            return original(self, split, start, end)
        chunk = json.loads(split.payload or "{}")
        if self._conn is None:
            self._conn = self.dialect.chunk_connection()
        return packs(self, chunk, self._conn)

    TablesReaderCore.read = read


if _FLAG:
    _install(_FLAG)
