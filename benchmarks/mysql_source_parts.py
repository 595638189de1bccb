"""Where a ``flinkish.mysql`` snapshot row's time goes outside Spark (issue 29; the arithmetic of
docs/benchmarks.md "MySQL source through Spark"): the stages of a snapshot task, in one process, on the table of
``benchmarks/mysql_source.py``.

Per round, over every chunk (``--split-size`` rows) of ``bench.t`` (``--rows``), each in its own snapshot as the
source's tasks read them:

* ``server + socket``: the chunk's ``SELECT`` (unbuffered), its row packets read off the socket and dropped -- the
  floor of any reader of the text protocol;
* ``+ the row loop``: each value cut out of its row packet by Python (``snapshot.read_chunk`` before
  ``connectors/mysql/row_packets.py``), a binary array per column;
* ``+ row_packets``: the same columns cut a block of rows at a time, column by column with numpy (today's);
* ``read_chunk_arrow``: + one Arrow cast per column (typed Arrow);
* ``read_chunk_rows(packed)``: + the packs of ``rowFormat=arrow`` (``packed_chunks``: an IPC stream per pack) --
  what a snapshot task's reader yields;
* with ``--json-stages`` also ``rowFormat=json``'s stream rows (a JSON text per row) and the Packer's way.

And with ``--changes N`` the change path instead: ``N`` single-row INSERTs in 1,000-row transactions in a log file
of their own (the backlog of ``mysql_source.py``), read from the file's start to its end by

* ``range_scan``: the transactions walked by their events' headers (a range's planning without a limit,
  ``MysqlDialect.change_target``);
* ``read_range, RowCounter``: the same transactions with their rows counted, not decoded (the planning with
  ``maxRowsPerTrigger``; every planning before ``range_scan``);
* ``read_range``: whole transactions of decoded ``RowChange``s (the decoder, positions, GTID state);
* ``+ change_batches`` (``rowFormat=json``): the stream rows, one JSON text per change;
* ``+ Packer`` (``rowFormat=arrow`` today): those rows packed, the JSON parsed back to typed columns;
* ``+ typed columns (prototype)``: what a packed read could do instead: the decoded values of each run of a table's
  changes straight into Arrow columns of the schema's types (``pa.array`` per column), the IPC stream per pack.

    PYTHONPATH=. python benchmarks/mysql_source_parts.py [--rows 1000000] [--split-size 100000] [--repeats 3]
    PYTHONPATH=. python benchmarks/mysql_source_parts.py --changes 200000 [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import closing
from typing import Any, Callable, Iterator

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402
from mysql_source import DDL, FILL  # noqa: E402

import pymysql  # noqa: E402

from flinkish_spark.connectors.mysql.chunk_rows import (  # noqa: E402
    bound_to_json, chunk_table, read_chunk_arrow, read_chunk_rows,
)
from flinkish_spark.connectors.mysql.row_packets import column_blocks  # noqa: E402
from flinkish_spark.connectors.mysql.snapshot import BATCH_ROWS, _select_expr, begin_snapshot, chunk_condition  # noqa: E402
from flinkish_spark.connectors.mysql.connection import connect, parse_url  # noqa: E402
from flinkish_spark.connectors.mysql.snapshot import open_snapshot  # noqa: E402
from flinkish_spark.connectors.mysql.stream_rows import schema_of_info  # noqa: E402
from flinkish_spark.connectors.postgres.rows.decode import ROW_META  # noqa: E402
from flinkish_spark.connectors.postgres.rows.packed import PACK_ROWS, Packer  # noqa: E402
from flinkish_spark.embedded.mariadb import temporary_mariadb  # noqa: E402


def direct_packs(batches: Iterator[pa.RecordBatch], target: pa.Schema) -> Iterator[tuple[int, bytes]]:
    """Prototype: typed snapshot batches -> IPC streams of the packed shape's body (columns, then the row meta)."""
    for b in batches:
        for at in range(0, b.num_rows, PACK_ROWS):
            part = b.slice(at, PACK_ROWS)
            n = part.num_rows
            cols = [part.column(i).cast(target.field(i).type) for i in range(len(target))]
            meta = [pa.array(["r"] * n, pa.string()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.int32()),
                    pa.nulls(n, pa.timestamp("us", tz="UTC")), pa.nulls(n, pa.list_(pa.string()))]
            body = pa.Table.from_arrays(cols + meta, names=list(target.names) + list(ROW_META))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, body.schema) as w:
                w.write_table(body)
            yield n, sink.getvalue().to_pybytes()


