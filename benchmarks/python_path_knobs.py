"""Knobs of the Python path, measured side by side: Arrow batch sizes on both sides of the JVM.

* ``spark.sql.execution.arrow.maxRecordsPerBatch`` (default 10,000): the size of the Arrow
  batches Spark hands to a Python sink's ``write`` (flinkish.parquet) and to ``mapInArrow``;
* the size of the batches a Python source yields (flinkish.sequence: 65,536 rows), here
  varied with a subclass that yields larger batches (registered as ``bench.sequence_big``).

flinkish.sequence -> flinkish.parquet and -> a no-op Python sink, ``--rows`` rows in 10 epochs,
local[2], alternating rounds, medians.

    python benchmarks/python_path_knobs.py [--rows 10000000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402
from sink_end_to_end import noop_sink_class  # noqa: E402

EPOCHS = 10
BIG_BATCH = 1 << 18


def big_batch_sequence() -> Any:
    import numpy as np
    import pyarrow as pa

    from flinkish_spark.connectors.sequence import BASE_EVENT_TIME_US, SequenceDataSource, SequenceReader

    class BigBatchReader(SequenceReader):
        def read(self, split, start: int, end: int) -> Iterator[pa.RecordBatch]:  # type: ignore[no-untyped-def]
            k = int(split.split_id)
            for lo in range(start, end, BIG_BATCH):
                hi = min(end, lo + BIG_BATCH)
                seq = np.arange(lo, hi, dtype=np.int64)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(np.full(hi - lo, k, dtype=np.int32)), pa.array(seq),
                     pa.array(BASE_EVENT_TIME_US + seq * 1_000_000, pa.timestamp("us", tz="UTC"))],
                    names=["split", "seq", "ts"])

    class BigBatchSequence(SequenceDataSource):
        KIND = "bench.sequence_big"

        def create_reader(self, schema):  # type: ignore[no-untyped-def]
            return BigBatchReader()

    return BigBatchSequence


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import flinkish_spark

    spark = flinkish_spark.session(app_name="bench-python-knobs")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(noop_sink_class())
    spark.dataSource.register(big_batch_sequence())
    work = tempfile.mkdtemp(prefix="flinkish-knobs-")

    def run(tag: str, source: str, sink: str, arrow_batch: int) -> float:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch))
        base = f"{work}/{tag}"
        df = (spark.readStream.format(source).option("uid", "seq").option("checkpoint", f"{base}/meta")
              .option("rowsPerSplit", str(args.rows // 2)).option("maxRowsPerTrigger", str(args.rows // EPOCHS)).load())
        w = df.writeStream.format(sink).option("checkpointLocation", f"{base}/cp")
        if sink == "flinkish.parquet":
            w = w.option("uid", "out").option("path", f"{base}/out")
        started = time.perf_counter()
        flinkish_spark.await_finished(w.trigger(availableNow=True).start())
        took = time.perf_counter() - started
        shutil.rmtree(base)
        return took

    variants = {
        "sequence (64k batches) -> flinkish.parquet, maxRecordsPerBatch 10k (defaults)": ("flinkish.sequence", "flinkish.parquet", 10_000),
        "sequence (64k batches) -> flinkish.parquet, maxRecordsPerBatch 100k": ("flinkish.sequence", "flinkish.parquet", 100_000),
        "sequence (256k batches) -> flinkish.parquet, maxRecordsPerBatch 100k": ("bench.sequence_big", "flinkish.parquet", 100_000),
        "sequence (64k batches) -> no-op sink, maxRecordsPerBatch 10k": ("flinkish.sequence", "bench.noop", 10_000),
        "sequence (64k batches) -> no-op sink, maxRecordsPerBatch 100k": ("flinkish.sequence", "bench.noop", 100_000),
        "sequence (256k batches) -> no-op sink, maxRecordsPerBatch 100k": ("bench.sequence_big", "bench.noop", 100_000),
    }
    for name, v in variants.items():
        run(f"warm-{abs(hash(name)) % 1000}", *v)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(args.repeats):
        for name, v in variants.items():
            times[name].append(run(f"r{i}-{abs(hash(name)) % 1000}", *v))
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print_table(["variant", "median s", "rows/s", "runs (s)"],
                [[k, f"{med[k]:.2f}", f"{args.rows / med[k]:,.0f}", " ".join(f"{t:.2f}" for t in v)] for k, v in times.items()])
    print(f"results: {write_results('python_path_knobs', {'rows': args.rows, 'seconds': times, 'median_seconds': med})}")
    spark.stop()


if __name__ == "__main__":
    main()
