"""End-of-input watermark flush: every event-time window fires before the query ends."""

from __future__ import annotations

import collections
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F

import flinkish_spark


def _seq(spark, meta: Path, uid: str, **options: str):
    r = (spark.readStream.format("flinkish.sequence").option("uid", uid).option("checkpoint", str(meta))
         .option("watermarkColumn", "ts"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _windows(df):
    return (flinkish_spark.with_watermark(df, "ts", "5 seconds")
            .groupBy(F.window("ts", "10 seconds")).agg(F.count("*").alias("n"))
            .select(F.col("window.start").alias("start"), "n"))


def _run(df, tmp_path: Path, trigger: dict) -> dict:
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "cp")).outputMode("append").trigger(**trigger).start())
    assert flinkish_spark.await_finished(q, timeout=180) == "finished", q.exception()
    rows = ds.dataset(str(tmp_path / "out"), format="parquet").to_table().to_pylist()
    starts = [r["start"] for r in rows]
    assert len(set(starts)) == len(starts), "a window was emitted twice"
    base = min(starts)
    return {int((r["start"] - base).total_seconds()): r["n"] for r in rows}


def _expected(lengths: list[int]) -> dict[int, int]:
    # Split k emits ts = epoch + seq seconds for seq < its length: 10-second windows.
    counts: collections.Counter = collections.Counter()
    for n in lengths:
        for seq in range(n):
            counts[seq // 10 * 10] += 1
    return dict(counts)


@pytest.mark.parametrize("trigger", [{"processingTime": "2 seconds"}, {"availableNow": True}], ids=["2s", "availableNow"])
def test_bounded_windowed_count_emits_every_window_the_last_included(spark, tmp_path: Path, trigger: dict) -> None:
    lengths = [95, 43]  # the last windows [90, 100) and [40, 50) are partial and still open at the end
    df = _seq(spark, tmp_path / "meta", "seq", rowsPerSplit="95,43", maxRowsPerTrigger="40")
    assert _run(_windows(df), tmp_path, trigger) == _expected(lengths)


def test_two_inputs_flush_only_when_both_ended(spark, tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    early = _seq(spark, meta, "early", rowsPerSplit="25", splits="1")
    late = _seq(spark, meta, "late", rowsPerSplit="300", splits="1", maxRowsPerTrigger="60")
    # "early" ends in the first epoch; an early marker would make most of "late" late (dropped).
    got = _run(_windows(early.unionByName(late)), tmp_path, {"processingTime": "1 second"})
    assert got == _expected([25, 300])


def test_watermark_column_must_be_a_timestamp_column(spark, tmp_path: Path) -> None:
    df = (spark.readStream.format("flinkish.sequence").option("uid", "s").option("checkpoint", str(tmp_path / "m"))
          .option("rowsPerSplit", "5").option("watermarkColumn", "seq").load())
    with pytest.raises(Exception, match="option 'watermarkColumn' must name a timestamp column"):
        q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")).start()
        q.awaitTermination(60)  # raises the query's error
    assert not (tmp_path / "m" / "sources").exists()
