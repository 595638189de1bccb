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
