"""Rows/s of flinkish.sequence -> Spark's parquet sink, against a plain Python source without checkpoints.

Both sources generate the same rows (split int, seq long, ts timestamp) as Arrow
batches, in the same number of epochs, into Spark's built-in parquet sink with
Trigger.AvailableNow on local[2]. Runs alternate (plain, flinkish, plain, ...)
so drift hits both; the table reports the median of each and the overhead.

    python benchmarks/source_throughput.py [--rows 10000000] [--epochs 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

BASE_US = 1_704_067_200_000_000


class PlainPartition(InputPartition):
    def __init__(self, split: int, start: int, end: int) -> None:
        super().__init__((split, start, end))
        self.split, self.start, self.end = split, start, end


class PlainReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The same rows as flinkish.sequence, with offsets held only in Spark's offset log."""

    def __init__(self, options: dict) -> None:
        self.splits = int(options["splits"])
        self.per_split = int(options["rowspersplit"])
        self.max_rows = int(options["maxrowspertrigger"])

    def initialOffset(self) -> dict:
        return {"pos": [0] * self.splits}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        pos = list(start["pos"])
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else sum(self.per_split - p for p in pos)
        share = max(1, budget // self.splits)
        new = [min(self.per_split, p + share) for p in pos]
        return {"pos": new} if new != pos else start

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [PlainPartition(k, s, e) for k, (s, e) in enumerate(zip(start["pos"], end["pos"])) if e > s]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PlainPartition)
        for lo in range(partition.start, partition.end, 1 << 16):
            hi = min(partition.end, lo + (1 << 16))
            seq = np.arange(lo, hi, dtype=np.int64)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.full(hi - lo, partition.split, dtype=np.int32)),
                    pa.array(seq),
                    pa.array(BASE_US + seq * 1_000_000, pa.timestamp("us", tz="UTC")),
                ],
                names=["split", "seq", "ts"],
            )


class PlainSequence(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench.plainsequence"

    def schema(self) -> str:
        return "split int, seq long, ts timestamp"

    def streamReader(self, schema):  # type: ignore[no-untyped-def]
        return PlainReader(dict(self.options))


def run_once(spark, fmt: str, rows: int, epochs: int, work: str) -> float:  # type: ignore[no-untyped-def]
    shutil.rmtree(work, ignore_errors=True)
    per_split = rows // 2
    reader = (
        spark.readStream.format(fmt)
        .option("splits", "2")
        .option("rowsPerSplit", str(per_split))
        .option("maxRowsPerTrigger", str(rows // epochs))
    )
    if fmt == "flinkish.sequence":
        reader = reader.option("uid", "bench").option("checkpoint", f"{work}/meta")
    started = time.perf_counter()
    q = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", f"{work}/out")
        .option("checkpointLocation", f"{work}/cp")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    took = time.perf_counter() - started
    n = spark.read.parquet(f"{work}/out").count()
    assert n == per_split * 2, (fmt, n)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import flinkish_spark

    spark = flinkish_spark.session(app_name="bench-source-throughput")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PlainSequence)
    work = tempfile.mkdtemp(prefix="flinkish-bench-")
    run_once(spark, "bench.plainsequence", 200_000, 2, work)  # warm up JVM and workers
    run_once(spark, "flinkish.sequence", 200_000, 2, work)
    times: dict[str, list[float]] = {"plain python source": [], "flinkish.sequence": []}
    for _ in range(args.repeats):
        times["plain python source"].append(run_once(spark, "bench.plainsequence", args.rows, args.epochs, work))
        times["flinkish.sequence"].append(run_once(spark, "flinkish.sequence", args.rows, args.epochs, work))
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows_out = []
    for k, v in times.items():
        rows_out.append([k, f"{args.rows:,}", args.epochs, f"{med[k]:.2f}", f"{args.rows / med[k]:,.0f}", " ".join(f"{t:.2f}" for t in v)])
    print_table(["source", "rows", "epochs", "median s", "rows/s", "runs (s)"], rows_out)
    overhead = med["flinkish.sequence"] / med["plain python source"] - 1
    print(f"\nflinkish overhead vs plain source: {overhead * 100:+.1f}% (target <= 5%)")
    path = write_results(
        "source_throughput",
        {"rows": args.rows, "epochs": args.epochs, "seconds": times, "median_seconds": med, "overhead": overhead},
    )
    print(f"results: {path}")
    spark.stop()


if __name__ == "__main__":
    main()
