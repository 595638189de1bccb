"""The MySQL snapshot read (connectors/mysql/snapshot.py) vs Spark's JDBC reader, both to Parquet (issue 29).

On a MariaDB 10.11 of :mod:`flinkish_spark.embedded.mariadb`, ``bench.t`` (bigint key, int, varchar(64),
decimal(12,2), datetime(6), double) gets ``--rows`` rows (MariaDB's sequence engine). In each of ``--repeats``
rounds, side by side, each reads the whole table, chunked by key, and writes Parquet:

* ``flinkish, 1 process``: one consistent snapshot, ``plan_chunks`` (``--split-size`` rows), every chunk read by
  ``read_chunk`` (row packets split into column lists by our own loop, one Arrow cast per column), one Parquet
  file;
* ``flinkish, 2 processes``: the chunks shared by two worker processes, each in its own snapshot (the throughput
  of two executors; their snapshots are not one -- the CDC core's per-chunk positions handle that);
* ``PyMySQL converters, 1 process``: the same chunks through PyMySQL's own Python converters and
  ``pa.Table.from_pylist`` (the path ``read_chunk`` avoids);
* ``Spark JDBC, local[2]``: ``spark.read.jdbc`` with Debian's MariaDB Connector/J
  (/usr/share/java/mariadb-java-client.jar in ``spark.jars``), partitioned by ``id`` into as many partitions as
  the flinkish chunks, ``.write.parquet`` (the session's start is not timed).

    PYTHONPATH=. python benchmarks/mysql_snapshot.py [--rows 1000000] [--split-size 100000] [--repeats 2]

The machine may be shared: each figure carries the load average at its end and the readers' CPU seconds (this
process, its worker processes, Spark's JVM; not the server's), which depend little on the load; compare ratios
within a run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.connectors.mysql.connection import connect, parse_url  # noqa: E402
from flinkish_spark.connectors.mysql.snapshot import Chunk, TableInfo, chunk_condition, open_snapshot, read_chunk  # noqa: E402
from flinkish_spark.embedded.mariadb import temporary_mariadb  # noqa: E402

JAR = "/usr/share/java/mariadb-java-client.jar"
DDL = ("CREATE TABLE bench.t (id bigint PRIMARY KEY, n int, name varchar(64), amount decimal(12,2), "
       "ts datetime(6), score double)")


def load(server: Any, rows: int) -> None:
    server.sql("CREATE DATABASE bench; " + DDL + "; INSERT INTO bench.t SELECT seq, seq % 1000, "
               "concat('customer ', hex(seq * 7919)), (seq % 100000) / 100, "
               "'2024-01-01 00:00:00' + INTERVAL seq SECOND + INTERVAL (seq * 37) % 1000000 MICROSECOND, seq * 0.25 "
               f"FROM bench.seq_1_to_{rows}; ANALYZE TABLE bench.t")


def flinkish_chunks(url: str, chunks: list[Chunk], out: str) -> int:
    """Read ``chunks`` in one snapshot and write them to one Parquet file; the row count."""
    n = 0
    with open_snapshot(parse_url(url)) as snap:
        info = snap.table("bench", "t")
        with pq.ParquetWriter(out, info.arrow_schema) as writer:
            for chunk in chunks:
                for batch in snap.read(info, chunk):
                    writer.write_batch(batch)
                    n += batch.num_rows
    return n


def converters_chunks(url: str, info: TableInfo, chunks: list[Chunk], out: str) -> int:
    import pymysql

    n = 0
    with connect(parse_url(url)) as conn, pq.ParquetWriter(out, info.arrow_schema) as writer:
        names = [c.name for c in info.columns]
        for chunk in chunks:
            cond, params = chunk_condition(info, chunk)
            cur = pymysql.cursors.SSCursor(conn)
            cur.execute(f"SELECT * FROM bench.t WHERE {cond}", params)
            while rows := cur.fetchmany(8192):
                batch = pa.RecordBatch.from_pylist([dict(zip(names, r)) for r in rows], schema=info.arrow_schema)
                writer.write_batch(batch)
                n += batch.num_rows
            cur.close()
    return n


def cpu_seconds(jvm_pid: int) -> float:
    """CPU of the readers: this process, its finished children (the worker processes) and Spark's JVM (its
    executors are threads in it). Not the server's: both readers make it do the same work."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{jvm_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime + (int(fields[11]) + int(fields[12])) / ticks


