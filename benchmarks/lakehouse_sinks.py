"""Lakehouse sinks: flinkish.delta and flinkish.iceberg next to flinkish.parquet, and commit cost vs history.

1. **Throughput** (local disk, local[2], Trigger.AvailableNow, 10 epochs): N rows of
   ``flinkish.sequence`` (split int, seq long, ts timestamp) into ``flinkish.parquet``,
   ``flinkish.delta`` and ``flinkish.iceberg`` (embedded SQLite catalog), runs alternating;
   plus a one-shot ``deltalake.write_deltalake`` and a pyiceberg ``append`` of the same
   rows as one Arrow table (no Spark: what the libraries alone cost).
2. **Commit cost vs history** (moto S3, no Spark): a sink validates the table as before
   each batch (``ensure_table``, untimed), prepares a 100-row file and commits one epoch at
   a time, up to ``--epochs`` (default 500). For epochs 10, 100, 250, 500 (1000, 2000) the
   table shows the commit milliseconds as median of the (up to) 50 commits before the mark /
   mean and maximum of the 100 before it (Delta: a blind append of the next log version, a checkpoint every 10
   versions; Iceberg: ancestry check, one append snapshot with manifest merging and
   snapshot expiry in the same catalog commit).

    python benchmarks/lakehouse_sinks.py [--rows 10000000] [--repeats 1] [--epochs 500] [--skip-throughput] [--skip-commit]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

EPOCHS = 10
SPLITS = 4


def arrow_rows(rows: int) -> Any:
    import pyarrow as pa

    per = rows // SPLITS
    import numpy as np

    split = np.repeat(np.arange(SPLITS, dtype=np.int32), per)
    seq = np.tile(np.arange(per, dtype=np.int64), SPLITS)
    ts = pa.array(1_704_067_200_000_000 + seq * 1000, pa.timestamp("us", "UTC"))
    return pa.table({"split": split, "seq": seq, "ts": ts})


def throughput(rows: int, repeats: int) -> list[list[Any]]:
    import flinkish_spark

    spark = flinkish_spark.session(app_name="bench-lakehouse")
    spark.sparkContext.setLogLevel("ERROR")
    per_split = rows // SPLITS
    results: dict[str, list[float]] = {"flinkish.parquet": [], "flinkish.delta": [], "flinkish.iceberg": [],
                                       "write_deltalake (one shot)": [], "pyiceberg append (one shot)": []}
    # Round 0 is a warm-up with 1 % of the rows (JVM, Python workers, imports), not timed.
    for round_ in range(repeats + 1):
        formats = ["flinkish.parquet", "flinkish.delta", "flinkish.iceberg"]
        for fmt in formats[round_ % 3:] + formats[:round_ % 3]:  # rotate: no sink always runs first
            work = tempfile.mkdtemp(prefix="bench-lh-")
            df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/meta")
                  .option("rowsPerSplit", ",".join([str(per_split if round_ else max(1, per_split // 100))] * SPLITS))
                  .option("maxRowsPerTrigger", str(rows // EPOCHS if round_ else max(1, rows // EPOCHS // 100))).load())
            w = df.writeStream.format(fmt).option("uid", "out").option("checkpointLocation", f"{work}/cp")
            w = w.option("table", "db.t") if fmt == "flinkish.iceberg" else w.option("path", f"{work}/out")
            t0 = time.perf_counter()
            q = w.trigger(availableNow=True).start()
            flinkish_spark.await_finished(q)
            if round_:
                results[fmt].append(time.perf_counter() - t0)
            assert q.exception() is None, q.exception()
            shutil.rmtree(work, ignore_errors=True)
        if not round_:
            continue
        data = arrow_rows(rows)
        import deltalake
        from pyiceberg.catalog.sql import SqlCatalog

        work = tempfile.mkdtemp(prefix="bench-lh-")
        t0 = time.perf_counter()
        deltalake.write_deltalake(f"{work}/delta", data)
        results["write_deltalake (one shot)"].append(time.perf_counter() - t0)
        catalog = SqlCatalog("b", uri=f"sqlite:///{work}/c.db", warehouse=f"file://{work}/wh")
        catalog.create_namespace("db")
        table = catalog.create_table("db.t", schema=data.schema)
        t0 = time.perf_counter()
        table.append(data)
        results["pyiceberg append (one shot)"].append(time.perf_counter() - t0)
        shutil.rmtree(work, ignore_errors=True)
    spark.stop()
    base = rows / statistics.median(results["flinkish.parquet"])
    out = []
    for name, secs in results.items():
        rate = rows / statistics.median(secs)
        out.append([name, f"{statistics.median(secs):.1f}", f"{rate:,.0f}", f"{rate / base:.2f}x",
                    " ".join(f"{s:.1f}" for s in secs)])
    return out


def commit_marks(epochs: int) -> list[int]:
    """The table's columns: commits after which the cost is reported."""
    return [m for m in (10, 100, 250, 500, 1000, 2000) if m <= epochs]


