"""The mirror path on one table against ``pg_recvlogical`` on the same WAL (issue 26, target 1).

On an embedded PostgreSQL, ``bench.t`` (the row of ``change_decode.py``: int key, text, numeric,
timestamptz, bool, jsonb) is mirrored by one Spark query: ``flinkish.postgres`` with
``tables = 'bench.*'`` into ``flinkish.delta`` routed by ``{schema}/{table}`` on local disk,
processing-time trigger (1 s). The query takes the (empty) table's snapshot and is stopped without
drain (the slot stays). Then a second slot for ``pg_recvlogical`` is created, ``--changes`` inserts are
written in ``--txn``-row transactions (the backlog), and, in one run:

* ``pg_recvlogical`` (the server's binary; ``--recv-repeats`` runs, a slot each, the median) streams that WAL with the source's options (``proto_version
  1``, the mirror's publication) to ``/dev/null`` up to the backlog's end: the physical limit;
* the same query starts again from its checkpoint and works the backlog off. Its rate = changes ÷ (end of
  the last epoch with rows − start of the first), from Spark's progress; also from ``start()``.

Per epoch, from the query progress: rows, ``latestOffset`` / ``queryPlanning`` / ``addBatch`` /
``walCommit`` / ``commitOffsets`` / ``triggerExecution``. With ``--timers`` the Python processes load
``benchmarks/timers/sitecustomize.py`` (benchmark-only wrappers, gated by ``FLINKISH_BENCH_TIMERS``): the
worker's read of the change split, its peek, the sink task's ``task_tables`` and ``prepare``, the driver's
``commit`` -- summed per epoch.

    python benchmarks/mirror_path.py [--row-formats json,arrow,arrow/sink] [--changes 300000] [--txn 1000] [--trigger 1] [--max-rows N] [--timers [--profile driver.commit_epoch,...]]
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
from datetime import datetime, timezone
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import print_table, write_results  # noqa: E402

DDL = "CREATE TABLE bench.t (id int PRIMARY KEY, name text, amount numeric(12,2), ts timestamptz, ok bool, attrs jsonb)"
FILL = """INSERT INTO bench.t SELECT g, 'customer ' || md5(g::text), (g % 100000) / 100.0,
  timestamptz '2024-01-01 00:00:00+00' + g * interval '1.5 second', g % 3 = 0,
  jsonb_build_object('k', g, 'color', 'red') FROM generate_series({lo}, {hi}) g"""
DURATIONS = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets", "triggerExecution")


def epoch_start(p: Any) -> float:
    return datetime.strptime(p.timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def start_query(spark: Any, url: str, work: str, args: argparse.Namespace, fmt: str) -> Any:
    """The mirror of one row shape (``rowFormat``): its own slot, checkpoint and lake; each epoch observes its
    changes (Spark's numInputRows counts packed rows in the arrow shape)."""
    from pyspark.sql import functions as F

    meta, cp, lake = (os.path.join(work, fmt, x) for x in ("meta", "cp", "lake"))
    row_format, _, decode_in = fmt.partition("/")  # "arrow/sink": rowFormat=arrow, decodeIn=sink
    r = (spark.readStream.format("flinkish.postgres").option("uid", f"src_{fmt.replace('/', '_')}")
         .option("checkpoint", meta).option("url", url).option("tables", "bench.*").option("rowFormat", row_format))
    if decode_in:
        r = r.option("decodeIn", decode_in)
    if args.max_rows:
        r = r.option("maxRowsPerTrigger", str(args.max_rows))
    df = r.load()
    n = F.sum("_count") if row_format == "arrow" else F.count_if(F.col("_op").isin("r", "c", "u", "d"))
    df = df.observe("changes", F.coalesce(n, F.lit(0)).cast("long").alias("n"))
    return (df.writeStream.format("flinkish.delta").option("uid", "lake").option("checkpoint", meta)
            .option("path", os.path.join(lake, "{schema}", "{table}"))
            .option("checkpointLocation", cp).trigger(processingTime=f"{args.trigger} seconds").start())


def changes_of(p: Any) -> int:
    return int(((getattr(p, "observedMetrics", None) or {}).get("changes") or {"n": 0})["n"] or 0)


def timers_by_epoch(path: str, progress: list[Any]) -> dict[int, dict[str, float]]:
    """The timer lines, summed per epoch: each line goes to the epoch whose [start, end) holds its start."""
    if not os.path.exists(path):
        return {}
    spans = [(p.batchId, epoch_start(p), epoch_start(p) + (p.durationMs or {}).get("triggerExecution", 0) / 1000)
             for p in progress]
    out: dict[int, dict[str, float]] = {}
    for line in open(path):
        t = json.loads(line)
        for batch, lo, hi in spans:
            if lo <= t["start"] < hi:
                d = out.setdefault(batch, {})
                d[t["name"]] = d.get(t["name"], 0.0) + t["s"]
                break
    return out


def timeline(path: str, p: Any) -> list[tuple[str, int, int, int]]:
    """The timer calls of one epoch: (name, start ms, end ms after the epoch's start, own ms), by start."""
    lo = epoch_start(p)
    hi = lo + (p.durationMs or {}).get("triggerExecution", 0) / 1000
    out = []
    for line in open(path):
        t = json.loads(line)
        if lo <= t["start"] < hi:
            out.append((t["name"], round(1000 * (t["start"] - lo)), round(1000 * (t["end"] - lo)), round(1000 * t["s"])))
    return sorted(out, key=lambda x: (x[1], x[2]))


def report(fmt: str, progress: list[Any], t_start: float, t_done: float, before: int, recv_s: float, timer_file: str,
           args: argparse.Namespace) -> dict[str, Any]:
    """One shape's figures, printed; what the results file keeps of it."""
    first, last = progress[0], progress[-1]
    span = epoch_start(last) + last.durationMs["triggerExecution"] / 1000 - epoch_start(first)
    rows = sum(changes_of(p) for p in progress)
    rate, rate_start = rows / span, rows / (t_done - t_start)
    timers = timers_by_epoch(timer_file, progress) if args.timers else {}
    names = sorted({n for d in timers.values() for n in d})
    epochs = [{"batch": p.batchId, "rows": changes_of(p), **{k: p.durationMs.get(k) for k in DURATIONS},
               **{n: round(timers.get(p.batchId, {}).get(n, 0.0) * 1000) for n in names}} for p in progress]
    print(f"\nmirror path, rowFormat={fmt}, 1 table, {rows:,} changes ({args.txn}-row transactions), {args.trigger:g} s "
          f"trigger, maxRowsPerTrigger {args.max_rows or 'unset'}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus "
          f"({len(progress)} epochs with rows; restart after {before} epochs)\n")
    print_table(["", "changes/s", "x pg_recvlogical", "s"], [
        ("pg_recvlogical -f /dev/null", f"{args.changes / recv_s:,.0f}", "1.00", f"{recv_s:.2f}"),
        ("mirror: first epoch start -> last epoch end", f"{rate:,.0f}", f"{rate * recv_s / args.changes:.3f}", f"{span:.2f}"),
        ("mirror: start() -> last rows seen", f"{rate_start:,.0f}", f"{rate_start * recv_s / args.changes:.3f}",
         f"{t_done - t_start:.2f}")])
    print("\nper epoch, ms (Spark durationMs" + (", then the timers, summed per epoch" if names else "") + "):\n")
    total = {k: sum((e.get(k) or 0) for e in epochs) for k in (*DURATIONS, *names)}
    print_table(["batch", "rows", *DURATIONS, *names],
                [tuple(e.values()) for e in epochs] + [("all", rows, *(total[k] for k in (*DURATIONS, *names)))])
    steps: list[tuple[str, int, int, int]] = []
    if args.timers:
        big = max(progress, key=changes_of)
        steps = timeline(timer_file, big)
        print(f"\ntimeline of batch {big.batchId} ({changes_of(big):,} rows), ms after its start:\n")
        print_table(["call", "start", "end", "own"], steps)
    for name in filter(None, args.profile.split(",")):
        import pstats

        dumps = sorted(glob.glob(f"{timer_file}.{name}.*.prof"))
        if dumps:
            print(f"\ncProfile of {name} ({len(dumps)} calls, all epochs), by own time:")
            pstats.Stats(*dumps).sort_stats("tottime").print_stats(12)
    return {"timeline": steps, "load_avg": os.getloadavg(), "span_s": span, "mirror_changes_per_s": rate,
            "mirror_changes_per_s_from_start": rate_start, "ratio": rate * recv_s / args.changes, "epochs": epochs,
            "totals_ms": total}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--trigger", type=float, default=1.0)
    ap.add_argument("--max-rows", type=int, default=None, help="the source's maxRowsPerTrigger (default: unset)")
    ap.add_argument("--recv-repeats", type=int, default=3, help="pg_recvlogical runs (the median is the reference)")
    ap.add_argument("--timers", action="store_true", help="benchmark-only timers in the driver and Python workers")
    ap.add_argument("--profile", default="", help="with --timers: timer names to cProfile too, e.g. driver.commit_epoch")
    ap.add_argument("--name", default="mirror_path", help="results/<name>.json")
    ap.add_argument("--row-formats", default="json,arrow", help="the source's rowFormat values to run, one after another "
                                                                  "(arrow/sink: with decodeIn=sink)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="flinkish-bench-mirror-path-")
    timer_file = os.path.join(work, "timers.jsonl")
    if args.timers:  # before the JVM starts: Spark's Python workers inherit the environment
        os.environ["FLINKISH_BENCH_TIMERS"] = timer_file
        os.environ["FLINKISH_BENCH_PROFILE"] = args.profile
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "timers"), os.environ.get("PYTHONPATH", "")])
        sys.path.insert(0, os.path.join(HERE, "timers"))
        import sitecustomize  # noqa: F401  (this process started before the variable was set)
        import importlib

        importlib.reload(sitecustomize)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import psycopg

    import flinkish_spark
    from flinkish_spark.connectors.postgres.pgoutput import format_lsn, parse_lsn
    from flinkish_spark.embedded.postgres import start_postgres

    pg = start_postgres(os.path.join(work, "data"))
    url = pg.uri
    formats = [f for f in args.row_formats.split(",") if f]
    runs: dict[str, dict[str, Any]] = {}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA bench")
            conn.execute(DDL)
        spark = flinkish_spark.session(app_name="bench-mirror-path", conf={
            "spark.sql.streaming.numRecentProgressUpdates": "100000", "spark.driver.memory": "2g"})
        spark.sparkContext.setLogLevel("ERROR")
        for fmt in formats:  # each shape's (empty) snapshot and slot, before the backlog
            q = start_query(spark, url, work, args, fmt)
            while not glob.glob(os.path.join(work, fmt, "lake", "bench", "t", "_delta_log", "*.json")):
                if q.exception() is not None or not q.isActive:
                    raise RuntimeError(f"the mirror ended during the snapshot: {q.exception()}")
                time.sleep(0.5)
            time.sleep(2 * args.trigger)
            flinkish_spark.stop(q, drain=False, timeout=300)
        # The first query's publication: pgoutput skips a publication that does not exist (a warning, no error), and
        # pg_recvlogical would time an empty stream.
        publication = f"flinkish_src_{formats[0].replace('/', '_')}"
        with psycopg.connect(url, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone():
                raise RuntimeError(f"no publication {publication!r} for pg_recvlogical")
            for i in range(args.recv_repeats):  # pg_recvlogical consumes its slot: one per run
                conn.execute(f"SELECT pg_create_logical_replication_slot('bench_recv{i}', 'pgoutput')")
            t0 = time.perf_counter()
            for lo in range(1, args.changes + 1, args.txn):
                conn.execute(FILL.format(lo=lo, hi=min(args.changes, lo + args.txn - 1)))
            write_s = time.perf_counter() - t0
            end = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
        print(f"backlog: {args.changes:,} inserts in {args.txn}-row transactions, {write_s:.1f} s", flush=True)
        exe = os.path.join(str(pg.bin_dir), "pg_recvlogical")
        recv_runs = []
        for i in range(args.recv_repeats):
            t0 = time.perf_counter()
            subprocess.run([exe, "-d", url, "--slot", f"bench_recv{i}", "--start", "--no-loop", "-o", "proto_version=1",
                            "-o", f"publication_names={publication}", "-f", "/dev/null",
                            "--endpos", format_lsn(end)], check=True, capture_output=True)
            recv_runs.append(time.perf_counter() - t0)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"SELECT pg_drop_replication_slot('bench_recv{i}')")
        recv_s = statistics.median(recv_runs)
        print(f"pg_recvlogical: {', '.join(f'{x:.2f}' for x in recv_runs)} s; median {args.changes / recv_s:,.0f} changes/s",
              flush=True)
        for fmt in formats:
            for old in glob.glob(timer_file + "*"):  # the snapshot's, the other shape's
                os.remove(old)
            before = len(glob.glob(os.path.join(work, fmt, "cp", "commits", "*")))
            t_start = time.time()
            q = start_query(spark, url, work, args, fmt)
            seen = 0
            while seen < args.changes:
                if q.exception() is not None or not q.isActive:
                    raise RuntimeError(f"the mirror failed: {q.exception()}")
                seen = sum(changes_of(p) for p in q.recentProgress)
                time.sleep(0.2)
            t_done = time.time()
            flinkish_spark.stop(q, drain=False, timeout=300)
            progress = [p for p in q.recentProgress if changes_of(p)]
            runs[fmt] = report(fmt, progress, t_start, t_done, before, recv_s, timer_file, args)
        spark.stop()
        with psycopg.connect(url, autocommit=True) as conn:
            for fmt in formats:
                conn.execute(f"SELECT pg_drop_replication_slot('flinkish_src_{fmt.replace('/', '_')}')")
                conn.execute(f"DROP PUBLICATION flinkish_src_{fmt.replace('/', '_')}")
    finally:
        pg.stop()
    if len(runs) > 1:
        print("\nside by side: " + ", ".join(f"{f} {r['mirror_changes_per_s']:,.0f}/s ({r['ratio']:.3f}x)" for f, r in runs.items()))
    print("\nwrote", write_results(args.name, {
        "args": vars(args), "load_avg": os.getloadavg(), "changes": args.changes, "write_s": write_s,
        "recvlogical_s": recv_s, "recvlogical_runs_s": recv_runs, "recvlogical_changes_per_s": args.changes / recv_s,
        "runs": runs, **(runs[formats[-1]] if runs else {})}))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