def typed_packs(txns: Iterator[Any]) -> Iterator[tuple[int, bytes]]:
    """Prototype: a range's inserts (one table, one schema) -> IPC streams of the packed shape's body."""
    from flinkish_spark.connectors.mysql.stream_rows import map_key, schema_of_map

    schema, target, values, meta = None, None, [], ([], [], [], [])  # type: ignore[var-annotated]

    def flush() -> tuple[int, bytes]:
        assert target is not None
        n = len(values)
        cols = [pa.array(list(col), f.type) for col, f in zip(zip(*values), target)]
        body = pa.Table.from_arrays(cols + [pa.array(meta[0], pa.string()), pa.array(meta[1], pa.int64()),
                                            pa.array(meta[2], pa.int32()),
                                            pa.array(meta[3], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                                            pa.nulls(n, pa.list_(pa.string()))],
                                    names=list(target.names) + list(ROW_META))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, body.schema) as w:
            w.write_table(body)
        values.clear()
        for m in meta:
            m.clear()
        return n, sink.getvalue().to_pybytes()

    from flinkish_spark.connectors.mysql.changes import position_key

    for txn in txns:
        lsn = position_key(txn.begin)
        for ch in txn.changes:
            if schema is None:
                schema = schema_of_map(ch.table, map_key(ch.table))
                target = schema.arrow_schema()
            values.append(ch.after)
            meta[0].append("c")
            meta[1].append(lsn)
            meta[2].append(ch.seq)
            meta[3].append(txn.commit_ts_us)
            if len(values) >= PACK_ROWS:
                yield flush()
    if values:
        yield flush()


def drain(result: Any) -> int:
    """The rows of an unbuffered result read off the socket and dropped (the server's and the socket's share)."""
    conn = result.connection
    read, rows = conn._rfile.read, 0
    while True:
        header = read(4)
        data = read(header[0] | header[1] << 8 | header[2] << 16)
        conn._next_seq_id = (header[3] + 1) % 256
        if data[0] == 0xFE and len(data) < 9:
            result.unbuffered_active, result.connection, result.rows = False, None, None
            return rows
        rows += 1


def loop_columns(result: Any, ncols: int) -> Iterator[list[pa.Array]]:
    """The row loop of snapshot.read_chunk before connectors/mysql/row_packets.py (its fast path: no packet of
    16 MiB, no error), each value cut out by Python, then one binary array per column: the comparison."""
    conn = result.connection
    read = conn._rfile.read
    columns: list[list[bytes | None]] = [[] for _ in range(ncols)]
    count = 0
    while True:
        header = read(4)
        conn._next_seq_id = (header[3] + 1) % 256
        data = read(header[0] | header[1] << 8 | header[2] << 16)
        if data[0] == 0xFE and len(data) < 9:
            result.unbuffered_active, result.connection, result.rows = False, None, None
            break
        pos = 0
        for col in columns:
            n = data[pos]
            if n < 251:
                col.append(data[pos + 1:pos + 1 + n])
                pos += 1 + n
                continue
            if n == 251:
                col.append(None)
                pos += 1
                continue
            width = 2 if n == 252 else 3 if n == 253 else 8
            n = int.from_bytes(data[pos + 1:pos + 1 + width], "little")
            pos += 1 + width
            col.append(data[pos:pos + n])
            pos += n
        count += 1
        if count == BATCH_ROWS:
            yield [pa.array(c, pa.binary()) for c in columns]
            columns, count = [[] for _ in range(ncols)], 0
    if count:
        yield [pa.array(c, pa.binary()) for c in columns]


