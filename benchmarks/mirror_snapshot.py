"""The mirror's snapshot (issue 26, target 5): one big table and many tables into routed Delta vs Spark's JDBC reader.

On an embedded PostgreSQL, ``local[2]``, local disk, in one run side by side:

* **mirror path**: one Spark query, ``flinkish.postgres`` with ``tables`` (``startup=snapshot``,
  the mirror's default ``maxRowsPerTrigger`` 200,000 unless ``--max-rows``, ``splitSize`` 100,000
  unless ``--split-size``, ``snapshotPartitions`` 2) into ``flinkish.delta`` routed by
  ``{schema}/{table}``, processing-time trigger ``--trigger`` s. Rate = rows ÷ (``start()`` -> the
  query finished by itself: every chunk committed).
* **Spark JDBC -> Parquet**: ``spark.read.jdbc`` partitioned by the key into 2 partitions
  (``fetchsize=10000``, the PostgreSQL JDBC jar of the local Maven repository via ``spark.jars``)
  written as Parquet; one job per table for the many-tables case.

Cases: ``big`` -- ``bench.big`` of ``--rows`` rows (id bigint primary key, k int, v double
precision, name text, ts timestamptz, the row of ``postgres_source.py``); ``many`` -- ``--tables``
tables ``many.t_<i>`` of ``--table-rows`` rows each, the same row. One warm-up of each reader on a
200,000-row table first. With ``--timers`` the Python processes load ``benchmarks/timers`` (see
``mirror_path.py``): per epoch the sink's prepare, commit and the source's read, summed.

    python benchmarks/mirror_snapshot.py [--rows 2000000] [--tables 100 --table-rows 20000] [--cases big,many]
        [--variants 200000@1,1000000@1,200000@10] [--split-size 100000] [--row-formats json,arrow] [--timers] [--tag NAME]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import print_table, write_results  # noqa: E402
from mirror_path import timers_by_epoch  # noqa: E402

JDBC_JAR = os.path.expanduser("~/.m2/repository/org/postgresql/postgresql/42.7.13/postgresql-42.7.13.jar")
COLUMNS = "id bigint PRIMARY KEY, k int, v double precision, name text, ts timestamptz"
FILL = ("INSERT INTO {t} SELECT g, g % 1000, g * 0.25, 'name ' || g, timestamptz '2024-01-01' + g * interval '1 second' "
        "FROM generate_series(1, {n}) g")


def cpu_seconds(driver: int, postmaster: int) -> dict[str, float]:
    """CPU seconds so far (Linux /proc) of the JVM, Spark's Python workers and PostgreSQL: per live process its own
    time plus that of its ended children it waited for (a Python worker's time lands in its daemon's when it
    ends, a backend's in the postmaster's), so a process that ended in between is still counted."""
    tck = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, float, str]] = {}
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
        procs[int(p)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / tck, cmd)

    def root_of(pid: int) -> int | None:
        while pid in procs and pid > 1:
            if pid in (driver, postmaster):
                return pid
            pid = procs[pid][0]
        return None

    out = {"jvm": 0.0, "python workers": 0.0, "postgres": 0.0}
    for pid, (_, used, cmd) in procs.items():
        root = root_of(pid)
        if root == postmaster:
            out["postgres"] += used
        elif root == driver and pid != driver:
            out["jvm" if "java" in cmd else "python workers"] += used
    return out


def load(url: str, schema: str, tables: int, rows: int) -> list[str]:
    import psycopg

    names = [f"{schema}.big"] if tables == 0 else [f"{schema}.t_{i:04d}" for i in range(tables)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for t in names:
            conn.execute(f"CREATE TABLE {t} ({COLUMNS})")
            conn.execute(FILL.format(t=t, n=rows))
        conn.execute("VACUUM ANALYZE")
    return names


def mirror(spark: Any, url: str, schema: str, work: str, tag: str, max_rows: int, trigger: float,
           split_size: int, row_format: str = "json") -> tuple[float, Any]:
    import flinkish_spark

    meta, lake = os.path.join(work, f"meta-{tag}"), os.path.join(work, f"lake-{tag}")
    r = (spark.readStream.format("flinkish.postgres").option("uid", "src").option("checkpoint", meta)
         .option("url", url).option("tables", f"{schema}.*").option("startup", "snapshot")
         .option("maxRowsPerTrigger", str(max_rows)).option("splitSize", str(split_size))
         .option("snapshotPartitions", "2").option("rowFormat", row_format))
    t0 = time.time()
    q = (r.load().writeStream.format("flinkish.delta").option("uid", "lake").option("checkpoint", meta)
         .option("path", os.path.join(lake, "{schema}", "{table}"))
         .option("checkpointLocation", os.path.join(work, f"cp-{tag}"))
         .trigger(processingTime=f"{trigger} seconds").start())
    end = flinkish_spark.await_finished(q, timeout=3600)
    secs = time.time() - t0
    assert end == "finished", end
    return secs, (q.recentProgress, lake)


def jdbc(spark: Any, jdbc_url: str, names: list[str], rows: int, work: str, tag: str) -> float:
    t0 = time.time()
    for t in names:
        df = spark.read.jdbc(jdbc_url, t, column="id", lowerBound=1, upperBound=rows, numPartitions=2,
                             properties={"driver": "org.postgresql.Driver", "fetchsize": "10000"})
        df.write.parquet(os.path.join(work, f"pq-{tag}", t))
    return time.time() - t0


def delta_rows(lake: str, names: list[str]) -> int:
    from flinkish_spark.mirror.compare import delta_reader

    read = delta_reader(lake)
    total = 0
    for t in names:
        data = read(t)
        total += 0 if data is None else data.num_rows
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--tables", type=int, default=100)
    ap.add_argument("--table-rows", type=int, default=20_000)
    ap.add_argument("--cases", default="big,many")
    ap.add_argument("--variants", default="200000@1",
                    help="mirror runs, each MAXROWS@TRIGGER: maxRowsPerTrigger (the mirror's default: 200,000) and the "
                         "processing-time trigger in seconds (the mirror's default: 10)")
    ap.add_argument("--many-variants", default=None, help="the many-tables case's variants (default: --variants)")
    ap.add_argument("--split-size", type=int, default=100_000)
    ap.add_argument("--timers", action="store_true")
    ap.add_argument("--profile", default="")
    ap.add_argument("--row-formats", default="json,arrow", help="the source's rowFormat values, each run per variant")
    ap.add_argument("--tag", default="", help="a name for this run in the results file (e.g. before, after)")
    args = ap.parse_args()
    cases = args.cases.split(",")

    work = tempfile.mkdtemp(prefix="bench-mirror-snapshot-")
    timer_file = os.path.join(work, "timers.jsonl")
    if args.timers:  # before the JVM starts: Spark's Python workers inherit the environment
        os.environ["FLINKISH_BENCH_TIMERS"] = timer_file
        os.environ["FLINKISH_BENCH_PROFILE"] = args.profile
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "timers"), os.environ.get("PYTHONPATH", "")])
        sys.path.insert(0, os.path.join(HERE, "timers"))
        import sitecustomize  # noqa: F401  (this process: the driver's timers)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import flinkish_spark
    from flinkish_spark.embedded.postgres import start_postgres

    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a kill still stops the server and removes the folder
    pg = start_postgres(os.path.join(work, "pg"))
    pgroot = int(open(os.path.join(pg.data_dir, "postmaster.pid")).readline())

    def cpu_since(before: dict[str, float]) -> dict[str, float]:
        return {k: round(v - before.get(k, 0.0), 1) for k, v in cpu_seconds(os.getpid(), pgroot).items()}

    results: dict[str, Any] = {"args": vars(args), "runs": []}
    try:
        t0 = time.time()
        warm = load(pg.uri, "warm", 0, 200_000)
        data = {"big": ("bench", load(pg.uri, "bench", 0, args.rows) if "big" in cases else [], args.rows),
                "many": ("many", load(pg.uri, "many", args.tables, args.table_rows) if "many" in cases else [],
                         args.table_rows)}
        print(f"loaded in {time.time() - t0:.0f}s", flush=True)
        spark = flinkish_spark.session(app_name="bench-mirror-snapshot",
                                       conf={"spark.jars": JDBC_JAR, "spark.driver.memory": "2g"})
        spark.sparkContext.setLogLevel("ERROR")
        jdbc(spark, pg.jdbc_url, warm, 200_000, work, "warm")
        for fmt in args.row_formats.split(","):
            mirror(spark, pg.uri, "warm", work, f"warm-{fmt}", 200_000, 1.0, args.split_size, fmt)
        def parse(text: str) -> list[tuple[int, float]]:
            return [(int(v.split("@")[0]), float(v.split("@")[1])) for v in text.split(",")]

        rows_out = []
        for case in cases:
            schema, names, per_table = data[case]
            total = per_table * len(names)
            before = cpu_seconds(os.getpid(), pgroot)
            j = jdbc(spark, pg.jdbc_url, names, per_table, work, case)
            jcpu = cpu_since(before)
            print(f"{case}: JDBC {j:.1f}s, CPU s {jcpu}", flush=True)
            variants = parse(args.many_variants if case == "many" and args.many_variants else args.variants)
            for max_rows, trigger, fmt in [(m, t, f) for m, t in variants for f in args.row_formats.split(",")]:
                tag = f"{case}-{max_rows}-{trigger:g}-{fmt}"
                load_before = os.getloadavg()
                before = cpu_seconds(os.getpid(), pgroot)
                m, (progress, lake) = mirror(spark, pg.uri, schema, work, tag, max_rows, trigger, args.split_size, fmt)
                load_after = os.getloadavg()
                mcpu = cpu_since(before)
                got = delta_rows(lake, names)
                assert got == total, (case, got, total)
                epochs = [p for p in progress if p.numInputRows]
                timers = timers_by_epoch(timer_file, progress) if args.timers else {}
                summed: dict[str, float] = {}
                for d in timers.values():
                    for k, v in d.items():
                        summed[k] = summed.get(k, 0.0) + v
                durations: dict[str, int] = {}
                for p in progress:
                    for k, v in (p.durationMs or {}).items():
                        durations[k] = durations.get(k, 0) + int(v)
                r = {"case": case, "row_format": fmt, "tables": len(names), "rows": total, "max_rows_per_trigger": max_rows,
                     "trigger_s": trigger, "jdbc_s": round(j, 2), "mirror_s": round(m, 2),
                     "jdbc_rows_per_s": round(total / j), "mirror_rows_per_s": round(total / m),
                     "ratio": round(j / m, 3), "epochs": len(epochs), "load_before": load_before,
                     "load_after": load_after, "duration_ms": durations, "jdbc_cpu_s": jcpu, "mirror_cpu_s": mcpu,
                     "cpu_ratio": round(sum(jcpu.values()) / max(0.1, sum(mcpu.values())), 3),
                     "timers_s": {k: round(v, 2) for k, v in sorted(summed.items())}}
                results["runs"].append(r)
                print(f"{tag}: JDBC {j:.1f}s, mirror {m:.1f}s ({r['ratio']}x), CPU s {mcpu} ({r['cpu_ratio']}x), "
                      f"{len(epochs)} epochs, "
                      f"load {load_before[0]:.1f} -> {load_after[0]:.1f}; durations {durations}; timers {r['timers_s']}",
                      flush=True)
                rows_out.append([case, fmt, f"{len(names)} x {per_table:,}", f"{max_rows:,} @ {trigger:g} s", f"{j:.1f}",
                                 f"{total / j:,.0f}", f"{m:.1f}", f"{total / m:,.0f}", f"{r['ratio']:.2f}x",
                                 f"{sum(jcpu.values()):.0f} / {sum(mcpu.values()):.0f}", len(epochs),
                                 f"{load_before[0]:.1f} / {load_after[0]:.1f}"])
                shutil.rmtree(lake, ignore_errors=True)
            shutil.rmtree(os.path.join(work, f"pq-{case}"), ignore_errors=True)
        print()
        print_table(["case", "rowFormat", "tables x rows", "maxRowsPerTrigger @ trigger", "JDBC s", "JDBC rows/s", "mirror s", "mirror rows/s", "mirror / JDBC", "CPU s JDBC / mirror",
                     "epochs", "load 1 min before / after"], rows_out)
        spark.stop()
        name = "mirror_snapshot" + (f"_{args.tag}" if args.tag else "")
        print("\nwrote", write_results(name, results))
    finally:
        pg.stop()
        if args.profile:  # the profiles of the timed calls outlive the run's folder
            keep = os.path.join(HERE, "results", "profiles")
            os.makedirs(keep, exist_ok=True)
            for name in os.listdir(work):
                if name.endswith(".prof"):
                    shutil.move(os.path.join(work, name), os.path.join(keep, name))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
