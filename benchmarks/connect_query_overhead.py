"""The fixed cost of one query through Spark Connect vs a Classic driver: start, end, final notification.

A tiny bounded query (flinkish.sequence, 200 rows, one epoch, Trigger.AvailableNow) into
``flinkish.parquet``, into ``foreachBatch(files_sink(...))`` and into an unprotected
``foreachBatch`` that writes nothing, on a Classic session and on two Connect sessions of a
local Connect server in a process of its own (``local[2]``, started like the Classic driver):
"Connect" as ``flinkish_spark.session(remote="local[N]")`` sets it up (its streaming queries
share the server's Python daemons), "Connect, isolated" with Spark's default per-query artifact
isolation (each streaming query starts its own daemons on the server: see
``flinkish_spark.embedded.connect.ARTIFACT_ISOLATION``).
Per run: ``start()`` (the call returns), start to ``await_finished`` returned (the whole
query), and of that the final checkpoint notification (the finish controller's
``notify_all``: a call in the driver on Classic, a one-task Spark job on the server under
Connect). What ``sink_end_to_end.py``'s Connect rows pay outside their triggers.

    python benchmarks/connect_query_overhead.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import flinkish_spark
    import flinkish_spark.finish.controller as controller
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from flinkish_spark.embedded.connect import ARTIFACT_ISOLATION, start_connect_server

    notify_s: list[float] = []
    real_notify = controller.notify_all

    def timed_notify(spark: Any, offsets: Any) -> None:
        t = time.perf_counter()
        real_notify(spark, offsets)
        notify_s.append(time.perf_counter() - t)

    controller.notify_all = timed_notify  # type: ignore[assignment]
    classic = flinkish_spark.session(app_name="bench-connect-overhead")
    classic.sparkContext.setLogLevel("ERROR")
    server = start_connect_server("local[2]")
    try:
        remote = ConnectSession.builder.remote(server.url).config(ARTIFACT_ISOLATION, "false").getOrCreate()
        flinkish_spark.register(remote)
        isolated = ConnectSession.builder.remote(server.url).create()
        flinkish_spark.register(isolated)
        work = tempfile.mkdtemp(prefix="flinkish-bench-")

        def run(spark: Any, sink: str, tag: str) -> tuple[float, float, float]:
            base = f"{work}/{tag}"
            df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{base}/meta")
                  .option("rowsPerSplit", "100,100").load())
            w = df.writeStream
            if sink == "flinkish.parquet":
                w = w.format("flinkish.parquet").option("uid", "out").option("path", f"{base}/out")
            elif sink == "files_sink":
                w = w.foreachBatch(flinkish_spark.files_sink(f"{base}/out", uid="out", checkpoint=f"{base}/sinkmeta"))
            else:
                w = w.foreachBatch(lambda batch_df, batch_id: None)
            notify_s.clear()
            t0 = time.perf_counter()
            q = w.option("checkpointLocation", f"{base}/cp").trigger(availableNow=True).start()
            t1 = time.perf_counter()
            how = flinkish_spark.await_finished(q)
            t2 = time.perf_counter()
            assert how == "finished" and q.exception() is None, (tag, how, q.exception())
            shutil.rmtree(base)
            return t1 - t0, t2 - t0, sum(notify_s)

        sessions = {"Classic": classic, "Connect": remote, "Connect, isolated": isolated}
        sinks = ("flinkish.parquet", "files_sink", "foreachBatch (no-op)")
        for name, spark in sessions.items():  # warm-up
            for sink in sinks:
                run(spark, sink, f"warm-{name}-{sink}")
        got: dict[str, list[tuple[float, float, float]]] = {f"{sink} ({name})": [] for sink in sinks for name in sessions}
        for i in range(args.repeats):
            for sink in sinks:
                for name, spark in sessions.items():
                    got[f"{sink} ({name})"].append(run(spark, sink, f"r{i}-{name}-{sink}"))
        shutil.rmtree(work, ignore_errors=True)
        isolated.stop()
        remote.stop()  # before its server: see sink_end_to_end.py
    finally:
        server.stop()
    med = {k: [statistics.median(x[j] for x in v) for j in range(3)] for k, v in got.items()}
    print(f"\none bounded query of 200 rows, one epoch; medians of {args.repeats} runs (s)")
    print_table(["sink (session)", "start()", "start to end", "of that: final notification", "runs start to end"],
                [[k, f"{m[0]:.2f}", f"{m[1]:.2f}", f"{m[2]:.2f}", " ".join(f"{x[1]:.2f}" for x in got[k])] for k, m in med.items()])
    print(f"results: {write_results('connect_query_overhead', {'runs': got, 'median_s': med})}")
    classic.stop()


if __name__ == "__main__":
    main()
