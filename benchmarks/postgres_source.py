"""The ``flinkish.postgres`` source: snapshot rows/s vs Spark's JDBC reader, change stream rate and lag.

On an embedded PostgreSQL 18 (a fresh data folder), local[2]:

1. **Snapshot** of a table of N rows (id bigint primary key, k int, v double precision,
   name text, ts timestamptz) into Spark's Parquet writer, side by side with Spark's JDBC
   reader (``partitionColumn=id``, ``numPartitions=2``, the PostgreSQL JDBC jar of the
   local Maven repository via ``spark.jars``) into the same writer, and a Python data source
   that makes the same Arrow batches in memory (the bound of Spark's Python data source path:
   what reading costs with nothing to read). One warm-up run of each on a 200k-row table, then
   ``--repeats`` alternating rounds; medians, and the CPU seconds of the JVM, the Python
   workers and PostgreSQL in each run (from /proc).
2. **Change stream** (``startup=changes``, 1-second trigger, foreachBatch appending to
   Parquet): *sustained changes/s* -- a writer process inserts ``--changes`` rows in
   1,000-row transactions as fast as it can while the pipeline runs, and the rate is rows
   over the time from the first insert to the last row in the target; *lag* -- a writer at a
   fixed ``--rate`` rows/s for ``--lag-seconds``, and per row the time from its commit
   (``_commit_ts``) to the end of the batch that wrote it to the target, p50 and p99.

    python benchmarks/postgres_source.py [--rows 10000000] [--repeats 3] [--changes 300000] [--changes-only | --snapshot-only]
        [--split-size 100000] [--no-floor]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

JDBC_JAR = os.path.expanduser("~/.m2/repository/org/postgresql/postgresql/42.7.13/postgresql-42.7.13.jar")

WRITER = r'''
import sys, time, psycopg
url, total, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
start_id = int(sys.argv[4])
batch = 1000 if rate <= 0 else max(1, int(rate // 10))
with psycopg.connect(url, autocommit=True) as conn:
    t0 = time.time(); done = 0
    while done < total:
        n = min(batch, total - done)
        conn.execute("INSERT INTO changes SELECT g, g %% 100, g * 0.5, 'c' || g, now() FROM generate_series(%s::bigint, %s::bigint) g",
                     (start_id + done, start_id + done + n - 1))
        done += n
        if rate > 0:
            ahead = done / rate - (time.time() - t0)
            if ahead > 0:
                time.sleep(ahead)
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--lag-seconds", type=float, default=30.0)
    ap.add_argument("--changes-only", action="store_true", help="skip the snapshot comparison")
    ap.add_argument("--snapshot-only", action="store_true", help="skip the change stream")
    ap.add_argument("--split-size", type=int, default=100_000, help="the source's splitSize (its default: 100,000)")
    ap.add_argument("--no-floor", action="store_true", help="skip the in-memory Python source (the bound)")
    args = ap.parse_args()

    import psycopg

    import flinkish_spark
    from flinkish_spark.embedded.postgres import start_postgres

    work = tempfile.mkdtemp(prefix="bench-pg-source-")
    pg = start_postgres(os.path.join(work, "pg"))
    url = pg.uri
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            t0 = time.time()
            for table, n in (() if args.changes_only else (("snap", args.rows), ("warm", 200_000))):
                conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, k int, v double precision, name text, ts timestamptz)")
                conn.execute(
                    f"INSERT INTO {table} SELECT g, g % 1000, g * 0.25, 'name ' || g, "
                    f"timestamptz '2024-01-01' + g * interval '1 second' FROM generate_series(1, {n}) g"
                )
                conn.execute(f"VACUUM ANALYZE {table}")
            if not args.changes_only:
                print(f"table of {args.rows:,} rows loaded in {time.time() - t0:.1f}s", flush=True)
            conn.execute("CREATE TABLE changes (id bigint PRIMARY KEY, k int, v double precision, name text, ts timestamptz)")

        spark = flinkish_spark.session(conf={"spark.jars": JDBC_JAR, "spark.driver.memory": "2g"})
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(InMemorySource)
        pgroot = int(open(os.path.join(pg.data_dir, "postmaster.pid")).readline())
        names = ["spark jdbc", "flinkish.postgres"] + ([] if args.no_floor else ["in-memory Python source"])
        results: dict[str, list[float]] = {k: [] for k in names}
        cpu: dict[str, list[dict[str, float]]] = {k: [] for k in names}
        durations: list[dict[str, int]] = []

        def snapshot(name: str, table: str, rows: int, tag: str) -> float:
            out = os.path.join(work, f"out-{tag}")
            t0 = time.time()
            if name == "flinkish.postgres":
                df = (spark.readStream.format("flinkish.postgres").option("uid", tag)
                      .option("checkpoint", os.path.join(work, f"meta-{tag}")).option("url", url)
                      .option("table", table).option("startup", "snapshot").option("splitSize", args.split_size).load())
                q = (df.writeStream.format("parquet").option("path", out)
                     .option("checkpointLocation", os.path.join(work, f"cp-{tag}")).trigger(availableNow=True).start())
                end = flinkish_spark.await_finished(q)
                assert end == "finished", end
                if table == "snap":
                    durations.append(sum_durations(q.recentProgress))
            elif name == "spark jdbc":
                df = spark.read.jdbc(pg.jdbc_url, table, column="id", lowerBound=1, upperBound=rows,
                                     numPartitions=2, properties={"driver": "org.postgresql.Driver", "fetchsize": "10000"})
                df.write.parquet(out)
            else:
                spark.read.format("bench.inmemory").option("rows", rows).load().write.parquet(out)
            secs = time.time() - t0
            n = spark.read.parquet(out).count()
            assert n == rows, (name, n)
            shutil.rmtree(out, ignore_errors=True)
            return secs

        if not args.changes_only:
            for name in names:  # warm-up: JIT, Python workers, class loading -- for each reader alike
                snapshot(name, "warm", 200_000, f"warm-{len(name)}")
        for rep in range(0 if args.changes_only else args.repeats):
            for name in names:
                before = cpu_seconds(os.getpid(), pgroot)
                secs = snapshot(name, "snap", args.rows, f"r{rep}-{len(name)}")
                used = {k: round(v - before.get(k, 0.0), 1) for k, v in cpu_seconds(os.getpid(), pgroot).items()}
                results[name].append(secs)
                cpu[name].append(used)
                extra = f"; progress durationMs {durations[-1]}" if name == "flinkish.postgres" else ""
                print(f"{name}: {args.rows / secs:,.0f} rows/s ({secs:.1f}s); CPU seconds {used}{extra}", flush=True)

        med = {k: statistics.median(v) for k, v in results.items() if v}
        if med:
            base = args.rows / med["spark jdbc"]
            rows = [[k, " ".join(f"{s:.1f}" for s in results[k]), f"{args.rows / s:,.0f}", f"{(args.rows / s) / base:.2f}x",
                     " ".join(f"{c}={statistics.median(u[c] for u in cpu[k]):.1f}" for c in sorted(cpu[k][0]))]
                    for k, s in med.items()]
            print_table(["snapshot", "runs (s)", "rows/s (median)", "vs jdbc", "CPU s (median)"], rows)

        changes = {} if args.snapshot_only else change_stream(spark, url, work, args)
        snapshot_results = {} if args.changes_only else {
            "rows": args.rows, "repeats": args.repeats, "split_size": args.split_size, "snapshot_seconds": results,
            "snapshot_rows_per_s": {k: args.rows / s for k, s in med.items()}, "snapshot_cpu_seconds": cpu,
            "flinkish_progress_duration_ms": durations,
        }
        # A run of one part keeps the other part's figures of the previous run (marked with its date).
        previous = previous_results("postgres_source")
        kept = {k: v for k, v in previous.items() if k not in snapshot_results and k not in changes and k != "machine"}
        if kept and "machine" in previous:
            kept["kept_from_run_of"] = previous.get("kept_from_run_of") or previous["machine"].get("date")
        path = write_results("postgres_source", {**kept, **snapshot_results, **changes})
        print(f"results: {path}")
        spark.stop()
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)


def previous_results(name: str) -> dict[str, Any]:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{name}.json")
    try:
        with open(path) as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return {}


def cpu_seconds(driver: int, postmaster: int) -> dict[str, float]:
    """CPU seconds so far of this run's processes (Linux /proc): the JVM, Python workers, PostgreSQL.

    PostgreSQL: the postmaster's own and its exited children's time (a backend's time is added
    to it when the backend ends) plus its live children's.
    """
    tck = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, float, float, str]] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{p}/cmdline", "rb") as fb:
                cmd = fb.read().decode(errors="replace")
        except OSError:
            continue
        procs[int(p)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tck, (int(fields[13]) + int(fields[14])) / tck, cmd)

    def under(pid: int, root: int) -> bool:
        while pid in procs and pid > 1:
            if pid == root:
                return True
            pid = procs[pid][0]
        return False

    out = {"jvm": 0.0, "python workers": 0.0, "postgres": 0.0}
    for pid, (_, own, children, cmd) in procs.items():
        if pid == postmaster:
            out["postgres"] += own + children
        elif under(pid, postmaster):
            out["postgres"] += own
        elif pid != driver and under(pid, driver):
            out["jvm" if "java" in cmd or "spark-submit" in cmd else "python workers"] += own
    return out


class InMemorySource(DataSource):
    """The bound: the same rows and Arrow batches as the table, made in memory by a Python data source.

    What Spark's Python data source path costs with nothing to read: Arrow batches from two
    Python workers to the JVM, into the same Parquet writer.
    """

    @classmethod
    def name(cls) -> str:
        return "bench.inmemory"

    def schema(self) -> str:
        return "id bigint, k int, v double, name string, ts timestamp, _op string, _lsn bigint, _commit_ts timestamp"

    def reader(self, schema: Any) -> "InMemoryReader":
        return InMemoryReader(int(self.options["rows"]))


class InMemoryRange(InputPartition):
    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


class InMemoryReader(DataSourceReader):
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self) -> list[InputPartition]:
        half = self.rows // 2
        return [InMemoryRange(0, half), InMemoryRange(half, self.rows)]

    def read(self, partition: Any) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        for lo in range(partition.lo, partition.hi, 65_536):
            hi = min(lo + 65_536, partition.hi)
            ids = pa.array(range(lo + 1, hi + 1), pa.int64())
            n = hi - lo
            yield pa.RecordBatch.from_arrays(
                [ids, pc.cast(pc.bit_wise_and(ids, 1023), pa.int32()), pc.multiply(pc.cast(ids, pa.float64()), 0.25),
                 pc.binary_join_element_wise("name ", pc.cast(ids, pa.string()), ""),
                 pc.cast(pc.multiply(ids, 1_000_000), pa.timestamp("us", tz="UTC")),
                 pa.repeat(pa.scalar("r"), n), pa.nulls(n, pa.int64()), pa.nulls(n, pa.timestamp("us", tz="UTC"))],
                names=["id", "k", "v", "name", "ts", "_op", "_lsn", "_commit_ts"],
            )


def sum_durations(progress: Any) -> dict[str, int]:
    """The query's ``durationMs`` entries summed over its batches (where the time went)."""
    total: dict[str, int] = {}
    for p in progress:
        for k, v in (p.durationMs or {}).items():
            total[k] = total.get(k, 0) + int(v)
    return total


