"""End to end: flinkish.sequence -> flinkish.parquet vs Spark's built-in exactly-once file pipeline.

Same 10 M rows (split int, seq long, ts timestamp), 10 epochs, Trigger.AvailableNow,
local[2], local disk:

* built-in: Spark's streaming Parquet file source (10 pre-written files,
  maxFilesPerTrigger=1) -> Spark's Parquet file sink (with its _spark_metadata log);
* flinkish.sequence -> flinkish.parquet (two-phase commit, decision log);
* flinkish.files -> flinkish.parquet on the same 10 files (the like-for-like input);
* flinkish.sequence -> ``flinkish_spark.files_sink`` (Spark's own Parquet writer prepares,
  flinkish decides and moves the files), and flinkish.files -> files_sink;
* the same flinkish.sequence pipelines (and the unprotected ``foreachBatch`` below) through
  Spark Connect: a local Connect server
  (``local[2]``, in a process of its own, started like the Classic driver) runs them, this
  process is their client; the table reports each one's ratio to its Classic row, in total and
  for the epochs after the first alone. The Connect session is configured as
  ``flinkish_spark.session(remote="local[N]")`` configures its own: its streaming queries share
  the server's Python daemons (``spark.sql.artifact.isolation.enabled`` false on the session).
  With Spark's default (a separate row, "per-query artifact isolation") Spark Connect runs each
  streaming query in a cloned session with its own artifact UUID (``SPARK_JOB_ARTIFACT_UUID``),
  and Spark keys its Python worker daemons by it, so every query starts four new daemons on the
  server (create_data_source, plan_data_source_read, python_streaming_sink_runner,
  write_into_data_source: Python, pyspark and flinkish imports each) in its first epoch, where a
  Classic session reuses the warm ones of earlier queries;
* breakdown rows: flinkish.sequence into Spark's Parquet sink, into a Python sink that
  drops its input (what any Python data source sink costs before writing a byte), and into an
  unprotected ``foreachBatch(lambda df, _: df.write.parquet(...))`` (files_sink without the
  two-phase commit: the reference for its cost).

Runs alternate; the table shows medians and each pipeline's rows/s relative to built-in, and
the summed Spark progress timings (``durationMs``: addBatch, latestOffset, ...) of the median run.
``--rows`` takes a comma list: every size is a separate set of rounds in the same session.

    python benchmarks/sink_end_to_end.py [--rows 10000000,30000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

EPOCHS = 10
CONNECT = "(Spark Connect)"
CONNECT_ISOLATED = "(Spark Connect, per-query artifact isolation)"
CONNECT_ROWS = (f"flinkish.sequence -> flinkish.parquet {CONNECT}", f"flinkish.sequence -> files_sink (Spark writes, 2PC) {CONNECT}",
                f"(breakdown) flinkish.sequence -> foreachBatch df.write.parquet (no exactly-once) {CONNECT}",
                f"flinkish.sequence -> flinkish.parquet {CONNECT_ISOLATED}")


def noop_sink_class():  # type: ignore[no-untyped-def]
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class Writer(DataSourceStreamArrowWriter):
        def write(self, iterator):  # type: ignore[no-untyped-def]
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
            pass

    class Noop(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench.noop"

        def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
            return Writer()

    return Noop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="10000000", help="comma list of sizes, e.g. 10000000,30000000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="", help="comma list of substrings: run only matching pipelines")
    args = ap.parse_args()
    import flinkish_spark

    only = [o for o in args.only.split(",") if o]
    spark = flinkish_spark.session(app_name="bench-sink-e2e")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(noop_sink_class())
    server = remote = remote_isolated = None
    if not only or any(o in name for name in CONNECT_ROWS for o in only):
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        from flinkish_spark.embedded.connect import ARTIFACT_ISOLATION, start_connect_server

        server = start_connect_server("local[2]")
        # Straight from Connect's builder: pyspark's own refuses while this process has a Classic session.
        # As flinkish_spark.session(remote="local[N]") sets up its session: queries share the server's daemons.
        remote = ConnectSession.builder.remote(server.url).config(ARTIFACT_ISOLATION, "false").getOrCreate()
        flinkish_spark.register(remote)
        # Spark's default: every streaming query starts its own Python daemons on the server.
        remote_isolated = ConnectSession.builder.remote(server.url).create()
        flinkish_spark.register(remote_isolated)
    results = {}
    try:
        for i, rows in enumerate(int(r) for r in args.rows.split(",")):
            results[rows] = run_size(spark, remote, remote_isolated, rows, args.repeats, warm=i == 0, only=only)
    finally:
        if server is not None:
            # The client session first: pyspark's exit handler of a Connect client whose server is
            # gone retries its cleanup call for minutes (this process did not exit for 10+ minutes).
            remote_isolated.stop()
            remote.stop()
            server.stop()
    print(f"results: {write_results('sink_end_to_end', {'epochs': EPOCHS, 'sizes': results})}")
    spark.stop()


def run_size(spark, remote, remote_isolated, total_rows: int, repeats: int, warm: bool, only: list[str]) -> dict:  # type: ignore[no-untyped-def]
    import flinkish_spark
    from pyspark.sql import functions as F

    args = types.SimpleNamespace(rows=total_rows)  # the size of this round, as the pipelines read it

    work = tempfile.mkdtemp(prefix="flinkish-bench-")
    inputs = f"{work}/input"
    half = args.rows // 2
    (
        spark.range(args.rows)
        .select(
            (F.col("id") % 2).cast("int").alias("split"),
            (F.col("id") / 2).cast("long").alias("seq"),
        )
        .withColumn("ts", F.timestamp_seconds(F.lit(1_704_067_200) + F.col("seq")))
        .repartition(EPOCHS)
        .write.parquet(inputs)
    )
    schema = "split int, seq long, ts timestamp"

    def sequence_df(tag: str, session=None):  # type: ignore[no-untyped-def]
        return ((session or spark).readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/{tag}/meta")
                .option("rowsPerSplit", str(half)).option("maxRowsPerTrigger", str(args.rows // EPOCHS)).load())

    def sequence_to_spark_parquet(tag: str) -> float:
        return timed(sequence_df(tag).writeStream.format("parquet").option("path", f"{work}/{tag}/out"), f"{work}/{tag}")

    def sequence_to_noop(tag: str) -> float:
        return timed(sequence_df(tag).writeStream.format("bench.noop"), f"{work}/{tag}", check=False)

    def builtin(tag: str) -> float:
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(inputs)
        return timed(df.writeStream.format("parquet").option("path", f"{work}/{tag}/out"), f"{work}/{tag}")

    def flinkish_sequence(tag: str) -> float:
        return timed(sequence_df(tag).writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/{tag}/out"), f"{work}/{tag}")

    def flinkish_files(tag: str) -> float:
        df = (spark.readStream.format("flinkish.files").schema(schema).option("uid", "files")
              .option("checkpoint", f"{work}/{tag}/meta").option("path", inputs).option("bounded", "true")
              .option("maxFilesPerTrigger", "1").load())
        return timed(df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/{tag}/out"), f"{work}/{tag}")

    def files_df(tag: str):  # type: ignore[no-untyped-def]
        return (spark.readStream.format("flinkish.files").schema(schema).option("uid", "files")
                .option("checkpoint", f"{work}/{tag}/meta").option("path", inputs).option("bounded", "true")
                .option("maxFilesPerTrigger", "1").load())

    def sequence_to_files_sink(tag: str, session=None) -> float:  # type: ignore[no-untyped-def]
        fn = flinkish_spark.files_sink(f"{work}/{tag}/out", uid="out", checkpoint=f"{work}/{tag}/sinkmeta")
        return timed(sequence_df(tag, session).writeStream.foreachBatch(fn), f"{work}/{tag}")

    def connect_sequence(tag: str, session=None) -> float:  # type: ignore[no-untyped-def]
        return timed(sequence_df(tag, session or remote).writeStream.format("flinkish.parquet").option("uid", "out")
                     .option("path", f"{work}/{tag}/out"), f"{work}/{tag}")

    def connect_files_sink(tag: str) -> float:
        return sequence_to_files_sink(tag, remote)

    def files_to_files_sink(tag: str) -> float:
        fn = flinkish_spark.files_sink(f"{work}/{tag}/out", uid="out", checkpoint=f"{work}/{tag}/sinkmeta")
        return timed(files_df(tag).writeStream.foreachBatch(fn), f"{work}/{tag}")

    def sequence_to_unprotected_foreach_batch(tag: str, session=None) -> float:  # type: ignore[no-untyped-def]
        out = f"{work}/{tag}/out"
        return timed(sequence_df(tag, session).writeStream.foreachBatch(lambda df, _: df.write.mode("append").parquet(out)),
                     f"{work}/{tag}")

    def timed(writer, base: str, check: bool = True) -> float:  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        q = writer.option("checkpointLocation", f"{base}/cp").trigger(availableNow=True).start()
        # await_finished also waits for the final checkpoint notification (a plain
        # awaitTermination returns while it may still run, and would race the cleanup).
        how = flinkish_spark.await_finished(q)
        took = time.perf_counter() - started
        if q.exception() is not None:
            raise RuntimeError(f"{base}: the query ended {how}: {q.exception()}")
        phases: dict[str, int] = {}
        for p in q.recentProgress:
            for k, v in (p.durationMs or {}).items():
                phases[k] = phases.get(k, 0) + int(v)
        # The epochs after the first: what a long-running query pays per epoch, without its start
        # (under Connect each streaming query starts new Python daemons on the server: see the docstring).
        phases["laterEpochs"] = sum(int((p.durationMs or {}).get("triggerExecution", 0))
                                    for p in q.recentProgress if p.batchId > 0)
        # Query start (planning, Python workers; under Connect the foreachBatch worker process) and end.
        phases["outsideTriggers"] = int(took * 1000) - phases.get("triggerExecution", 0)
        last_phases[0] = phases
        if check:
            n = spark.read.parquet(f"{base}/out").count()
            assert n == args.rows, (base, n)
        shutil.rmtree(base)
        return took

    last_phases: list[dict[str, int]] = [{}]
    builtin_name = "built-in parquet source -> parquet sink (_spark_metadata)"
    unprotected_name = "(breakdown) flinkish.sequence -> foreachBatch df.write.parquet (no exactly-once)"
    pipelines = {
        builtin_name: builtin,
        "flinkish.sequence -> flinkish.parquet": flinkish_sequence,
        "flinkish.files -> flinkish.parquet (same files)": flinkish_files,
        "flinkish.sequence -> files_sink (Spark writes, 2PC)": sequence_to_files_sink,
        "flinkish.files -> files_sink (same files)": files_to_files_sink,
        unprotected_name: sequence_to_unprotected_foreach_batch,
        "(breakdown) flinkish.sequence -> Spark parquet sink": sequence_to_spark_parquet,
        "(breakdown) flinkish.sequence -> no-op Python sink": sequence_to_noop,
    }
    if remote is not None:
        pipelines.update(zip(CONNECT_ROWS, (connect_sequence, connect_files_sink,
                                            lambda tag: sequence_to_unprotected_foreach_batch(tag, remote),
                                            lambda tag: connect_sequence(tag, remote_isolated))))
    pipelines = {k: v for k, v in pipelines.items() if k == builtin_name or not only or any(o in k for o in only)}
    if warm:
        for name, fn in pipelines.items():  # warm up every code path (JVM classes, Python workers)
            fn(f"warm-{abs(hash(name)) % 1000}")
    times: dict[str, list[float]] = {name: [] for name in pipelines}
    phases: dict[str, list[dict[str, int]]] = {name: [] for name in pipelines}
    for i in range(repeats):
        for name, fn in pipelines.items():
            times[name].append(fn(f"run{i}-{len(times[name])}-{abs(hash(name)) % 1000}"))
            phases[name].append(last_phases[0])
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med[builtin_name]
    print(f"\n{total_rows:,} rows, {repeats} rounds")
    table = [[k, f"{med[k]:.2f}", f"{total_rows / med[k]:,.0f}", f"{base / med[k]:.2f}x", " ".join(f"{t:.2f}" for t in v)] for k, v in times.items()]
    print_table(["pipeline", "median s", "rows/s", "vs built-in", "runs (s)"], table)
    median_phases = {k: phases[k][times[k].index(sorted(times[k])[len(times[k]) // 2])] for k in times}
    print("\nSpark progress timings of the median run (ms, summed over epochs):")
    for k, ph in median_phases.items():
        print(f"  {k}: " + ", ".join(f"{n}={v}" for n, v in sorted(ph.items()) if v))
    fs = "flinkish.sequence -> files_sink (Spark writes, 2PC)"
    if fs in med and unprotected_name in med:
        print(f"\nfiles_sink vs unprotected foreachBatch: {med[unprotected_name] / med[fs]:.2f}x (target >= 0.95x); "
              f"vs built-in: {base / med[fs]:.2f}x (target >= 0.8x)")
    if f"{fs} {CONNECT}" in med and f"{unprotected_name} {CONNECT}" in med:
        print(f"files_sink vs unprotected foreachBatch, both through Spark Connect: "
              f"{med[f'{unprotected_name} {CONNECT}'] / med[f'{fs} {CONNECT}']:.2f}x")
    def classic_of(k: str) -> str:
        return k.replace(f" {CONNECT}", "").replace(f" {CONNECT_ISOLATED}", "")

    vs_classic = {k: med[classic_of(k)] / med[k] for k in med
                  if (k.endswith(CONNECT) or k.endswith(CONNECT_ISOLATED)) and classic_of(k) in med}
    later = {k: statistics.median(ph.get("laterEpochs", 0) for ph in phases[k]) / 1000 for k in times}
    starts = {k: statistics.median(t - ph.get("laterEpochs", 0) / 1000 for t, ph in zip(times[k], phases[k])) for k in times}
    vs_classic_later = {k: later[classic_of(k)] / later[k] for k in vs_classic if later[k]}
    for k, ratio in vs_classic.items():
        classic = classic_of(k)
        print(f"{k} vs Classic: {ratio:.2f}x (target >= 0.95x); epochs 2-{EPOCHS} alone: "
              f"{vs_classic_later.get(k, float('nan')):.2f}x ({later[classic]:.2f} s vs {later[k]:.2f} s); "
              f"query start + first epoch: {starts[classic]:.2f} s vs {starts[k]:.2f} s")
    return {"seconds": times, "median_seconds": med, "progress_ms": median_phases,
            "ratio_vs_builtin": {k: base / v for k, v in med.items()}, "connect_vs_classic": vs_classic,
            "later_epochs_seconds": later, "start_and_first_epoch_seconds": starts,
            "connect_vs_classic_later_epochs": vs_classic_later}


if __name__ == "__main__":
    main()
