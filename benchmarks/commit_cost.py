"""Commit cost per epoch on S3 (moto's server): requests and milliseconds for 2, 16, 64 writer partitions.

Each writer partition prepares one staged Parquet file (as ``flinkish.parquet``'s
executors do); then the driver-side ``commit_epoch`` runs: decision record, making
files visible, done marker, cleanup of the epoch's staging, retention. HTTP requests
are counted at the server and split into *decision log* requests (below the sink's
metadata root) and *data* requests (below the output path).

    python benchmarks/commit_cost.py [--partitions 2,16,64] [--epochs 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.connectors.parquet_sink import ParquetSink  # noqa: E402
from flinkish_spark.io.fileio import FileIO  # noqa: E402
from flinkish_spark.sink.committer import commit_epoch  # noqa: E402
from flinkish_spark.sink.decisions import DecisionLog  # noqa: E402
from flinkish_spark.sink.protocol import PrepareContext  # noqa: E402
from flinkish_spark.testing.s3 import local_s3, make_bucket  # noqa: E402


class RequestCounter(logging.Handler):
    """Counts the requests moto's server logs, by path prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def count(self, marker: str) -> int:
        return sum(1 for line in self.lines if marker in line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", default="2,16,64")
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    schema = StructType([StructField("id", LongType())])
    batch = pa.RecordBatch.from_pydict({"id": pa.array(range(1000), pa.int64())})
    results = []
    with local_s3() as endpoint:
        make_bucket(endpoint, "bench")
        counter = RequestCounter()
        werkzeug = logging.getLogger("werkzeug")
        werkzeug.setLevel(logging.INFO)
        werkzeug.addHandler(counter)
        io = FileIO.for_url("s3://bench", {"endpoint_url": endpoint})
        for n in (int(p) for p in args.partitions.split(",")):
            run = uuid.uuid4().hex[:6]
            sink = ParquetSink(io, f"s3://bench/out-{run}", "out", schema, (), 1_000_000, 1 << 30, "snappy")
            log = DecisionLog(io, f"s3://bench/meta-{run}", "out")
            per_epoch = []
            for epoch in range(args.epochs):
                prepared = [sink.prepare(iter([batch]), PrepareContext("out", epoch, p, 0)) for p in range(n)]
                counter.lines.clear()
                t = time.perf_counter()
                commit_epoch(sink, log, epoch, prepared, run_id=run)
                log.retain(10, epoch)
                ms = (time.perf_counter() - t) * 1000
                per_epoch.append((ms, counter.count(f"meta-{run}/"), counter.count(f"out-{run}")))
            results.append({
                "partitions": n,
                "ms": statistics.median(e[0] for e in per_epoch),
                "decision_requests": statistics.median(e[1] for e in per_epoch),
                "data_requests": statistics.median(e[2] for e in per_epoch),
            })
    rows = [[r["partitions"], f"{r['ms']:.0f}", r["decision_requests"], r["data_requests"], f"{r['data_requests'] / r['partitions']:.1f}"] for r in results]
    print_table(["writer partitions", "commit ms (median)", "decision-log requests", "data requests", "data requests / file"], rows)
    print(f"\nresults: {write_results('commit_cost', {'epochs': args.epochs, 'results': results})}")


if __name__ == "__main__":
    main()
