"""Benchmark-only prototypes (``benchmarks/mysql_source.py --direct-pack``), ``flinkish.mysql`` with ``rowFormat=arrow``:

* a snapshot chunk packed straight from the typed Arrow of ``snapshot.read_chunk`` -- no JSON text per row and
  no JSON parse back, which is what the source does today (``chunk_rows.read_chunk_rows`` -> ``Packer``);
* a change range packed straight from the decoded values (``dialect.change_batches`` replaced by
  :func:`packed_change_batches`: each run of one table's changes in one schema into Arrow columns of the schema's
  types) -- instead of a JSON text per change (``change_stream.change_batches``) parsed back by the ``Packer``.
  Inserts, updates (a key move: ``d`` then ``u``) and deletes; a TRUNCATE is refused (other statements carry no rows,
  as in ``change_batches``).

Also, while the file that ``FLINKISH_BENCH_JSON_PACK`` names exists, the way before
:mod:`flinkish_spark.connectors.mysql.packed_chunks` and :mod:`flinkish_spark.connectors.mysql.packed_changes`
(``mysql_source.py --json-pack``): a chunk's rows and a change range's rows as JSON text per row, packed by the
reader's ``Packer`` -- so that one run measures the source's direct packs beside it.

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

    from flinkish_spark.connectors.mysql import dialect as mysql_dialect
    from flinkish_spark.connectors.mysql.changes import position_key
    from flinkish_spark.connectors.mysql.stream_rows import map_key, schema_of_map

    today = mysql_dialect.change_batches

    def packed_change_batches(txns, follows, planned_key, catalog_schema, text_types=None, packed=False):
        if not os.path.exists(flag):
            yield from today(txns, follows, planned_key, catalog_schema, text_types, packed=packed)
            return
        maps = {}
        emitted = {}
        run = {"schema": None, "values": [], "ops": [], "lsn": [], "seq": [], "ts": []}

        def flush():
            schema, n = run["schema"], len(run["ops"])
            if schema is None or not n:
                return None
            target = schema.arrow_schema()
            cols = [pa.array(list(col), f.type) for col, f in zip(zip(*run["values"]), target)]
            ts = pa.array(run["ts"], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
            meta = [pa.array(run["ops"], pa.string()), pa.array(run["lsn"], pa.int64()),
                    pa.array(run["seq"], pa.int32()), ts, pa.nulls(n, pa.list_(pa.string()))]
            body = pa.Table.from_arrays(cols + meta, names=list(target.names) + list(ROW_META))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, body.schema) as w:
                w.write_table(body)
            row = {"_table": schema.table, "_op": "p", "_schema_id": schema.schema_id, "_lsn": run["lsn"][0],
                   "_seq": run["seq"][0], "_last_lsn": run["lsn"][-1], "_count": n, "_changes": n,
                   "_commit_ts": max(run["ts"]), "batch": sink.getvalue().to_pybytes()}
            for k in ("values", "ops", "lsn", "seq", "ts"):
                run[k] = []
            return row

        out = []
        for txn in txns:
            if any(sc.kind == "truncate" for st in txn.statements for sc in st.changes):
                raise NotImplementedError("the direct-pack prototype takes no statements (TRUNCATE)")
            lsn, ts, seq = position_key(txn.begin), txn.commit_ts_us, 0
            for item in txn.changes:
                tm = item.table
                entry = maps.get(id(tm))
                if entry is None or entry[0] is not tm:
                    name = f"{tm.database}.{tm.table}"
                    key = map_key(tm) or planned_key(name) or ()
                    text = None if text_types is None else text_types(tm)
                    schema = schema_of_map(tm, key, text) if follows(name) and key else None
                    entry = (tm, schema, None if schema is None else [schema.names.index(k) for k in schema.key])
                    maps[id(tm)] = entry
                _, schema, key_at = entry
                if schema is None:
                    continue
                if run["schema"] is not schema and (run["schema"] is None or run["schema"].schema_id != schema.schema_id):
                    row = flush()
                    if row:
                        out.append(row)
                    run["schema"] = schema
                if emitted.get(schema.table) != schema.schema_id:
                    emitted[schema.table] = schema.schema_id
                    out.append({"_table": schema.table, "_op": "s", "_schema_id": schema.schema_id, "_lsn": lsn,
                                "_seq": seq, "_last_lsn": lsn, "_count": 0, "_changes": 0, "_commit_ts": ts,
                                "batch": schema.to_json().encode()})
                    seq += 1

                def add(op, values):
                    run["values"].append(values)
                    run["ops"].append(op)
                    run["lsn"].append(lsn)
                    run["seq"].append(seq)
                    run["ts"].append(ts)

                if item.op == "i":
                    add("c", item.after)
                elif item.op == "d":
                    add("d", item.before)
                else:
                    if [item.before[i] for i in key_at] != [item.after[i] for i in key_at]:
                        add("d", item.before)
                        seq += 1
                    add("u", item.after)
                seq += 1
                if len(run["ops"]) >= PACK_ROWS:
                    out.append(flush())
            if out:
                yield pa.RecordBatch.from_pylist(out, schema=PACKED_ARROW)
                out = []
        row = flush()
        if row:
            out.append(row)
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=PACKED_ARROW)

    mysql_dialect.change_batches = packed_change_batches


def _install_json_pack(flag: str) -> None:
    from flinkish_spark.connectors.mysql import dialect as mysql_dialect
    from flinkish_spark.connectors.mysql.chunk_rows import read_chunk_rows

    original = mysql_dialect.MysqlDialect.read_chunk

    def read_chunk(self, chunk, conn):
        if os.path.exists(flag):
            return read_chunk_rows(chunk, conn)  # JSON rows: the reader's Packer parses them back
        return original(self, chunk, conn)

    mysql_dialect.MysqlDialect.read_chunk = read_chunk

    changes = mysql_dialect.change_batches

    def change_batches(*args, packed=False, **kwargs):
        # the way before packed_changes: JSON text per change, packed by the reader's Packer
        return changes(*args, packed=packed and not os.path.exists(flag), **kwargs)

    mysql_dialect.change_batches = change_batches


def _install_row_loop(flag: str) -> None:
    """While ``flag`` exists: snapshot.read_chunk splits its row packets with the loop per value it had before
    connectors/mysql/row_packets.py (``mysql_source_parts.loop_columns``)."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from mysql_source_parts import loop_columns

    from flinkish_spark.connectors.mysql import snapshot

    blocks = snapshot.column_blocks

    def column_blocks(result, ncols, rows=8192):
        return loop_columns(result, ncols) if os.path.exists(flag) else blocks(result, ncols, rows)

    snapshot.column_blocks = column_blocks


if _FLAG:
    _install(_FLAG)
if os.environ.get("FLINKISH_BENCH_ROW_LOOP"):
    _install_row_loop(os.environ["FLINKISH_BENCH_ROW_LOOP"])
if os.environ.get("FLINKISH_BENCH_JSON_PACK"):
    _install_json_pack(os.environ["FLINKISH_BENCH_JSON_PACK"])
