"""Automatic termination (final checkpoint) under processing-time triggers, and the final notification."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq

import flinkish_spark
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.io.fileio import FileIO


def _rows(path: Path) -> collections.Counter:
    t = ds.dataset(str(path), format="parquet").to_table()
    return collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist()))


def test_bounded_query_with_30s_trigger_ends_by_itself_after_last_commit(spark, tmp_path: Path, capsys) -> None:
    lengths = [50, 120, 80]
    df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", str(tmp_path / "meta"))
          .option("rowsPerSplit", ",".join(map(str, lengths))).load())
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="30 seconds").start())
    end = flinkish_spark.await_finished(q, timeout=120, progress=True)
    ended = time.time()
    assert end == "finished"
    shown = capsys.readouterr().out
    assert "finishing" in shown and "3/3" in shown and "250 rows" in shown  # the progress bar's last state
    assert not q.isActive and q.exception() is None
    # The 30 s trigger never fired a second time: the query ended right after its one batch
    # committed (timed from that commit, not from the start: on a loaded machine, or beside
    # another xdist worker, the batch itself took 40-80 s).
    batches = sorted(p.name for p in (tmp_path / "cp" / "commits").iterdir() if p.name.isdigit())
    assert batches == ["0"]
    after_commit = ended - (tmp_path / "cp" / "commits" / "0").stat().st_mtime
    assert after_commit < 25, after_commit
    assert _rows(tmp_path / "out") == collections.Counter((k, i) for k, n in enumerate(lengths) for i in range(n))
    latest = SourceCheckpointStore(FileIO.for_url(str(tmp_path / "meta")), str(tmp_path / "meta"), "seq", "").latest()
    assert latest is not None and latest.status == "FINISHED"


def test_files_archive_includes_the_last_epoch_when_await_finished_returns(spark, tmp_path: Path) -> None:
    import pyarrow as pa

    inbox, archive = tmp_path / "in", tmp_path / "archive"
    inbox.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"k": [i] * 10, "v": list(range(10))}), inbox / f"f{i}.parquet")
    df = (spark.readStream.format("flinkish.files").option("uid", "files").option("checkpoint", str(tmp_path / "meta"))
          .option("path", str(inbox)).option("format", "parquet").option("bounded", "true")
          .option("maxFilesPerTrigger", "2").option("cleanup", "archive").option("archivePath", str(archive)).load())
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="20 seconds").start())
    assert flinkish_spark.await_finished(q, timeout=120) == "finished"
    assert sorted(p.name for p in archive.glob("*.parquet")) == ["f0.parquet", "f1.parquet", "f2.parquet"]
    assert list(inbox.glob("*.parquet")) == []
    assert ds.dataset(str(tmp_path / "out")).count_rows() == 30


def test_query_ends_by_itself_without_await_finished(spark, tmp_path: Path) -> None:
    # register() installed the finish controller: Spark's own awaitTermination sees the end.
    df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", str(tmp_path / "meta"))
          .option("rowsPerSplit", "30").load())
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="60 seconds").start())
    assert q.awaitTermination(50) is True
    assert q.exception() is None
    assert ds.dataset(str(tmp_path / "out")).count_rows() == 60
