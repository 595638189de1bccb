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
the first). Rounds alternate the parallelism (1, 2, 1, 2, ...) on the same tables and the same
Spark session, so a drift of the machine's load hits both alike; the load average is recorded
per round. With ``--timers`` (benchmarks/timers/sitecustomize.py): the sink tasks' prepare
seconds (summed over tasks) and the driver's commit seconds per epoch, and both per changed table.

    python benchmarks/mirror_scaleout.py [--tables 1000] [--rounds 1,2,1,2] [--txns 10000] [--max-rows 6000] [--timers]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
"""


def start(spark: Any, url: str, meta: str, cp: str, lake: str, parallelism: int, max_rows: int, trigger: float) -> Any:
    from flinkish_spark.mirror.spread import spread_tables

    df = (spark.readStream.format("flinkish.postgres").option("uid", "src").option("checkpoint", meta)
          .option("url", url).option("tables", "bench.*").option("maxRowsPerTrigger", str(max_rows)).load())
    return (spread_tables(df, parallelism).writeStream.format("flinkish.delta").option("uid", "lake")
            .option("checkpoint", meta).option("path", os.path.join(lake, "{schema}", "{table}"))
            .option("checkpointLocation", cp).trigger(processingTime=f"{trigger} seconds").start())


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


def run(url: str, n: int, args: argparse.Namespace, work: str) -> dict[str, Any]:
    import glob

    import psycopg

    import flinkish_spark

    create_tables(url, n, args.rows, "bigint")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BURST)
    meta, cp, lake = (os.path.join(work, x) for x in ("meta", "cp", "lake"))
    spark = flinkish_spark.session(app_name="bench-mirror-scaleout", conf={
        "spark.sql.streaming.numRecentProgressUpdates": "100000", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    t0 = time.time()
    q = start(spark, url, meta, cp, lake, 1, args.max_rows, args.trigger)
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
    for i, p in enumerate(int(x) for x in args.rounds.split(",")):
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
        changes = sum(x.numInputRows for x in busy)
        timers = timers_between(timer_file, lo, hi)
        tables_changed = sum(min(n, x.numInputRows) for x in busy)  # upper bound; refined below from the logs
        logs = [m for m in (os.path.getmtime(f) for f in glob.glob(os.path.join(lake, "bench", "t_*", "_delta_log", "*.json")))
                if lo <= m <= hi + 1]
        tables_changed = len(logs)
        r = {"round": i, "parallelism": p, "load": load, "write_s": round(write_s, 1), "epochs": len(busy),
             "rows": changes, "seconds": round(hi - lo, 1), "throughput": round(changes / (hi - lo)),
             "tables_changed": tables_changed,
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
    ap.add_argument("--rounds", default="1,2,1,2", help="the parallelism of each round, in order")
    ap.add_argument("--txns", type=int, default=10000, help="transactions per round's backlog")
    ap.add_argument("--per-txn", type=int, default=3, help="tables changed per transaction")
    ap.add_argument("--rows", type=int, default=20, help="rows per table")
    ap.add_argument("--max-rows", type=int, default=6000, help="the source's maxRowsPerTrigger")
    ap.add_argument("--trigger", type=float, default=1.0)
    ap.add_argument("--timers", action="store_true", help="benchmark-only timers: prepare / commit per changed table")
    ap.add_argument("--name", default="mirror_scaleout", help="results/<name>.json")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.timers:  # before the JVM starts: Spark's Python workers inherit the environment
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "timers"), os.environ.get("PYTHONPATH", "")])
        os.environ["FLINKISH_BENCH_TIMERS"] = f"/tmp/flinkish-bench-{args.name}-timers-{os.getpid()}.jsonl"
        sys.path.insert(0, os.path.join(HERE, "timers"))
        import importlib

        import sitecustomize  # noqa: F401  (this process started before the variable was set)

        importlib.reload(sitecustomize)
    results = per_table_count(args.tables, "flinkish-bench-scaleout-", lambda url, n, work: run(url, n, args, work))
    rows = [(r["tables"], x["round"], x["parallelism"], f"{x['load'][0]:.1f}", x["rows"], x["epochs"], x["seconds"],
             x["throughput"], x["tables_changed"], x["batch_ms_p50"], x.get("prepare_ms_per_table", ""),
             x.get("commit_ms_per_table", "")) for r in results for x in r["rounds"]]
    print()
    print_table(["tables", "round", "parallelism", "load 1 min", "changes", "epochs", "s", "changes/s",
                 "tables changed (versions)", "batch ms p50", "prepare ms / changed table (all tasks)",
                 "commit ms / changed table"], rows)
    print("\nwrote", write_results(args.name, {"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
