"""The mirror's throughput on a backlog over many tables, with the per-table work in 1 and in 2 sink tasks, alternating.

Issue 26, target 3: ``flinkish.postgres`` (``tables = 'bench.*'``) -> spread by table over
``parallelism`` tasks (:func:`flinkish_spark.mirror.spread.spread_tables`, what ``flinkish mirror
--parallelism`` does; 1 = no shuffle: the per-table work in the task that reads the slot) ->
``flinkish.delta`` routed by ``{schema}/{table}`` on local disk, 1 s trigger. N tables
(``id int primary key, v bigint, s text``, 20 rows each) are snapshotted once. Then, per round,
the query is stopped (the slot keeps the position), a backlog is written inside the server (a
procedure: ``--txns`` transactions, each updating one row in each of ``--per-txn`` random
tables: ``txns * per_txn`` changes, no client round trips), and the query is started again
with the round's parallelism and ``maxRowsPerTrigger``; the round ends at the first epoch
without rows. Throughput = the backlog's changes / (end of the last epoch with rows - start of
the first). Several rounds (``--rounds 1,2``) run on the same tables and Spark session; but each
table's commit grows with its versions (docs/benchmarks.md), so a later round is slower for that
alone: compare one round per run (fresh tables), runs alternating. The load average is recorded
per round. With ``--timers`` (benchmarks/timers/sitecustomize.py): the sink tasks' prepare
seconds (summed over tasks) and the driver's commit seconds per epoch, and both per changed table.

With ``--rate R --seconds S`` a round is paced instead (target 2, "keeps up"): the query runs
with the round's parallelism and no ``maxRowsPerTrigger`` while a procedure inside the server
commits ``R`` changes/s for ``S`` seconds (each update sets ``v`` to the commit's clock in
microseconds, so lag = the mtime of the first Delta version holding the row - ``v``); the round
ends when the mirror has caught up. Reported: the rate the server reached, lag p50/p99 over the
round and the lag p50 of the first and of the last 30 s (growth).

    python benchmarks/mirror_scaleout.py [--tables 1000] [--rounds 1,2,1,2] [--txns 10000] [--max-rows 6000] [--timers]
    python benchmarks/mirror_scaleout.py --tables 100,1000 --rounds 1,2 --rate 5000,2000 --seconds 120 --sync-commit off --timers
    python benchmarks/mirror_scaleout.py --writer-only --tables 100,1000 --rate 20000 --seconds 15
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import per_table_count, print_table, write_results  # noqa: E402
from mirror_scale import last_epoch_end  # noqa: E402
from multi_table_source import create_tables, percentile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

BURST = """
CREATE OR REPLACE PROCEDURE bench.burst(txns int, tables int, per_txn int, nrows int, base int)
LANGUAGE plpgsql AS $$
DECLARE i int; j int;
BEGIN
  FOR i IN 1..txns LOOP
    FOR j IN 1..per_txn LOOP
      EXECUTE format('UPDATE bench.t_%s SET v = $1 WHERE id = $2', lpad(floor(random() * tables)::int::text, 5, '0'))
        USING base + i, 1 + floor(random() * nrows)::int;
    END LOOP;
    COMMIT;
  END LOOP;
END $$;
CREATE OR REPLACE PROCEDURE bench.paced(rate float8, seconds float8, tables int, per_txn int, nrows int,
                                         sync_commit text DEFAULT 'on')