def change_stream(spark: Any, url: str, work: str, args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow.parquet as pq

    import flinkish_spark

    target = os.path.join(work, "changes-out")
    lags: list[float] = []
    seen = [0]
    last_row_at = [0.0]

    def batch(df: Any, batch_id: int) -> None:
        data = df.toArrow()
        if data.num_rows:
            pq.write_table(data, os.path.join(target, f"batch-{batch_id}.parquet"))
        now = time.time()
        for ts in data.column("_commit_ts").to_pylist():
            lags.append(now - ts.timestamp())
        seen[0] += data.num_rows
        if data.num_rows:
            last_row_at[0] = now

    os.makedirs(target, exist_ok=True)
    df = (spark.readStream.format("flinkish.postgres").option("uid", "changes").option("checkpoint", os.path.join(work, "meta-c"))
          .option("url", url).option("table", "changes").option("startup", "changes").load())
    q = (df.writeStream.foreachBatch(batch).option("checkpointLocation", os.path.join(work, "cp-c"))
         .trigger(processingTime="1 second").start())
    while q.lastProgress is None:  # the slot exists after the first epoch
        time.sleep(0.2)

    def write(total: int, rate: float, start_id: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", WRITER, url, str(total), str(rate), str(start_id)])

    # Sustained rate: as fast as the writer can insert, until the target has every row.
    t0 = time.time()
    if write(args.changes, 0, 1).wait() != 0:
        raise SystemExit("the change writer failed")
    writer_s = time.time() - t0
    while seen[0] < args.changes and q.isActive:
        time.sleep(0.1)
    rate = args.changes / (last_row_at[0] - t0)
    print(f"change stream: {rate:,.0f} changes/s sustained ({args.changes:,} rows; the writer alone took {writer_s:.1f}s)", flush=True)

    # Lag at a fixed rate.
    lags.clear()
    total = int(args.rate * args.lag_seconds)
    if write(total, args.rate, 10_000_000).wait() != 0:
        raise SystemExit("the change writer failed")
    while seen[0] < args.changes + total and q.isActive:
        time.sleep(0.1)
    lags.sort()
    p50, p99 = lags[len(lags) // 2], lags[int(len(lags) * 0.99)]
    print(f"lag at {args.rate:,.0f} changes/s (1 s trigger): p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms", flush=True)
    end = flinkish_spark.stop(q, drain=True, timeout=120)
    assert end == "drained", end
    assert len(glob.glob(os.path.join(target, "*.parquet"))) > 0
    return {"changes": args.changes, "changes_per_s": rate, "writer_seconds": writer_s,
            "lag_rate": args.rate, "lag_p50_ms": p50 * 1000, "lag_p99_ms": p99 * 1000}


if __name__ == "__main__":
    main()