def timed(label: str, fn: Any, rows: int, jvm_pid: int) -> dict[str, Any]:
    c0, t0 = cpu_seconds(jvm_pid), time.perf_counter()
    got = fn()
    seconds, cpu = time.perf_counter() - t0, cpu_seconds(jvm_pid) - c0
    assert got == rows, (label, got, rows)
    return {"reader": label, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds),
            "cpu_s": round(cpu, 2), "cpu_us_per_row": round(cpu * 1e6 / rows, 2),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--split-size", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from pyspark.sql import SparkSession

    work = tempfile.mkdtemp(prefix="flinkish-mysql-snapshot-bench-")
    results: list[dict[str, Any]] = []
    try:
        with temporary_mariadb("flinkish-bench-mariadb-") as server:
            load(server, args.rows)
            url = server.url_for("bench")
            with open_snapshot(parse_url(url)) as snap:
                info = snap.table("bench", "t")
                chunks = snap.chunks(info, args.split_size)
            spark = (SparkSession.builder.master("local[2]").appName("mysql-snapshot-bench")
                     .config("spark.jars", JAR).config("spark.ui.enabled", "false").getOrCreate())
            # jdbc:mysql (permitMysqlScheme): Spark picks its MySQL dialect (backquoted names) only for that scheme.
            jdbc_url = f"jdbc:mysql://127.0.0.1:{server.port}/bench?permitMysqlScheme"

            def spark_jdbc(out: str) -> int:
                df = spark.read.jdbc(jdbc_url, "t", column="id", lowerBound=1, upperBound=args.rows + 1,
                                     numPartitions=len(chunks), properties={"user": "root", "password": "",
                                                                            "driver": "org.mariadb.jdbc.Driver"})
                df.write.mode("overwrite").parquet(out)
                return args.rows  # counted after the timing (below)

            def two_processes(out: str) -> int:
                os.makedirs(out, exist_ok=True)
                with ProcessPoolExecutor(2) as pool:
                    parts = [chunks[0::2], chunks[1::2]]
                    futures = [pool.submit(flinkish_chunks, url, p, os.path.join(out, f"part-{i}.parquet"))
                               for i, p in enumerate(parts)]
                    return sum(f.result() for f in futures)

            jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
            spark_jdbc(os.path.join(work, "warmup"))  # the JVM's classes and JIT: not the reader's cost
            for r in range(args.repeats):
                out = os.path.join(work, f"r{r}")
                os.makedirs(out)
                results.append(timed("flinkish, 1 process",
                                     lambda: flinkish_chunks(url, chunks, os.path.join(out, "f1.parquet")),
                                     args.rows, jvm_pid))
                results.append(timed("flinkish, 2 processes", lambda: two_processes(os.path.join(out, "f2")),
                                     args.rows, jvm_pid))
                results.append(timed("PyMySQL converters, 1 process",
                                     lambda: converters_chunks(url, info, chunks, os.path.join(out, "c.parquet")),
                                     args.rows, jvm_pid))
                results.append(timed("Spark JDBC, local[2]", lambda: spark_jdbc(os.path.join(out, "spark")),
                                     args.rows, jvm_pid))
                assert spark.read.parquet(os.path.join(out, "spark")).count() == args.rows
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    labels = list(dict.fromkeys(r["reader"] for r in results))
    median = {lb: statistics.median(r["rows_per_s"] for r in results if r["reader"] == lb) for lb in labels}
    cpu = {lb: statistics.median(r["cpu_us_per_row"] for r in results if r["reader"] == lb) for lb in labels}
    jdbc = median["Spark JDBC, local[2]"]
    summary = [{"reader": lb, "median_rows_per_s": round(v), "ratio_to_spark_jdbc": round(v / jdbc, 2),
                "median_cpu_us_per_row": cpu[lb], "cpu_ratio_to_spark_jdbc": round(cpu[lb] / cpu["Spark JDBC, local[2]"], 2)}
               for lb, v in median.items()]
    print_table(["reader", "seconds", "rows/s", "CPU us/row", "load 1m"],
                [[r["reader"], r["seconds"], r["rows_per_s"], r["cpu_us_per_row"], r["load_avg_1m"]] for r in results])
    print_table(["reader", "median rows/s", "vs Spark JDBC", "CPU us/row", "CPU vs Spark JDBC"],
                [[s["reader"], s["median_rows_per_s"], s["ratio_to_spark_jdbc"], s["median_cpu_us_per_row"],
                  s["cpu_ratio_to_spark_jdbc"]] for s in summary])
    print(write_results("mysql_snapshot", {"rows": args.rows, "split_size": args.split_size, "chunks": len(chunks),
                                           "runs": results, "summary": summary}))


if __name__ == "__main__":
    main()