LANGUAGE plpgsql AS $$
DECLARE t0 float8 := extract(epoch FROM clock_timestamp()); done bigint := 0; ahead float8; j int;
BEGIN
  -- 'off': a COMMIT does not wait for its WAL flush (the WAL writer flushes within
  -- wal_writer_delay, 200 ms); logical decoding still sees a transaction only once flushed.
  PERFORM set_config('synchronous_commit', sync_commit, false);
  WHILE extract(epoch FROM clock_timestamp()) - t0 < seconds LOOP
    FOR j IN 1..per_txn LOOP
      EXECUTE format('UPDATE bench.t_%s SET v = $1 WHERE id = $2', lpad(floor(random() * tables)::int::text, 5, '0'))
        USING (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 1 + floor(random() * nrows)::int;
    END LOOP;
    COMMIT;
    done := done + per_txn;
    ahead := done / rate - (extract(epoch FROM clock_timestamp()) - t0);
    IF ahead > 0.001 THEN PERFORM pg_sleep(ahead); END IF;
  END LOOP;
  RAISE NOTICE 'changes %', done;
END $$;
"""


def paced_round(spark: Any, url: str, dirs: tuple[str, str, str], n: int, p: int,
                args: argparse.Namespace) -> dict[str, Any]:
    """One paced round (see the module docstring): lag figures and the rate reached."""
    import glob

    import psycopg

    import flinkish_spark
    from mirror_scale import versions_visible

    meta, cp, lake = dirs
    load = os.getloadavg()
    q = start(spark, url, meta, cp, lake, p, None, args.trigger)
    time.sleep(5 + 2 * args.trigger)  # the query's first (empty) epochs
    notices: list[str] = []
    t0 = time.time()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("CALL bench.paced(%s, %s, %s, %s, %s, %s)",
                     (rate_for(args, n), args.seconds, n, args.per_txn, args.rows, args.sync_commit))
    t1 = time.time()
    while True:
        progress = q.recentProgress
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        if progress and progress[-1].numInputRows == 0 and last_epoch_end(progress[-1]) > t1:
            break
        time.sleep(0.5)
    flinkish_spark.stop(q, drain=False, timeout=300)
    changes = int(next((m.split()[-1] for m in notices if m.startswith("changes")), "0"))
    lags = sorted((mtime - v / 1e6, v / 1e6) for (_, v), mtime in versions_visible(os.path.join(lake, "bench")).items()
                  if v and t0 <= v / 1e6 <= t1)
    by_time = sorted(lags, key=lambda x: x[1])
    first = [lag for lag, at in by_time if at < t0 + 30]
    last = [lag for lag, at in by_time if at >= t1 - 30]
    busy = [x for x in progress if x.numInputRows]
    lo = last_epoch_end(busy[0]) - busy[0].durationMs["triggerExecution"] / 1000 if busy else t0
    hi = last_epoch_end(busy[-1]) if busy else t1
    timers = timers_between(os.environ.get("FLINKISH_BENCH_TIMERS", ""), lo, hi)
    logs = glob.glob(os.path.join(lake, "bench", "t_*", "_delta_log", "*.json"))
    versions = sum(1 for f in logs if lo <= os.path.getmtime(f) <= hi + 1)
    per_table = ({"tables_changed": versions,
                  "prepare_ms_per_table": round(1000 * timers["prepare_s"] / versions, 2),
                  "commit_ms_per_table": round(1000 * timers["commit_s"] / versions, 2)}
                 if args.timers and versions else {})
    return {**per_table, "parallelism": p, "commit_processes": COMMIT_PROCESSES.get(p, 0), "load": load, "load_end": os.getloadavg(), "rate_asked": rate_for(args, n),
            "sync_commit": args.sync_commit,
            "rate_reached": round(changes / (t1 - t0)), "seconds": round(t1 - t0, 1), "changes": changes,
            "lag_samples": len(lags), "lag_ms_p50": round(1000 * percentile([x for x, _ in lags], 0.5)),
            "lag_ms_p99": round(1000 * percentile([x for x, _ in lags], 0.99)),
            "lag_ms_p50_first_30s": round(1000 * percentile(first, 0.5)),
            "lag_ms_p50_last_30s": round(1000 * percentile(last, 0.5)),
            "epochs": len(busy),
            "batch_ms_p50": round(percentile([x.durationMs["triggerExecution"] for x in busy], 0.5))}


def rate_for(args: argparse.Namespace, n: int) -> float:
    """``--rate``: one rate, or one per ``--tables`` entry ("5000,2000" with "100,1000")."""
    rates = [float(x) for x in str(args.rate).split(",")]
    tables = [int(x) for x in args.tables.split(",")]
    return rates[tables.index(n)] if len(rates) > 1 else rates[0]


def start(spark: Any, url: str, meta: str, cp: str, lake: str, parallelism: int, max_rows: int | None,
          trigger: float) -> Any:
    """``max_rows`` None: the snapshot in one epoch (a bound would read one 20-row table per epoch)."""
    from flinkish_spark.mirror.spread import spread_tables

    reader = (spark.readStream.format("flinkish.postgres").option("uid", "src").option("checkpoint", meta)
              .option("url", url).option("tables", "bench.*").option("rowFormat", ROW_FORMAT[0]))
    if ROUND_DECODE_IN[0]:
        reader = reader.option("decodeIn", ROUND_DECODE_IN[0])
    if max_rows is not None:
        reader = reader.option("maxRowsPerTrigger", str(max_rows))
    if ROUND_SPREAD[0] and parallelism > 1:
        # the source spreads the changes by table itself (what `flinkish mirror` does with decodeIn=sink): no shuffle
        reader = reader.option("spreadChanges", str(parallelism)).option("snapshotPartitions", str(parallelism))
    df = reader.load()
    writer = (spread_tables(df, 1 if ROUND_SPREAD[0] else parallelism).writeStream.format("flinkish.delta").option("uid", "lake")
              .option("checkpoint", meta).option("path", os.path.join(lake, "{schema}", "{table}")))
    if COMMIT_PROCESSES.get(parallelism):
        writer = writer.option("commitProcesses", str(COMMIT_PROCESSES[parallelism]))
    return writer.option("checkpointLocation", cp).trigger(processingTime=f"{trigger} seconds").start()


#: ``--row-format``: the source's rowFormat (``arrow``: what ``flinkish mirror`` sets for Delta and Iceberg targets).
ROW_FORMAT = ["arrow"]

#: ``--decode-in``: the source's decodeIn for the rounds of a parallelism ("2:sink"; the others: the source's default).
DECODE_IN: dict[int, str] = {}
ROUND_DECODE_IN = [""]  # the round's
#: A round "2/sink/spread": the source's spreadChanges instead of the shuffle (spread_tables).
ROUND_SPREAD = [False]

#: ``--commit-processes``: the sink's commitProcesses for the rounds of a parallelism ("2:2": rounds with 2 tasks
#: commit in 2 committer processes; the others in the driver's commit worker).
COMMIT_PROCESSES: dict[int, int] = {}


def timers_between(path: str, lo: float, hi: float) -> dict[str, float]:
    out = {"prepare_s": 0.0, "commit_s": 0.0, "prepare_tasks": 0.0}
    if not os.path.exists(path):
        return out
    for line in open(path):
        t = json.loads(line)
        if lo <= t["start"] < hi and t["name"] in ("sink.prepare", "sink.commit"):
            out["prepare_s" if t["name"] == "sink.prepare" else "commit_s"] += t["s"]
            out["prepare_tasks"] += t["name"] == "sink.prepare"
    return out


def writer_only(url: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The paced writer alone (no mirror, no slot): the rate the server reaches for each
    ``synchronous_commit`` setting, alternating, ``--writer-repeats`` times; and the server backend's CPU."""
    import psycopg

    create_tables(url, n, args.rows, "bigint")
    out = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BURST)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        for rep in range(args.writer_repeats):
            for sync in ("on", "off"):
                notices: list[str] = []
                conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
                cpu0, load, t0 = _cpu_s(pid), os.getloadavg()[0], time.time()
                conn.execute("CALL bench.paced(%s, %s, %s, %s, %s, %s)",
                             (rate_for(args, n), args.seconds, n, args.per_txn, args.rows, sync))
                secs, cpu = time.time() - t0, _cpu_s(pid) - cpu0
                changes = int(next((m.split()[-1] for m in notices if m.startswith("changes")), "0"))
                r = {"tables": n, "repeat": rep, "sync_commit": sync, "rate_asked": rate_for(args, n),
                     "rate_reached": round(changes / secs), "backend_cpu_per_s": round(cpu / secs, 2),
                     "backend_cpu_us_per_change": round(1e6 * cpu / max(changes, 1), 1), "load": load}
                print(json.dumps(r), flush=True)
                out.append(r)
    return {"tables": n, "writer": out}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a local process (the server's backend)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class MachineCpu(threading.Thread):
    """The machine's busy CPU seconds (``/proc/stat``: all cores, every process -- the JVM, the Python workers and
    committers, PostgreSQL) sampled every 0.1 s, so a round's window known only afterwards can be measured: the
    cores busy on average over it. What a second task can add is at most the cores the first left idle."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.tck = os.sysconf("SC_CLK_TCK")

    def busy_s(self) -> float:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v) - v[3] - v[4]) / self.tck  # all but idle and iowait

    def run(self) -> None:
        while True:
            self.samples.append((time.time(), self.busy_s()))
            time.sleep(0.1)

    def cores_busy(self, lo: float, hi: float) -> float:
        inside = [x for x in self.samples if lo <= x[0] <= hi]
        if len(inside) < 2:
            return float("nan")
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        return (b1 - b0) / (t1 - t0)


CPU = MachineCpu()


def run(url: str, n: int, args: argparse.Namespace, work: str) -> dict[str, Any]:
    import glob

    import psycopg

    import flinkish_spark

    create_tables(url, n, args.rows, "bigint")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BURST)
    # per table count: a run over "100,1000" must not start the second mirror on the first one's metadata
    meta, cp, lake = (os.path.join(work, f"{x}-{n}") for x in ("meta", "cp", "lake"))
    spark = flinkish_spark.session(app_name="bench-mirror-scaleout", conf={
        "spark.sql.streaming.numRecentProgressUpdates": "100000", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    t0 = time.time()
    q = start(spark, url, meta, cp, lake, 1, None, args.trigger)
    while len(glob.glob(os.path.join(lake, "bench", "t_*", "_delta_log", f"{0:020d}.json"))) < n:
        if not q.isActive:
            raise RuntimeError(f"the mirror ended during the snapshot: {q.exception()}")
        time.sleep(0.5)
    while not q.recentProgress or q.recentProgress[-1].numInputRows:  # until an epoch without rows
        time.sleep(0.5)
    print(f"{n} tables: snapshot {time.time() - t0:.1f} s", flush=True)
    flinkish_spark.stop(q, drain=False, timeout=300)
    timer_file = os.environ.get("FLINKISH_BENCH_TIMERS", "")
    rounds = []
    for i, spec in enumerate(args.rounds.split(",")):
        # "2" or "2/sink": a round's parallelism and, after the slash, its decodeIn (else --decode-in's)
        p, _, rest = spec.partition("/")
        p = int(p)
        decode_in, _, how = rest.partition("/")
        ROUND_DECODE_IN[0] = decode_in or DECODE_IN.get(p, "")
        ROUND_SPREAD[0] = how == "spread"
        if args.rate:
            rounds.append({"round": i, **paced_round(spark, url, (meta, cp, lake), n, p, args)})
            print(json.dumps(rounds[-1]), flush=True)
            continue
        w0 = time.time()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CALL bench.burst(%s, %s, %s, %s, %s)", (args.txns, n, args.per_txn, args.rows, i * args.txns))
        write_s = time.time() - w0
        load = os.getloadavg()
        q = start(spark, url, meta, cp, lake, p, args.max_rows, args.trigger)
        seen = 0
        while True:
            progress = q.recentProgress
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            if progress[seen:] and any(x.numInputRows for x in progress) and progress[-1].numInputRows == 0:
                break
            time.sleep(0.5)
        flinkish_spark.stop(q, drain=False, timeout=300)
        busy = [x for x in progress if x.numInputRows]
        lo = last_epoch_end(busy[0]) - busy[0].durationMs["triggerExecution"] / 1000
        hi = last_epoch_end(busy[-1])
        # The backlog's changes (numInputRows counts stream rows: with rowFormat=arrow a row is a pack of changes,
        # with json a change or a table's schema row -- the runs before 2026-11-28 divided those).
        changes = args.txns * args.per_txn
        timers = timers_between(timer_file, lo, hi)
        # tables changed = the Delta versions written in the round (one per changed table and epoch)
        logs = glob.glob(os.path.join(lake, "bench", "t_*", "_delta_log", "*.json"))
        tables_changed = sum(1 for f in logs if lo <= os.path.getmtime(f) <= hi + 1)
        r = {"round": i, "parallelism": p, "commit_processes": COMMIT_PROCESSES.get(p, 0), "decode_in": ROUND_DECODE_IN[0] or "source", "spread": "source" if ROUND_SPREAD[0] and p > 1 else "shuffle", "load": load, "write_s": round(write_s, 1), "epochs": len(busy),
             "rows": sum(x.numInputRows for x in busy), "changes": changes, "seconds": round(hi - lo, 1), "throughput": round(changes / (hi - lo)),
             "tables_changed": tables_changed, "cores_busy": round(CPU.cores_busy(lo, hi), 2),
             "batch_ms_p50": round(percentile([x.durationMs["triggerExecution"] for x in busy], 0.5)),
             "add_batch_ms_p50": round(percentile([x.durationMs.get("addBatch", 0) for x in busy], 0.5)),
             "latest_offset_ms_p50": round(percentile([x.durationMs.get("latestOffset", 0) for x in busy], 0.5)),
             **{k: round(v, 2) for k, v in timers.items()}}
        if args.timers and tables_changed:
            r["prepare_ms_per_table"] = round(1000 * timers["prepare_s"] / tables_changed, 2)
            r["commit_ms_per_table"] = round(1000 * timers["commit_s"] / tables_changed, 2)
        print(json.dumps(r), flush=True)
        rounds.append(r)
    spark.stop()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('flinkish_src')")
        conn.execute("DROP PUBLICATION flinkish_src")
    return {"tables": n, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", default="1000")
    ap.add_argument("--rounds", default="1,2,1,2", help="the parallelism of each round, in order (2/sink: and its decodeIn)")
    ap.add_argument("--commit-processes", default="", help="parallelism:commitProcesses,... (e.g. 2:2)")
    ap.add_argument("--decode-in", default="", help="parallelism:decodeIn,... (e.g. 2:sink, 1:source)")
    ap.add_argument("--txns", type=int, default=10000, help="transactions per round's backlog")
    ap.add_argument("--per-txn", type=int, default=3, help="tables changed per transaction")
    ap.add_argument("--rows", type=int, default=20, help="rows per table")
    ap.add_argument("--max-rows", type=int, default=6000, help="the source's maxRowsPerTrigger")
    ap.add_argument("--trigger", type=float, default=1.0)
    ap.add_argument("--row-format", default="arrow", choices=("arrow", "json"),
                    help="the source's rowFormat (arrow: the mirror's own for Delta and Iceberg; json: the runs before "
                         "2026-11-28)")
    ap.add_argument("--timers", action="store_true", help="benchmark-only timers: prepare / commit per changed table")
    ap.add_argument("--rate", default=None, help="paced rounds: changes/s written by the server (one per --tables entry)")
    ap.add_argument("--seconds", type=float, default=120, help="paced rounds: how long")
    ap.add_argument("--sync-commit", default="on", choices=("on", "off"),
                    help="paced rounds: the writer's synchronous_commit")
    ap.add_argument("--writer-only", action="store_true",
                    help="the paced writer alone at --rate for --seconds, synchronous_commit on and off")
    ap.add_argument("--writer-repeats", type=int, default=2)
    ap.add_argument("--name", default="mirror_scaleout", help="results/<name>.json")
    args = ap.parse_args()
    COMMIT_PROCESSES.update({int(a): int(b) for a, b in (x.split(":") for x in args.commit_processes.split(",") if x)})
    ROW_FORMAT[0] = args.row_format
    DECODE_IN.update({int(a): b for a, b in (x.split(":") for x in args.decode_in.split(",") if x)})
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.timers:  # before the JVM starts: Spark's Python workers inherit the environment
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "timers"), os.environ.get("PYTHONPATH", "")])
        os.environ["FLINKISH_BENCH_TIMERS"] = f"/tmp/flinkish-bench-{args.name}-timers-{os.getpid()}.jsonl"
        sys.path.insert(0, os.path.join(HERE, "timers"))
        import importlib

        import sitecustomize  # noqa: F401  (this process started before the variable was set)

        importlib.reload(sitecustomize)
    if args.writer_only:
        results = per_table_count(args.tables, "flinkish-bench-writer-", lambda url, n, work: writer_only(url, n, args))
        print("\nwrote", write_results(args.name, {"args": vars(args), "results": results}))
        return
    CPU.start()
    results = per_table_count(args.tables, "flinkish-bench-scaleout-", lambda url, n, work: run(url, n, args, work))
    print()
    if args.rate:
        print_table(["tables", "round", "parallelism", "load 1 min", "changes/s asked", "reached", "epochs",
                     "batch ms p50", "lag ms p50 / p99", "lag ms p50 first / last 30 s",
                     "prepare / commit ms per changed table"],
                    [(r["tables"], x["round"], x["parallelism"], f"{x['load'][0]:.1f}", x["rate_asked"],
                      x["rate_reached"], x["epochs"], x["batch_ms_p50"], f"{x['lag_ms_p50']} / {x['lag_ms_p99']}",
                      f"{x['lag_ms_p50_first_30s']} / {x['lag_ms_p50_last_30s']}",
                      f"{x.get('prepare_ms_per_table', '')} / {x.get('commit_ms_per_table', '')}")
                     for r in results for x in r["rounds"]])
        print("\nwrote", write_results(args.name, {"args": vars(args), "results": results}))
        return
    rows = [(r["tables"], x["round"], x["parallelism"], f"{x['load'][0]:.1f}", x["rows"], x["epochs"], x["seconds"],
             x["throughput"], x.get("cores_busy", ""), x["tables_changed"], x["batch_ms_p50"],
             x.get("prepare_ms_per_table", ""), x.get("commit_ms_per_table", "")) for r in results for x in r["rounds"]]
    print_table(["tables", "round", "parallelism", "load 1 min", "changes", "epochs", "s", "changes/s",
                 f"cores busy (of {os.cpu_count()})", "tables changed (versions)", "batch ms p50",
                 "prepare ms / changed table (all tasks)", "commit ms / changed table"], rows)
    print("\nwrote", write_results(args.name, {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