def changes_main(args: argparse.Namespace) -> None:
    from mysql_source import write_backlog

    from flinkish_spark.connectors.mysql.change_stream import change_batches
    from flinkish_spark.connectors.mysql.changes import current_end, read_range
    from flinkish_spark.connectors.mysql.position import FilePosition
    from flinkish_spark.connectors.mysql.range_scan import scan_range
    from flinkish_spark.connectors.mysql.row_count import RowCounter
    from flinkish_spark.connectors.mysql.row_values import RowDecoder
    from flinkish_spark.connectors.mysql.server import collation_charsets

    runs: list[dict[str, Any]] = []
    with temporary_mariadb("flinkish-bench-mariadb-") as server:
        server.sql("CREATE DATABASE bench; " + DDL + "; FLUSH BINARY LOGS")
        log_file = server.sql("SHOW MASTER STATUS").split("\t")[0]
        write_backlog(server, 1, args.changes, 1000)
        info = parse_url(server.url_for("bench"))
        with closing(connect(info)) as conn:
            end = current_end(conn, True).file
            charsets = collation_charsets(conn)

        def txns() -> Iterator[Any]:
            return read_range(info, FilePosition(log_file, 4), end, RowDecoder(charsets, mariadb=True), 4711)

        def batches() -> Iterator[pa.RecordBatch]:
            return change_batches(txns(), lambda name: True, lambda name: ("id",), lambda d, t: None)

        def counted() -> Iterator[Any]:
            return read_range(info, FilePosition(log_file, 4), end, RowCounter(charsets, mariadb=True), 4712)

        stages: dict[str, Callable[[], int]] = {
            "range_scan (a range's planning without a limit: events' headers)":
                lambda: sum(t.events for t in scan_range(info, FilePosition(log_file, 4), end, 4713, lambda n: True)),
            "read_range, RowCounter (a range's planning: rows counted, no values)":
                lambda: sum(len(t.changes) for t in counted()),
            "read_range (decoded RowChanges)": lambda: sum(len(t.changes) for t in txns()),
            "+ change_batches (JSON stream rows: rowFormat=json)": lambda: sum(
                b.num_rows for b in batches()) - 1,
            "+ Packer (rowFormat=arrow today)": lambda: sum(
                int(x or 0) for b in Packer().pack_all(batches()) for x in b.column("_count").to_pylist()),
            "+ typed columns, direct pack (prototype)": lambda: sum(n for n, _ in typed_packs(txns())),
        }
        measure(stages, args.changes, args.repeats, runs, "change")
    report(stages, runs, args.name or "mysql_source_parts_changes", args)


def measure(stages: dict[str, Callable[[], int]], n: int, repeats: int, runs: list[dict[str, Any]], unit: str) -> None:
    for r in range(repeats):
        for label, fn in stages.items():
            load0, c0, t0 = os.getloadavg()[0], time.process_time(), time.perf_counter()
            got = fn()
            assert got == n, (label, got)
            s, cpu = time.perf_counter() - t0, time.process_time() - c0
            runs.append({"stage": label, "round": r, "seconds": round(s, 3), "cpu_s": round(cpu, 3),
                         f"cpu_us_per_{unit}": round(cpu * 1e6 / n, 2), "load_start": round(load0, 2),
                         "load_end": round(os.getloadavg()[0], 2)})
            print(f"  r{r} {label}: {s:.2f} s, cpu {cpu:.2f} s ({cpu * 1e6 / n:.2f} us/{unit}), load {load0:.1f}",
                  flush=True)


