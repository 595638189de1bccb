"""Restore validation (Flink's VertexFinishedStateChecker for Spark) and finished sources across kill -9."""

from __future__ import annotations

import collections
import hashlib
import re
from pathlib import Path

import pyarrow.dataset as ds
import pytest

import flinkish_spark
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.sources import read_log


def _snapshot(*dirs: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for d in dirs for p in sorted(d.rglob("*")) if p.is_file()
    }


def _query(spark, tmp_path: Path, rows_per_split: str, sink_uid: str = "out", max_rows: str = "100"):
    df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", str(tmp_path / "meta"))
          .option("rowsPerSplit", rows_per_split).option("maxRowsPerTrigger", max_rows).load())
    return (df.writeStream.format("flinkish.parquet").option("uid", sink_uid).option("path", str(tmp_path / "out"))
            .option("checkpoint", str(tmp_path / "meta")).option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(processingTime="1 second").start())


def _restart_fails_and_writes_nothing(spark, tmp_path: Path, rows_per_split: str, *fragments: str) -> None:
    """Restart the query: it fails with every fragment in its error; metadata and output are unchanged."""
    before = _snapshot(tmp_path / "meta", tmp_path / "out")
    q = _query(spark, tmp_path, rows_per_split)
    assert flinkish_spark.await_finished(q, timeout=120) == "failed"
    message = str(q.exception())
    for fragment in fragments:
        assert fragment in message
    assert _snapshot(tmp_path / "meta", tmp_path / "out") == before


def test_restart_with_a_changed_finished_source_fails_and_writes_nothing(spark, tmp_path: Path) -> None:
    assert flinkish_spark.await_finished(_query(spark, tmp_path, "40,30"), timeout=120) == "finished"
    _restart_fails_and_writes_nothing(
        spark, tmp_path, "40,60",
        "source uid 'seq' is FINISHED in checkpoint",
        "configuration changed (rowsPerSplit: [40, 30] -> [40, 60])",
    )


def test_restart_with_a_compatible_change_is_accepted(spark, tmp_path: Path) -> None:
    assert flinkish_spark.await_finished(_query(spark, tmp_path, "40,30"), timeout=120) == "finished"
    # maxRowsPerTrigger is admission control, not the data: raising it is fine.
    assert flinkish_spark.await_finished(_query(spark, tmp_path, "40,30", max_rows="500"), timeout=120) == "finished"
    assert ds.dataset(str(tmp_path / "out"), format="parquet").count_rows() == 70


def test_restart_with_a_renamed_sink_uid_fails_and_writes_nothing(spark, tmp_path: Path) -> None:
    q = _query(spark, tmp_path, "400", max_rows="100")
    assert flinkish_spark.stop(q, timeout=120) == "stopped"
    before = _snapshot(tmp_path / "meta" / "sinks", tmp_path / "out")
    q = _query(spark, tmp_path, "400", sink_uid="renamed", max_rows="100")
    assert flinkish_spark.await_finished(q, timeout=120) == "failed"
    assert re.search("sink uid 'renamed' is new, but the query's checkpointLocation .* was written with sink uid 'out'",
                     str(q.exception()))
    # Spark creates the writer after the sources planned the batch, so the source may have
    # written its write-ahead checkpoint; the sink's output and metadata are untouched...
    assert _snapshot(tmp_path / "meta" / "sinks", tmp_path / "out") == before
    # ...and with the uid restored the query resumes exactly once.
    assert flinkish_spark.await_finished(_query(spark, tmp_path, "400"), timeout=120) == "finished"
    rows = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert collections.Counter(zip(rows["split"].to_pylist(), rows["seq"].to_pylist())) == collections.Counter(
        (k, i) for k in range(2) for i in range(400))


