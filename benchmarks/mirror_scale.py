"""The whole mirror at 10, 100 and 1,000 tables: ``flinkish.postgres`` (``tables = 'bench.*'``) into
``flinkish.delta`` routed by ``{schema}/{table}`` on local disk, in Spark, processing-time trigger.

The end-to-end companion of ``multi_table_source.py`` (which drives the source alone): on an
embedded PostgreSQL, N small tables ``bench.t_<i>`` (``id int primary key, v bigint, s text``,
``--rows`` rows each) are mirrored by one Spark query. The initial snapshot is timed from
``start()`` until every target has its first version. Then a writer process runs two phases of
``--seconds`` each, spread over all tables (each transaction changes one row -- an update or an
insert -- in each of ``--per-txn`` distinct random tables and sets ``v`` to the transaction's
number): first "quiet", ``--quiet-rate`` changes/s (few tables changed per epoch: what an epoch
costs when most tables did not change), then "busy", ``--rate`` changes/s. The query is stopped
once it has caught up (an epoch without rows) or after ``--catch-up`` seconds. Measured per
epoch, after the query stopped:

* ``latestOffset``: Spark's ``durationMs.latestOffset`` (the Python source's call, seen from Spark);
* sink commit: the sink's decision record's mtime to its ``.done`` marker's mtime -- the driver's
  commit of every changed table's Delta version (the executors' prepare is not in it);
* flinkish metadata bytes: the files below the ``checkpoint`` root (source checkpoints,
  table registry, the sink's decision log) written in the epoch (mtime between the previous
  epoch's ``.done`` and this one's); Spark's ``offsets/N`` and ``commits/N`` separately; the Delta
  log bytes (``_delta_log/*.json`` of the targets) as a third column;
* tables changed: the target versions written in the epoch (one per changed table);
* lag: for every (table, transaction) change, the first target version whose added files hold
  the row with ``v`` = the transaction number, its log file's mtime minus the writer's time right
  after ``COMMIT`` returned. A change overwritten by a later one of the same key within one epoch
  never shows (the net change is written), so the count of changes seen is printed too.

Scale-out (issue 26): ``--parallelism 1,2`` runs each table count once per value, side by side in
one run: the stream is spread by table over that many sink tasks
(:func:`flinkish_spark.mirror.spread.spread_tables`, what ``flinkish mirror --parallelism`` does; 1 =
no shuffle, the per-table work in the read task as before). Throughput = the busy phase's changes /
(the last one's visibility - the busy phase's start): the writer's rate while the mirror keeps up,
the mirror's own rate when it falls behind. With ``--timers`` (benchmarks/timers/sitecustomize.py)
the per-changed-table cost: the sink tasks' prepare seconds and the driver's commit seconds per
epoch, each divided by the tables the epoch changed.

    python benchmarks/mirror_scale.py [--tables 10,100] [--seconds 60] [--quiet-seconds 60] [--rate 200]
        [--quiet-rate 6] [--trigger 1] [--parallelism 1,2] [--timers]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import per_table_count, print_table, write_results  # noqa: E402
from multi_table_source import create_tables, percentile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

WRITER = r'''
import json, os, random, sys, time, psycopg
url, tables, rows, per_txn, phases, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6]
rnd = random.Random(7)
next_id = [rows + 1] * tables
committed, seq = [], 0
with psycopg.connect(url, autocommit=True) as conn:
    for seconds, rate in phases:
        t0, done = time.time(), 0
        while time.time() - t0 < seconds:
            seq += 1
            picked = rnd.sample(range(tables), min(per_txn, tables))
            with conn.transaction():
                for i in picked:
                    if rnd.random() < 0.5:
                        conn.execute(f"INSERT INTO bench.t_{i:05d} VALUES (%s, %s, 'new')", (next_id[i], seq))
                        next_id[i] += 1
                    else:
                        conn.execute(f"UPDATE bench.t_{i:05d} SET v = %s WHERE id = %s", (seq, rnd.randint(1, rows)))
            committed.append((seq, time.time(), [f"t_{i:05d}" for i in picked]))
            done += len(picked)
            ahead = done / rate - (time.time() - t0)
            if ahead > 0:
                time.sleep(ahead)
with open(out, "w") as f:
    json.dump(committed, f)
'''


def versions_visible(lake: str) -> dict[tuple[str, int], float]:
    """(table, writer transaction) -> the mtime of the first target version that holds its row."""
    import pyarrow.parquet as pq

    seen: dict[tuple[str, int], float] = {}
    for table_dir in sorted(glob.glob(os.path.join(lake, "t_*"))):
        table = os.path.basename(table_dir)
        for log_file in sorted(glob.glob(os.path.join(table_dir, "_delta_log", "*.json"))):
            mtime = os.path.getmtime(log_file)
            for line in open(log_file).read().splitlines():
                add = json.loads(line).get("add")
                if not add or not add.get("dataChange") or "deletionVector" in add:
                    continue
                for v in pq.read_table(os.path.join(table_dir, add["path"]), columns=["v"]).column("v").to_pylist():
                    if v and seen.get((table, v), mtime + 1) > mtime:
                        seen[(table, v)] = mtime
    return seen


def epoch_metadata(meta: str, cp: str, lake: str, sink_uid: str) -> list[dict[str, Any]]:
    """Per sink epoch: commit seconds (decision -> .done), flinkish/Spark/Delta-log bytes written in it."""
    decisions = os.path.join(meta, "sinks", sink_uid, "decisions")
    epochs = sorted(int(n.split(".")[0]) for n in os.listdir(decisions) if n.endswith(".done"))
    files = [(os.path.getmtime(p), os.path.getsize(p), "sink" if os.path.relpath(p, meta).startswith("sinks") else "source")
             for p in glob.glob(os.path.join(meta, "**", "*"), recursive=True) if os.path.isfile(p)]
    delta_logs = [(os.path.getmtime(p), os.path.getsize(p)) for p in glob.glob(os.path.join(lake, "t_*", "_delta_log", "*.json"))]
    out, previous_done = [], 0.0
    for e in epochs:
        decided = os.path.getmtime(os.path.join(decisions, f"{e:012d}.parquet"))
        done = os.path.getmtime(os.path.join(decisions, f"{e:012d}.done"))
        spark = sum(os.path.getsize(p) for p in (os.path.join(cp, "offsets", str(e)), os.path.join(cp, "commits", str(e)))
                    if os.path.exists(p))
        out.append({"epoch": e, "commit_s": done - decided, "done_at": done,
                    "flinkish_bytes": sum(s for m, s, _ in files if previous_done < m <= done),
                    "source_bytes": sum(s for m, s, k in files if previous_done < m <= done and k == "source"),
                    "sink_bytes": sum(s for m, s, k in files if previous_done < m <= done and k == "sink"),
                    "spark_bytes": spark,
                    "delta_log_bytes": sum(s for m, s in delta_logs if previous_done < m <= done),
                    "tables_changed": sum(1 for m, _ in delta_logs if previous_done < m <= done)})
        previous_done = done
    return out


def wait_caught_up(q: Any, trigger: float, limit: float) -> float | None:
    """Seconds after the writer ended until an epoch read no rows (None: not within ``limit``)."""
    t0 = time.time()
    seen = len(q.recentProgress)
    while time.time() - t0 < limit:
        progress = q.recentProgress
        if len(progress) > seen and progress[-1].numInputRows == 0:
            return round(time.time() - t0, 1)
        if len(progress) > seen and time.time() - t0 > 2 * trigger + 12:  # Spark runs no epoch without new input
            if progress[-1].timestamp and time.time() - last_epoch_end(progress[-1]) > 2 * trigger + 10:
                return round(time.time() - t0, 1)
        time.sleep(0.5)
    return None


def last_epoch_end(p: Any) -> float:
    from datetime import datetime

    start = datetime.strptime(p.timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp() - time.timezone
    return start + (p.durationMs or {}).get("triggerExecution", 0) / 1000


def timers_per_epoch(path: str, epochs: list[dict[str, Any]], since: float) -> None:
    """Sum the timer lines (``sink.prepare`` of every task, ``sink.commit``) into the epoch whose sink
    commit ended next after the line's end (an epoch's prepares and commit end before its ``.done``)."""
    if not os.path.exists(path):
        return
    for e in epochs:
        e["prepare_s"], e["commit_timer_s"], e["prepare_tasks"] = 0.0, 0.0, 0
    dones = [(e["done_at"], e) for e in epochs]
    for line in open(path):
        t = json.loads(line)
        if t["name"] not in ("sink.prepare", "sink.commit") or t["start"] < since:  # an earlier run's
            continue
        e = next((e for done, e in dones if t["end"] <= done + 0.05), None)
        if e is None:
            continue
        if t["name"] == "sink.prepare":
            e["prepare_s"] += t["s"]
            e["prepare_tasks"] += 1
        else:
            e["commit_timer_s"] += t["s"]


def run_one(url: str, n: int, args: argparse.Namespace, work: str, parallelism: int) -> dict[str, Any]:
    import psycopg

    import flinkish_spark
    from flinkish_spark.mirror.spread import spread_tables

    create_tables(url, n, args.rows, "bigint")
    meta, cp, lake = (os.path.join(work, f"{x}-{n}-p{parallelism}") for x in ("meta", "cp", "lake"))
    since = time.time()
    spark = flinkish_spark.session(app_name=f"bench-mirror-{n}", conf={
        "spark.sql.streaming.numRecentProgressUpdates": "100000", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    src = f"src{n}p{parallelism}"
    df = (spark.readStream.format("flinkish.postgres").option("uid", src).option("checkpoint", meta)
          .option("url", url).option("tables", "bench.*").option("retainCheckpoints", "1000000").load())
    df = spread_tables(df, parallelism)
    t0 = time.time()
    q = (df.writeStream.format("flinkish.delta").option("uid", "lake").option("checkpoint", meta)
         .option("path", os.path.join(lake, "{schema}", "{table}")).option("retainDecisions", "1000000")
         .option("checkpointLocation", cp).trigger(processingTime=f"{args.trigger} seconds").start())
    first_versions = os.path.join(lake, "bench", "t_*", "_delta_log", f"{0:020d}.json")
    while len(glob.glob(first_versions)) < n:
        if q.exception() is not None or not q.isActive:
            raise RuntimeError(f"the mirror ended during the snapshot: {q.exception()}")
        time.sleep(0.5)
    snapshot_s = time.time() - t0
    snapshot_epochs = len(q.recentProgress)
    print(f"{n} tables, parallelism {parallelism}: snapshot {snapshot_s:.1f} s in {snapshot_epochs} epochs", flush=True)
    time.sleep(2 * args.trigger)
    load_busy = os.getloadavg()
    phases = [(args.quiet_seconds, args.quiet_rate), (args.seconds, args.rate)]
    committed_file = os.path.join(work, f"committed-{n}.json")
    phase_start = time.time()
    subprocess.run([sys.executable, "-c", WRITER, url, str(n), str(args.rows), str(args.per_txn), json.dumps(phases),
                    committed_file], check=True)
    caught_up = wait_caught_up(q, args.trigger, args.catch_up)
    end = flinkish_spark.stop(q, drain=False, timeout=300)
    progress = [p for p in q.recentProgress]
    spark.stop()
    with psycopg.connect(url, autocommit=True) as conn:  # a stop without drain keeps the slot: not needed here
        conn.execute(f"SELECT pg_drop_replication_slot('flinkish_{src}')")
        conn.execute(f"DROP PUBLICATION flinkish_{src}")
        conn.execute("DROP SCHEMA bench CASCADE")  # the next run creates its tables anew

    committed = json.load(open(committed_file))
    busy_from = next((c[1] for c in committed if c[1] - phase_start >= args.quiet_seconds), float("inf"))
    visible = versions_visible(os.path.join(lake, "bench"))
    lags: dict[str, list[float]] = {"busy": [], "quiet": []}
    changes = 0
    for seq, at, tables in committed:
        for t in tables:
            changes += 1
            if (t, seq) in visible:
                lags["quiet" if at < busy_from else "busy"].append(visible[(t, seq)] - at)
    epochs = epoch_metadata(meta, cp, os.path.join(lake, "bench"), "lake")
    timers_per_epoch(os.environ.get("FLINKISH_BENCH_TIMERS", ""), epochs, since)
    busy_seen = [visible[(t, seq)] for seq, at, tables in committed if at >= busy_from for t in tables
                 if (t, seq) in visible]
    busy_changes = sum(len(tables) for _, at, tables in committed if at >= busy_from)
    busy_writer_s = max((at for _, at, _ in committed), default=busy_from) - busy_from
    latest = {p.batchId: (p.durationMs or {}).get("latestOffset", 0) / 1000 for p in progress}
    add_batch = {p.batchId: (p.durationMs or {}).get("addBatch", 0) / 1000 for p in progress}
    trigger = {p.batchId: (p.durationMs or {}).get("triggerExecution", 0) / 1000 for p in progress}
    rows = {p.batchId: p.numInputRows for p in progress}
    for e in epochs:
        e["latest_offset_s"] = latest.get(e["epoch"])
        e["rows"] = rows.get(e["epoch"])
        e["add_batch_s"], e["trigger_s"] = add_batch.get(e["epoch"]), trigger.get(e["epoch"])
        e["phase"] = "snapshot" if e["done_at"] < phase_start else "quiet" if e["done_at"] < busy_from else "busy"
    result: dict[str, Any] = {"tables": n, "parallelism": parallelism, "load_busy_start": load_busy,
                              "load_end": os.getloadavg(), "busy_changes": busy_changes,
                              "writer_rate": round(busy_changes / busy_writer_s) if busy_writer_s else None,
                              "throughput": round(busy_changes / (max(busy_seen) - busy_from)) if busy_seen else None,
                              "snapshot_s": round(snapshot_s, 1), "snapshot_epochs": snapshot_epochs,
                              "changes": changes, "caught_up_s": caught_up, "end": str(end), "phases": {}}
    for phase in ("quiet", "busy"):
        es = [e for e in epochs if e["phase"] == phase and e["rows"]]
        lo = [e["latest_offset_s"] for e in es if e["latest_offset_s"] is not None]
        commit = [e["commit_s"] for e in es]
        lag = lags[phase]
        result["phases"][phase] = {
            "epochs": len(es),
            "latest_offset_ms_p50": round(1000 * percentile(lo, 0.5)), "latest_offset_ms_p99": round(1000 * percentile(lo, 0.99)),
            "commit_ms_p50": round(1000 * percentile(commit, 0.5)), "commit_ms_p99": round(1000 * percentile(commit, 0.99)),
            "add_batch_ms_p50": round(1000 * percentile([e["add_batch_s"] or 0.0 for e in es], 0.5)),
            "batch_ms_p50": round(1000 * percentile([e["trigger_s"] or 0.0 for e in es], 0.5)),
            "tables_changed_p50": round(percentile([float(e["tables_changed"]) for e in es], 0.5)),
            "flinkish_bytes_p50": round(percentile([e["flinkish_bytes"] for e in es], 0.5)),
            "source_bytes_p50": round(percentile([e["source_bytes"] for e in es], 0.5)),
            "sink_bytes_p50": round(percentile([e["sink_bytes"] for e in es], 0.5)),
            "spark_bytes_p50": round(percentile([e["spark_bytes"] for e in es], 0.5)),
            "delta_log_bytes_p50": round(percentile([e["delta_log_bytes"] for e in es], 0.5)),
            "rows_per_epoch_p50": round(percentile([float(e["rows"]) for e in es], 0.5)),
            "lag_ms_p50": round(1000 * percentile(lag, 0.5)), "lag_ms_p99": round(1000 * percentile(lag, 0.99)),
            "lag_samples": len(lag),
        }
        if args.timers:
            per = [(e["prepare_s"] / e["tables_changed"], e["commit_timer_s"] / e["tables_changed"])
                   for e in es if e["tables_changed"]]
            result["phases"][phase]["prepare_ms_per_table_p50"] = round(1000 * percentile([a for a, _ in per], 0.5), 2)
            result["phases"][phase]["commit_ms_per_table_p50"] = round(1000 * percentile([b for _, b in per], 0.5), 2)
            result["phases"][phase]["prepare_tasks_p50"] = percentile([float(e["prepare_tasks"]) for e in es], 0.5)
        if phase == "busy" and lag:  # growth: the lag of the busy phase's first 30 s against its last 30 s
            first = [visible[(t, seq)] - at for seq, at, tables in committed if busy_from <= at < busy_from + 30
                     for t in tables if (t, seq) in visible]
            last = [visible[(t, seq)] - at for seq, at, tables in committed
                    if at >= busy_from + busy_writer_s - 30 for t in tables if (t, seq) in visible]
            result["phases"][phase]["lag_ms_p50_first_30s"] = round(1000 * percentile(first, 0.5))
            result["phases"][phase]["lag_ms_p50_last_30s"] = round(1000 * percentile(last, 0.5))
    result["epochs"] = epochs
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", default="10,100,1000")
    ap.add_argument("--seconds", type=float, default=60, help="length of the busy phase (and of the quiet one)")
    ap.add_argument("--quiet-seconds", type=float, default=None, help="length of the quiet phase (default --seconds)")
    ap.add_argument("--parallelism", default="1", help="sink tasks, e.g. 1,2: each table count runs once per value")
    ap.add_argument("--timers", action="store_true", help="benchmark-only timers: prepare / commit per changed table")
    ap.add_argument("--name", default="mirror_scale", help="results/<name>.json")
    ap.add_argument("--rate", type=float, default=200.0, help="changes/s over all tables in the busy phase")
    ap.add_argument("--quiet-rate", type=float, default=6.0, help="changes/s in the quiet phase")
    ap.add_argument("--per-txn", type=int, default=3, help="tables changed per transaction")
    ap.add_argument("--rows", type=int, default=20, help="rows per table at the start")
    ap.add_argument("--trigger", type=float, default=1.0, help="processing-time trigger, seconds")
    ap.add_argument("--catch-up", type=float, default=600, help="at most this long waiting for the mirror to catch up")
    args = ap.parse_args()
    if args.quiet_seconds is None:
        args.quiet_seconds = args.seconds
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.timers:  # before the JVM starts: Spark's Python workers inherit the environment
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "timers"), os.environ.get("PYTHONPATH", "")])
        os.environ["FLINKISH_BENCH_TIMERS"] = f"/tmp/flinkish-bench-{args.name}-timers-{os.getpid()}.jsonl"
        if os.path.exists(os.environ["FLINKISH_BENCH_TIMERS"]):
            os.remove(os.environ["FLINKISH_BENCH_TIMERS"])
        sys.path.insert(0, os.path.join(HERE, "timers"))
        import importlib

        import sitecustomize  # noqa: F401  (this process started before the variable was set)

        importlib.reload(sitecustomize)
    load = os.getloadavg()
    results = per_table_count(args.tables, "flinkish-bench-mirror-", lambda url, n, work: [
        run_one(url, n, args, work, int(p)) for p in args.parallelism.split(",")])
    results = [r for rs in results for r in rs]  # type: ignore[union-attr]
    print(f"\nmirror flinkish.postgres (tables=bench.*) -> flinkish.delta {{schema}}/{{table}}, local disk, "
          f"{args.trigger:g} s trigger, {args.rows} rows per table, {args.per_txn} tables per transaction; "
          f"{args.seconds:g} s at {args.quiet_rate:g} changes/s (quiet), then {args.seconds:g} s at {args.rate:g} (busy); "
          f"load average at start {load[0]:.1f} on {os.cpu_count()} cpus\n")
    rows = []
    for r in results:
        for phase, p in r["phases"].items():
            rows.append((r["tables"], r["parallelism"], r["throughput"], r["snapshot_s"], phase, p["epochs"], p["rows_per_epoch_p50"],
                         f"{p['latest_offset_ms_p50']} / {p['latest_offset_ms_p99']}",
                         f"{p['commit_ms_p50']} / {p['commit_ms_p99']}", p["add_batch_ms_p50"], p["batch_ms_p50"],
                         p["tables_changed_p50"],
                         f"{p['flinkish_bytes_p50']} ({p['source_bytes_p50']} + {p['sink_bytes_p50']})", p["spark_bytes_p50"],
                         p["delta_log_bytes_p50"], f"{p['lag_ms_p50']} / {p['lag_ms_p99']}", p["lag_samples"]))
    print_table(["tables", "parallelism", "busy changes/s seen", "snapshot s", "phase", "epochs", "rows/epoch", "latestOffset ms p50/p99",
                 "sink commit ms p50/p99", "addBatch ms p50", "batch ms p50", "tables changed/epoch", "flinkish B/epoch (source + sink)", "Spark B/epoch", "Delta log B/epoch", "lag ms p50/p99",
                 "changes seen"], rows)
    print("\nwrote", write_results(args.name, {"args": vars(args), "load_at_start": load, "results": results}))


if __name__ == "__main__":
    main()
