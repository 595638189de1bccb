"""Finishing latency: last commit -> query end (1 s / 10 s / 60 s triggers), and drain latency.

*Termination*: a bounded ``flinkish.sequence`` -> ``flinkish.parquet`` query with a
processing-time trigger. The final epoch's commit time is the end of its trigger
(progress ``timestamp`` + ``durationMs.triggerExecution``: Spark's commit log is written
inside it); the end is when ``await_finished`` returns. Spark alone never ends such a
query; the trigger interval is printed next to the latency for scale.

*Drain*: an unbounded sequence with a 10 s trigger; ``stop(drain=True)`` is called at a
random moment after the first batch. Reported: call -> source FINISHED (its drain
checkpoint written) and call -> query ended.

    python benchmarks/finish_latency.py [--intervals 1,10,60] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

import flinkish_spark  # noqa: E402
from flinkish_spark.checkpoint.store import SourceCheckpointStore  # noqa: E402
from flinkish_spark.io.fileio import FileIO  # noqa: E402


def _commit_time(progress) -> float:
    started = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
    return started + progress.durationMs["triggerExecution"] / 1000


def _query(spark, work: str, trigger: str, **source: str):
    r = spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/meta")
    for k, v in source.items():
        r = r.option(k, v)
    return (r.load().writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/out")
            .option("checkpointLocation", f"{work}/cp").trigger(processingTime=trigger).start())


def termination(spark, interval: int) -> float:
    work = tempfile.mkdtemp(prefix="flinkish-bench-")
    try:
        q = _query(spark, work, f"{interval} seconds", rowsPerSplit="20000,5000,12000", maxRowsPerTrigger="25000")
        end = flinkish_spark.await_finished(q, timeout=interval * 10 + 120)
        ended = time.time()
        assert end == "finished", end
        final = next(p for p in q.recentProgress if all('"FINISHED"' in s.endOffset for s in p.sources))
        return ended - _commit_time(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def drain(spark, interval: int) -> tuple[float, float]:
    work = tempfile.mkdtemp(prefix="flinkish-bench-")
    try:
        q = _query(spark, work, f"{interval} seconds", splits="2", rowsPerSecond="1000")
        while q.lastProgress is None:
            time.sleep(0.05)
        time.sleep(random.uniform(0, interval))
        called = time.time()
        end = flinkish_spark.stop(q, drain=True, timeout=interval * 5 + 120)
        ended = time.time()
        assert end == "drained", end
        latest = SourceCheckpointStore(FileIO.for_url(f"{work}/meta"), f"{work}/meta", "seq", "").latest()
        assert latest is not None and latest.status == "FINISHED"
        return latest.created_ms / 1000 - called, ended - called
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="1,10,60")
    parser.add_argument("--drain-interval", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    spark = flinkish_spark.session(app_name="flinkish-bench-finish")
    spark.sparkContext.setLogLevel("ERROR")
    termination(spark, 1)  # warm-up: JVM, Python workers

    rows, results = [], {"termination": [], "drain": {}}
    for interval in (int(x) for x in args.intervals.split(",")):
        lat = [termination(spark, interval) for _ in range(args.repeat)]
        results["termination"].append({"trigger_s": interval, "latency_s": lat})
        rows.append([f"{interval} s", f"{statistics.median(lat):.2f}", f"{max(lat):.2f}", f"{statistics.median(lat) / interval:.3f}"])
    print("Last commit -> query ended (bounded sequence -> flinkish.parquet, local[2])")
    print_table(["trigger", "median s", "max s", "median / interval"], rows)

    d = [drain(spark, args.drain_interval) for _ in range(args.repeat)]
    results["drain"] = {"trigger_s": args.drain_interval, "to_finished_s": [x[0] for x in d], "to_ended_s": [x[1] for x in d]}
    print(f"\nstop(drain=True) with a {args.drain_interval} s trigger, called at a random moment")
    print_table(["run", "call -> FINISHED s", "call -> ended s"], [[i + 1, f"{a:.2f}", f"{b:.2f}"] for i, (a, b) in enumerate(d)])
    print("\nresults:", write_results("finish_latency", results))
    spark.stop()


if __name__ == "__main__":
    main()