def commit_cost(epochs: int, only: set[str] | None = None) -> list[list[Any]]:
    import pyarrow as pa
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.connectors.iceberg import IcebergSink
    from flinkish_spark.embedded.s3 import local_s3_process, make_bucket, reset
    from flinkish_spark.sink.protocol import PrepareContext

    schema = StructType([StructField("split", IntegerType()), StructField("seq", LongType())])
    batch = pa.RecordBatch.from_pydict({"split": pa.array([0] * 100, pa.int32()), "seq": list(range(100))})
    marks = commit_marks(epochs)
    rows = []
    work = tempfile.mkdtemp(prefix="bench-lh-commit-")
    try:
        # moto in a child process: delta-rs holds the GIL while it waits for S3.
        with local_s3_process() as endpoint:
            reset(endpoint)
            make_bucket(endpoint, "bench")
            opts = {"endpointUrl": endpoint}
            catalog = f"sqlite:///{work}/c.db"
            sinks: dict[str, Callable[[], Any]] = {
                "flinkish.delta": lambda: DeltaSink.at("s3://bench/delta", uid="u", schema=schema, options=opts),
                "flinkish.delta compactEvery=100": lambda: DeltaSink.at("s3://bench/delta-c", uid="u", schema=schema,
                                                                        compact_every=100, options=opts),
                "flinkish.iceberg": lambda: IcebergSink.at("db.t", uid="u", schema=schema, catalog_uri=catalog,
                                                           warehouse="s3://bench/wh", options=opts),
                "flinkish.iceberg retainSnapshots=0": lambda: IcebergSink.at(
                    "db.r", uid="u", schema=schema, catalog_uri=catalog, warehouse="s3://bench/wh", retain_snapshots=0,
                    options=opts),
            }
            for name, make in sinks.items():
                if only and name not in only:
                    continue
                sink = make()
                commit_ms: list[float] = []
                ensure_ms: list[float] = []
                for epoch in range(epochs):
                    t0 = time.perf_counter()
                    sink.ensure_table(False, "bench")  # what the driver does before each batch
                    ensure_ms.append((time.perf_counter() - t0) * 1000)
                    c = sink.prepare(iter([batch]), PrepareContext("u", epoch, 0, 0))
                    t1 = time.perf_counter()
                    assert sink.commit([c], epoch) == "COMMITTED"
                    commit_ms.append((time.perf_counter() - t1) * 1000)
                row: list[Any] = [name]
                for m in marks:
                    # median of the (up to) 50 commits before the mark: the steady per-epoch cost (10
                    # was too few: one slow moto request moved it); mean and max of the 100 (or all)
                    # before it: with the periodic work (Delta checkpoints every 10 versions,
                    # compaction, Iceberg manifest merges every ~100 commits) amortised.
                    last50, last100 = commit_ms[max(0, m - 50):m], commit_ms[max(0, m - 100):m]
                    row.append(f"{statistics.median(last50):.0f} / {statistics.mean(last100):.0f} / {max(last100):.0f}")
                rows.append(row)
                ensure = [f"{statistics.median(ensure_ms[max(0, m - 50):m]):.0f}" for m in marks]
                print(row, "ensure_table median ms at the marks:", ensure, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-commit", action="store_true")
    ap.add_argument("--sinks", default="", help="comma-separated commit-cost rows to run (default: all)")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not args.skip_throughput:
        tp = throughput(args.rows, args.repeats)
        print_table(["pipeline", "seconds (median)", "rows/s", "vs flinkish.parquet", "runs (s)"], tp)
        print(f"results: {write_results('lakehouse_sinks_throughput', {'rows': args.rows, 'throughput': tp})}")
    if not args.skip_commit:
        marks = commit_marks(args.epochs)
        cc = commit_cost(args.epochs, {s for s in args.sinks.split(",") if s})
        print_table(["sink", *[f"commit ms @ {m} epochs (median / mean / max)" for m in marks]], cc)
        print(f"results: {write_results('lakehouse_sinks_commit', {'epochs': args.epochs, 'commit_ms': cc})}")


if __name__ == "__main__":
    main()
