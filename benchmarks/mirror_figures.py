"""What the mirror's per-table figures cost per batch (docs/mirror.md, "Metrics and status").

The figures (:mod:`flinkish_spark.connectors.lakehouse.figures`) are counted by each task of the
routing sink, one hash aggregate over the task's stream rows: ``figures_by_table``. Measured on a
200,000-row batch (half snapshot rows, half changes with commit times) over 1, 100 and 1,000 tables,
beside what a routing task does with the same rows anyway (``task_tables``: split by table, decode
the JSON rows), and the ``.done`` marker's size.

Before them, the per-table counts were two ``histogram_numeric`` aggregates in the batch's observed
metrics (``df.observe``, 4,096 bins, key = CRC-32 of the table name): their cost is measured in local
Spark as one ``agg`` over the same 200,000 rows (cached), with and without those two columns.

    python benchmarks/mirror_figures.py [--rows 200000] [--repeat 7] [--no-spark]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402

from benchmarks._common import print_table, write_results  # noqa: E402
from flinkish_spark.connectors.lakehouse.figures import Figures, epoch_figures, figures_by_table  # noqa: E402
from flinkish_spark.connectors.lakehouse.routing import task_tables  # noqa: E402
from flinkish_spark.testing.stream_rows import ARROW, table_schema  # noqa: E402


def stream(rows: int, tables: int) -> pa.Table:
    """``rows`` stream rows over ``tables`` tables as a task receives them: each table's schema row, then
    snapshot rows (the first half) and inserts with commit times (the second)."""
    schemas = [table_schema(f"bench.t_{i}", [("id", "int"), ("v", "text")], ("id",)) for i in range(tables)]
    out: dict[str, list[Any]] = {f.name: [] for f in ARROW}

    def add(table: str, op: str, lsn: int | None, ts: datetime | None, sid: str, row: str) -> None:
        for k, v in zip(out, (table, op, lsn, None if lsn is None else 0, ts, sid, row)):
            out[k].append(v)

    for s in schemas:
        add(s.table, "s", None, None, s.schema_id, s.to_json())
    for i in range(rows):
        s = schemas[i % tables]
        change = i >= rows // 2
        add(s.table, "c" if change else "r", 1000 + i if change else None,
            datetime.fromtimestamp(1_700_000_000 + i / 1000, tz=timezone.utc) if change else None, s.schema_id,
            json.dumps({"id": i, "v": "x"}))
    return pa.table(out, schema=ARROW)


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """The median of ``repeat`` runs, in ms."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def spark_observe(rows: int, repeat: int) -> dict[str, float]:
    """One agg over ``rows`` cached stream rows (100 tables, half snapshot rows, made in the JVM): the observed
    metrics the mirror keeps (counts, newest commit time), and the same with the two per-table histograms it had
    before. The two run alternately (a busy machine slows both alike); the medians, in ms."""
    import flinkish_spark
    from pyspark.sql import functions as F

    spark = flinkish_spark.session(master="local[2]", app_name="mirror-figures")
    spark.sparkContext.setLogLevel("ERROR")
    i = F.col("id")
    df = (spark.range(rows).select(F.concat(F.lit("bench.t_"), (i % 100).cast("string")).alias("_table"),
                                   F.when(i < rows // 2, "r").otherwise("c").alias("_op"),
                                   F.when(i >= rows // 2, F.timestamp_micros(i + 1_700_000_000_000_000))
                                   .alias("_commit_ts")).cache())
    df.count()
    op, table = F.col("_op"), F.col("_table")
    kept = [F.count_if(op.isin("r", "c", "u", "d")).alias("rows"), F.count_if(op == "r").alias("snapshot_rows"),
            F.count_if(op.isin("c", "u", "d", "t")).alias("changes"),
            F.max(F.when(op.isin("c", "u", "d", "t"), F.unix_micros(F.col("_commit_ts")))).alias("last_commit_us")]
    key = (F.crc32(table.cast("binary")) + (F.octet_length(table) % 65536) * (2**32)).cast("double")
    histograms = [F.histogram_numeric(F.when(op == "r", key), F.lit(4096)).alias("snapshot_by_table"),
                  F.histogram_numeric(F.when(op.isin("c", "u", "d"), key), F.lit(4096)).alias("changes_by_table")]
    variants = {"observed (kept)": kept, "observed + per-table histograms (before)": kept + histograms}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for n in range(repeat + 2):
        for name, cols in variants.items():
            took = timed(lambda: df.agg(*cols).collect(), 1)
            if n >= 2:  # the first two rounds warm up
                times[name].append(took)
    spark.stop()
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for tables in (1, 100, 1000):
        batch = stream(args.rows, tables)
        figures = timed(lambda: figures_by_table(batch), args.repeat)
        split = timed(lambda: task_tables(batch.to_batches()), max(1, args.repeat // 3))
        marker = json.dumps({"visible_ms": 0, "figures": epoch_figures(
            type("P", (), {"table": n, "figures": f})() for n, f in figures_by_table(batch).items())})
        results.append({"tables": tables, "figures_by_table_ms": round(figures, 1),
                        "task_tables_ms": round(split, 1), "share": f"{figures / split:.1%}",
                        "done_marker_bytes": len(marker)})
    assert figures_by_table(stream(10, 1)) == {"bench.t_0": Figures(5, 5, 0, 1_700_000_000_009_000)}
    print(f"{args.rows:,} stream rows in one task (median of {args.repeat}):")
    print_table(list(results[0]), [list(r.values()) for r in results])
    spark = {} if args.no_spark else spark_observe(args.rows, max(args.repeat, 15))
    for name, ms in spark.items():
        print(f"spark agg over {args.rows:,} rows, {name}: {ms:.0f} ms")
    print("results:", write_results("mirror_figures", {"rows": args.rows, "tasks": results, "spark_agg_ms": spark}))


if __name__ == "__main__":
    main()
