"""latestOffset time and checkpoint bytes for 1k / 10k / 100k splits, on local disk and moto's S3.

Drives the real stream reader of ``flinkish.sequence`` (no Spark job: the
driver-side protocol only) with N splits of one row each: a first epoch that
finishes 99% of the splits, then steady-state epochs of 100 rows each over the 1% live splits. Reports
the median latestOffset time of the steady-state epochs (planning + writing the
checkpoint file + retention) and the size of a checkpoint file.

    python benchmarks/latest_offset_scaling.py [--splits 1000,10000,100000] [--epochs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.types import IntegerType, LongType, StructField, StructType, TimestampType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.connectors.sequence import SequenceDataSource  # noqa: E402
from flinkish_spark.embedded.s3 import local_s3, make_bucket  # noqa: E402


# The sequence schema, built without a SparkSession (DDL parsing needs one).
SEQUENCE_SCHEMA = StructType(
    [StructField("split", IntegerType()), StructField("seq", LongType()), StructField("ts", TimestampType())]
)


def measure(root: str, n: int, epochs: int, endpoint: str | None) -> dict[str, float]:
    # 99% of the splits have one row (finished by the first epoch), 1% a million rows (live).
    live = max(1, n // 100)
    lengths = ["1"] * (n - live) + ["1000000"] * live
    opts = {"uid": f"scale{n}", "checkpoint": root, "rowsPerSplit": ",".join(lengths)}
    if endpoint:
        opts["endpointUrl"] = endpoint
    src = SequenceDataSource(opts)
    reader = src.streamReader(SEQUENCE_SCHEMA)
    t0 = time.perf_counter()
    offset = reader.latestOffset(reader.initialOffset(), ReadMaxRows(n - live))
    first = time.perf_counter() - t0
    reader.commit(offset)
    times = []
    for _ in range(epochs):
        t = time.perf_counter()
        nxt = reader.latestOffset(offset, ReadMaxRows(100))
        times.append(time.perf_counter() - t)
        offset = nxt
    store = reader.store
    size = store.io.size(store.path(offset["ckpt"]))
    return {"first_epoch_s": first, "latest_offset_s": statistics.median(times), "bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", default="1000,10000,100000")
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.splits.split(",")]
    results = []
    with local_s3() as endpoint:
        make_bucket(endpoint, "bench")
        for n in sizes:
            with tempfile.TemporaryDirectory() as d:
                local = measure(f"{d}/meta", n, args.epochs, None)
            s3 = measure("s3://bench/meta", n, args.epochs, endpoint)
            results.append({"splits": n, "local": local, "s3": s3})
    rows = [
        [f"{r['splits']:,}", store, f"{r[store]['first_epoch_s'] * 1000:.0f}", f"{r[store]['latest_offset_s'] * 1000:.1f}", f"{r[store]['bytes']:,}"]
        for r in results
        for store in ("local", "s3")
    ]
    print_table(["splits (99% finished)", "store", "first epoch ms", "latestOffset ms (median)", "checkpoint bytes"], rows)
    print(f"\nresults: {write_results('latest_offset_scaling', {'epochs': args.epochs, 'results': results})}")


if __name__ == "__main__":
    main()
