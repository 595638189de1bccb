"""Separate executor JVMs (local-cluster): sources, 2PC sink and a kill -9 restart still give exactly once; a
bounded query on a processing-time trigger ends by itself; a drain ends an unbounded one.

Two driver starts in all (each starts a driver JVM and two executor JVMs, the cost of this test): the first is
killed -9 mid-commit; the second restarts that query and then, in the same driver, runs the bounded query and
the drained one (flinkish_spark.testing.queries).
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from flinkish_spark.testing.queries import outputs

pytestmark = pytest.mark.slow

MASTER = "local-cluster[2,1,1024]"


def test_local_cluster_crash_and_restart_then_a_bounded_query_ends_by_itself_and_drain_ends_an_unbounded_one(
        spark, run_pipeline, tmp_path: Path) -> None:
    crashed = {
        "master": MASTER,
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": "300,200", "maxRowsPerTrigger": 200}},
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(tmp_path / "out"), "rowsPerFile": 50}},
    }
    sink = {"format": "flinkish.parquet", "options": {"uid": "out", "path": str(tmp_path / "out1")},
            "checkpointLocation": str(tmp_path / "cp1")}
    bounded = {
        "master": MASTER, "trigger": "30 seconds", "end": "finish", "runSeconds": 200,
        "source": {"format": "flinkish.sequence", "options": {"uid": "seq", "checkpoint": str(tmp_path / "meta1"),
                                                             "rowsPerSplit": "100,250,50"}},
        "sink": sink,
    }
    drained = {
        "master": MASTER, "trigger": "2 seconds", "end": "drain", "stopAfterBatches": 2, "runSeconds": 200,
        "source": {"format": "flinkish.sequence", "options": {"uid": "seq", "checkpoint": str(tmp_path / "meta2"),
                                                             "splits": 2, "rowsPerSecond": 100}},
        "sink": {**sink, "options": {"uid": "out", "path": str(tmp_path / "out2")}, "checkpointLocation": str(tmp_path / "cp2")},
    }

    first = run_pipeline(crashed, crash_at="sink.mid_commit:2", timeout=400)
    assert first.killed, first.output[-3000:]
    second = run_pipeline({"queries": [crashed, bounded, drained]}, timeout=600)  # the restart, then two more queries
    assert second.returncode == 0, second.output[-3000:]
    restart, bounded_run, drained_run = outputs(second.output)
    assert "QUERY_END=finished" in restart, second.output[-3000:]
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert collections.Counter((r.split, r.seq) for r in rows) == collections.Counter(
        [(0, i) for i in range(300)] + [(1, i) for i in range(200)]
    )

    assert "QUERY_END=finished" in bounded_run, second.output[-3000:]  # not by its 200 s runSeconds
    rows = spark.read.parquet(str(tmp_path / "out1")).collect()
    assert collections.Counter((r.split, r.seq) for r in rows) == collections.Counter(
        [(0, i) for i in range(100)] + [(1, i) for i in range(250)] + [(2, i) for i in range(50)])

    assert "QUERY_END=drained" in drained_run, second.output[-3000:]
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.io.fileio import FileIO

    latest = SourceCheckpointStore(FileIO.for_url(str(tmp_path / "meta2")), str(tmp_path / "meta2"), "seq", "").latest()
    assert latest is not None and latest.status == "FINISHED"
    rows = spark.read.parquet(str(tmp_path / "out2")).collect()
    assert collections.Counter((r.split, r.seq) for r in rows) == collections.Counter(
        (int(s.split_id), i) for s in latest.splits for i in range(s.position))
