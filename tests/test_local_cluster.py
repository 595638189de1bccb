"""Separate executor JVMs (local-cluster): sources, 2PC sink and a kill -9 restart still give exactly once."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_local_cluster_pipeline_with_crash_and_restart(spark, run_pipeline, tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = {
        "master": "local-cluster[2,1,1024]",
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": "300,200", "maxRowsPerTrigger": 200}},
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(out), "rowsPerFile": 50}},
    }
    first = run_pipeline(spec, crash_at="sink.mid_commit:2", timeout=400)
    assert first.killed, first.output[-3000:]
    second = run_pipeline(spec, timeout=400)
    assert second.returncode == 0, second.output[-3000:]
    rows = spark.read.parquet(str(out)).collect()
    assert collections.Counter((r.split, r.seq) for r in rows) == collections.Counter(
        [(0, i) for i in range(300)] + [(1, i) for i in range(200)]
    )


def test_local_cluster_bounded_query_ends_by_itself_and_drain_ends_an_unbounded_one(spark, run_pipeline, tmp_path: Path) -> None:
    sink = {"format": "flinkish.parquet", "options": {"uid": "out", "path": str(tmp_path / "out1")},
            "checkpointLocation": str(tmp_path / "cp1")}
    bounded = {
        "master": "local-cluster[2,1,1024]", "trigger": "30 seconds", "end": "finish", "runSeconds": 200,
        "source": {"format": "flinkish.sequence", "options": {"uid": "seq", "checkpoint": str(tmp_path / "meta1"),
                                                             "rowsPerSplit": "100,250,50"}},
        "sink": sink,
    }
    run = run_pipeline(bounded, timeout=400)
    assert run.returncode == 0 and "QUERY_END=finished" in run.output, run.output[-3000:]
    rows = spark.read.parquet(str(tmp_path / "out1")).collect()
    assert collections.Counter((r.split, r.seq) for r in rows) == collections.Counter(
        [(0, i) for i in range(100)] + [(1, i) for i in range(250)] + [(2, i) for i in range(50)])

    drained = {
        "master": "local-cluster[2,1,1024]", "trigger": "2 seconds", "end": "drain", "stopAfterBatches": 2, "runSeconds": 200,
        "source": {"format": "flinkish.sequence", "options": {"uid": "seq", "checkpoint": str(tmp_path / "meta2"),
                                                             "splits": 2, "rowsPerSecond": 100}},
        "sink": {**sink, "options": {"uid": "out", "path": str(tmp_path / "out2")}, "checkpointLocation": str(tmp_path / "cp2")},
    }
    run = run_pipeline(drained, timeout=400)
    assert run.returncode == 0 and "QUERY_END=drained" in run.output, run.output[-3000:]
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.io.fileio import FileIO

    latest = SourceCheckpointStore(FileIO.for_url(str(tmp_path / "meta2")), str(tmp_path / "meta2"), "seq", "").latest()
    assert latest is not None and latest.status == "FINISHED"
    rows = spark.read.parquet(str(tmp_path / "out2")).collect()
    assert collections.Counter((r.split, r.seq) for r in rows) == collections.Counter(
        (int(s.split_id), i) for s in latest.splits for i in range(s.position))