@pytest.mark.slow
def test_bounded_and_unbounded_union_survives_kill_9_and_never_rereads_the_finished_source(run_pipeline, spark, tmp_path: Path) -> None:
    meta, reads = tmp_path / "meta", tmp_path / "reads"
    spec = {
        "sources": [
            {"format": "flinkish.testing.counting", "options": {"uid": "bounded", "checkpoint": str(meta), "rowsPerSplit": "30,50",
                                                               "maxRowsPerTrigger": 40, "readLog": str(reads)}},
            {"format": "flinkish.sequence", "options": {"uid": "unbounded", "checkpoint": str(meta), "splits": 2,
                                                         "rowsPerSecond": 400, "maxRowsPerTrigger": 40}},
        ],
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(tmp_path / "out")}},
        "trigger": "300 milliseconds", "end": "timeout", "runSeconds": 60,
    }
    # The 7th checkpoint write: the bounded source has finished (2 epochs), the unbounded one runs on.
    first = run_pipeline(spec, crash_at="source.after_metadata_write:7")
    assert first.killed, first.output[-3000:]
    store = SourceCheckpointStore(FileIO.for_url(str(meta)), str(meta), "bounded", "")
    assert store.latest().status == "FINISHED"
    reads_before = read_log(str(reads))
    unbounded = SourceCheckpointStore(FileIO.for_url(str(meta)), str(meta), "unbounded", "")
    ids_before = unbounded.ids()

    second = run_pipeline({**spec, "end": "stop", "stopAfterBatches": 4, "runSeconds": 120})
    assert second.returncode == 0 and "QUERY_END=stopped" in second.output, second.output[-3000:]
    assert read_log(str(reads)) == reads_before  # the finished source was never read again
    assert unbounded.ids()[-1] > ids_before[-1] and unbounded.latest().status == "RUNNING"
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    got = collections.Counter((r.split, r.seq) for r in rows)
    positions = {int(s.split_id): s.position for s in unbounded.latest().splits}
    # Both inputs emit (split, seq) pairs: the output is exactly the union of what each read, once.
    expected = collections.Counter([(0, i) for i in range(30)] + [(1, i) for i in range(50)])
    expected.update((k, i) for k, n in positions.items() for i in range(n))
    assert got == expected


def test_restart_after_spark_checkpoint_was_deleted_fails_and_writes_nothing(spark, tmp_path: Path) -> None:
    import shutil

    assert flinkish_spark.await_finished(_query(spark, tmp_path, "150"), timeout=120) == "finished"
    shutil.rmtree(tmp_path / "cp")  # Spark's checkpointLocation gone, flinkish metadata kept
    _restart_fails_and_writes_nothing(
        spark, tmp_path, "150",
        "source uid 'seq' has checkpoints up to",
        "checkpointLocation was deleted or replaced while the flinkish metadata was kept",
    )
    assert ds.dataset(str(tmp_path / "out"), format="parquet").count_rows() == 300


def test_sink_refuses_a_decision_log_of_an_earlier_incarnation_of_the_query(spark, tmp_path: Path) -> None:
    import shutil

    def query(meta: str):
        df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", str(tmp_path / meta))
              .option("rowsPerSplit", "50").option("maxRowsPerTrigger", "40").load())
        return (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", str(tmp_path / "out"))
                .option("checkpoint", str(tmp_path / "sinkmeta")).option("checkpointLocation", str(tmp_path / "cp"))
                .trigger(availableNow=True).start())

    assert flinkish_spark.await_finished(query("meta1"), timeout=120) == "finished"
    shutil.rmtree(tmp_path / "cp")
    before = _snapshot(tmp_path / "sinkmeta", tmp_path / "out")
    q = query("meta2")  # a fresh source: epochs start at 0 again, the sink's log says 0..2 are done
    assert flinkish_spark.await_finished(q, timeout=120) == "failed"
    message = str(q.exception())
    assert re.search(r"sink uid 'out' has last committed epoch 2 in its target, decisions up to epoch 2 in its decision "
                     r"log; its epochs were written by the streaming query \S+, but the checkpointLocation \S+ now "
                     r"belongs to the query \S+: it was deleted or replaced", message), message
    assert _snapshot(tmp_path / "sinkmeta", tmp_path / "out") == before
