"""End to end: flinkish.sequence -> flinkish.parquet vs Spark's built-in exactly-once file pipeline.

Same 10 M rows (split int, seq long, ts timestamp), 10 epochs, Trigger.AvailableNow,
local[2], local disk:

* built-in: Spark's streaming Parquet file source (10 pre-written files,
  maxFilesPerTrigger=1) -> Spark's Parquet file sink (with its _spark_metadata log);
* flinkish.sequence -> flinkish.parquet (two-phase commit, decision log);
* flinkish.files -> flinkish.parquet on the same 10 files (the like-for-like input);
* breakdown rows: flinkish.sequence into Spark's Parquet sink, and into a Python sink that
  drops its input (what any Python data source sink costs before writing a byte).

Runs alternate; the table shows medians and each pipeline's rows/s relative to built-in.

    python benchmarks/sink_end_to_end.py [--rows 10000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

EPOCHS = 10


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
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import flinkish_spark
    from pyspark.sql import functions as F

    spark = flinkish_spark.session(app_name="bench-sink-e2e")
    spark.sparkContext.setLogLevel("ERROR")
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

    spark.dataSource.register(noop_sink_class())

    def sequence_df(tag: str):  # type: ignore[no-untyped-def]
        return (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/{tag}/meta")
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

    def timed(writer, base: str, check: bool = True) -> float:  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        q = writer.option("checkpointLocation", f"{base}/cp").trigger(availableNow=True).start()
        # await_finished also waits for the final checkpoint notification (a plain
        # awaitTermination returns while it may still run, and would race the cleanup).
        flinkish_spark.await_finished(q)
        took = time.perf_counter() - started
        if check:
            n = spark.read.parquet(f"{base}/out").count()
            assert n == args.rows, (base, n)
        shutil.rmtree(base)
        return took

    pipelines = {
        "built-in parquet source -> parquet sink (_spark_metadata)": builtin,
        "flinkish.sequence -> flinkish.parquet": flinkish_sequence,
        "flinkish.files -> flinkish.parquet (same files)": flinkish_files,
        "(breakdown) flinkish.sequence -> Spark parquet sink": sequence_to_spark_parquet,
        "(breakdown) flinkish.sequence -> no-op Python sink": sequence_to_noop,
    }
    for name, fn in pipelines.items():  # warm up every code path (JVM classes, Python workers)
        fn(f"warm-{abs(hash(name)) % 1000}")
    times: dict[str, list[float]] = {name: [] for name in pipelines}
    for i in range(args.repeats):
        for name, fn in pipelines.items():
            times[name].append(fn(f"run{i}-{len(times[name])}-{abs(hash(name)) % 1000}"))
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["built-in parquet source -> parquet sink (_spark_metadata)"]
    rows = [[k, f"{med[k]:.2f}", f"{args.rows / med[k]:,.0f}", f"{base / med[k]:.2f}x", " ".join(f"{t:.2f}" for t in v)] for k, v in times.items()]
    print_table(["pipeline", "median s", "rows/s", "vs built-in", "runs (s)"], rows)
    ratio = base / med["flinkish.sequence -> flinkish.parquet"]
    print(f"\nflinkish.sequence -> flinkish.parquet: {ratio:.2f}x the built-in rows/s (target >= 0.8x)")
    print(f"results: {write_results('sink_end_to_end', {'rows': args.rows, 'epochs': EPOCHS, 'seconds': times, 'median_seconds': med, 'ratio_vs_builtin': ratio})}")
    spark.stop()


if __name__ == "__main__":
    main()
