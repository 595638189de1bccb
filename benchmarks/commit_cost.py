"""Commit cost per epoch on S3 (moto's server): requests and milliseconds for 2, 16, 64 writer partitions.

Each writer partition prepares one staged Parquet file (as ``flinkish.parquet``'s
executors do); then the driver-side ``commit_epoch`` runs: decision record, making
files visible, done marker, cleanup of the epoch's staging, retention. HTTP requests
are counted at the server and split into *decision log* requests (below the sink's
metadata root) and *data* requests (below the output path).

A second measurement runs what Spark runs on the driver for each batch of
``writeStream.format("flinkish.parquet")``: ``streamWriter`` (schema, query and pending
checks) and the writer's ``commit`` (lease renewal, control files, ``commit_epoch``,
retention), from a writer unpickled per batch as in Spark's commit worker.

    python benchmarks/commit_cost.py [--partitions 2,16,64] [--epochs 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import statistics
import sys
import time
import uuid

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.connectors.parquet_sink import ParquetSink, ParquetSinkDataSource  # noqa: E402
from flinkish_spark.sink.datasource import PreparedMessage  # noqa: E402
from flinkish_spark.io.fileio import FileIO  # noqa: E402
from flinkish_spark.sink.committer import commit_epoch  # noqa: E402
from flinkish_spark.sink.decisions import DecisionLog  # noqa: E402
from flinkish_spark.sink.protocol import PrepareContext  # noqa: E402
from flinkish_spark.embedded.s3 import local_s3, make_bucket  # noqa: E402


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
            # The whole driver side of a batch, as Spark runs it.
            source = ParquetSinkDataSource({"uid": "out", "path": f"s3://bench/w-{run}", "checkpoint": f"s3://bench/wmeta-{run}",
                                            "endpointUrl": endpoint, "checkpointLocation": f"/tmp/flinkish-bench-cp-{run}"})
            whole = []
            for epoch in range(args.epochs):
                batch_source = pickle.loads(pickle.dumps(source))
                sink_w = batch_source.sink(schema)
                messages = [PreparedMessage(sink_w.prepare(iter([batch]), PrepareContext("out", epoch, p, 0)), p, 0) for p in range(n)]
                counter.lines.clear()
                t = time.perf_counter()
                writer = pickle.loads(pickle.dumps(batch_source.streamWriter(schema, False)))
                writer.commit(messages, epoch)
                whole.append(((time.perf_counter() - t) * 1000, counter.count(f"wmeta-{run}/"), counter.count(f"w-{run}")))
            results.append({
                "partitions": n,
                "ms": statistics.median(e[0] for e in per_epoch),
                "decision_requests": statistics.median(e[1] for e in per_epoch),
                "data_requests": statistics.median(e[2] for e in per_epoch),
                "batch_ms": statistics.median(e[0] for e in whole),
                "batch_metadata_requests": statistics.median(e[1] for e in whole),
                "batch_data_requests": statistics.median(e[2] for e in whole),
            })
    rows = [[r["partitions"], f"{r['ms']:.0f}", r["decision_requests"], r["data_requests"], f"{r['data_requests'] / r['partitions']:.1f}",
             f"{r['batch_ms']:.0f}", r["batch_metadata_requests"], r["batch_data_requests"]] for r in results]
    print_table(["writer partitions", "commit_epoch ms", "decision-log requests", "data requests", "data requests / file",
                 "whole batch ms", "whole batch metadata requests", "whole batch data requests"], rows)
    print(f"\nresults: {write_results('commit_cost', {'epochs': args.epochs, 'results': results})}")


if __name__ == "__main__":
    main()