def report(stages: dict[str, Any], runs: list[dict[str, Any]], name: str, args: argparse.Namespace) -> None:
    key = next(k for k in runs[0] if k.startswith("cpu_us_per_"))
    summary = [{"stage": lb, key: statistics.median(x[key] for x in runs if x["stage"] == lb),
                "seconds": statistics.median(x["seconds"] for x in runs if x["stage"] == lb)} for lb in stages]
    print_table(["stage", f"median {key}", "median s"], [[s["stage"], s[key], s["seconds"]] for s in summary])
    print("wrote", write_results(name, {"args": vars(args), "runs": runs, "summary": summary}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--split-size", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="", help="the results' file name (default: mysql_source_parts[_changes])")
    ap.add_argument("--json-stages", action="store_true", help="also the JSON stream rows and the Packer's way")
    ap.add_argument("--changes", type=int, default=0, help="measure the change path with this many changes instead")
    args = ap.parse_args()
    if args.changes:
        changes_main(args)
        return
    runs: list[dict[str, Any]] = []
    with temporary_mariadb("flinkish-bench-mariadb-") as server:
        server.sql("CREATE DATABASE bench; " + DDL + "; " + FILL.format(rows=args.rows) + "; ANALYZE TABLE bench.t")
        info_url = parse_url(server.url_for("bench"))
        with open_snapshot(info_url) as snap:
            info = snap.table("bench", "t")
            chunks = [{"table": "bench.t", "database": "bench", "name": "t", "key": ["id"],
                       "lo": None if c.lo is None else [bound_to_json(v) for v in c.lo],
                       "hi": None if c.hi is None else [bound_to_json(v) for v in c.hi]}
                      for c in snap.chunks(info, args.split_size)]
        target = schema_of_info(info).arrow_schema()

        def stage(fn: Callable[[Any, dict[str, Any]], int]) -> Callable[[], int]:
            def go() -> int:
                with closing(connect(info_url)) as conn:
                    return sum(fn(conn, c) for c in chunks)
            return go

        def select(conn: Any, c: dict[str, Any]) -> tuple[Any, int]:
            """The chunk's SELECT of read_chunk, unbuffered, in a snapshot of its own: (its result, columns)."""
            begin_snapshot(conn)
            cond, params = chunk_condition(info, chunk_table(c, conn)[1])  # type: ignore[index]
            cur = pymysql.cursors.SSCursor(conn)
            cur.execute(f"SELECT {', '.join(_select_expr(x) for x in info.columns)} FROM {info.qualified} "
                        f"WHERE {cond}", params)
            return cur, len(info.columns)

        def drained(conn: Any, c: dict[str, Any]) -> int:
            cur, _ = select(conn, c)
            n = drain(cur._result)
            conn.rollback()
            return n

        def split(blocks: Callable[[Any, int], Iterator[list[Any]]]) -> Callable[[Any, dict[str, Any]], int]:
            def go(conn: Any, c: dict[str, Any]) -> int:
                cur, ncols = select(conn, c)
                n = sum(len(b[0]) for b in blocks(cur._result, ncols))
                conn.rollback()
                return n
            return go

        stages = {
            "server + socket: the chunk's SELECT, its packets read and dropped": stage(drained),
            "+ the row loop per value -> binary columns (before row_packets)": stage(split(loop_columns)),
            "+ row_packets: blocks of rows, column by column (numpy) -> binary columns":
                stage(split(lambda r, n: column_blocks(r, n, BATCH_ROWS))),
            "read_chunk_arrow: + one Arrow cast per column (typed Arrow)":
                stage(lambda conn, c: sum(b.num_rows for b in read_chunk_arrow(c, conn))),
            "read_chunk_rows(packed): + the packs of rowFormat=arrow (IPC per pack)":
                stage(lambda conn, c: sum(int(x) for b in read_chunk_rows(c, conn, True) if b.num_rows
                                          and "_count" in b.schema.names for x in b.column("_count").to_pylist()
                                          if x)),
        }
        if args.json_stages:
            stages.update({
                "read_chunk_rows (JSON stream rows: rowFormat=json)":
                    stage(lambda conn, c: sum(b.num_rows for b in read_chunk_rows(c, conn)) - 1),
                "read_chunk_rows + Packer (rowFormat=arrow, the JSON way)":
                    stage(lambda conn, c: sum(int(x) for b in Packer().pack_all(read_chunk_rows(c, conn))
                                              for x in b.column("_count").to_pylist())),
            })
        measure(stages, args.rows, args.repeats, runs, "row")
    report(stages, runs, args.name or "mysql_source_parts", args)


if __name__ == "__main__":
    main()
