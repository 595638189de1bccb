"""kill -9 of the driver at named protocol points, then restart: every row exactly once.

Each case runs the pipeline in a child driver process (Python driver + JVM +
workers in one process group), kills the whole group with SIGKILL when
execution reaches the named point, restarts it from the same checkpoints and
compares the sink with the expected multiset.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from flinkish_spark.testing.sources import read_log

pytestmark = pytest.mark.slow

LENGTHS = [10, 1000]


def spec(tmp_path: Path) -> dict:
    return {
        "source": {
            "format": "flinkish.testing.counting",
            "options": {
                "uid": "seq",
                "checkpoint": str(tmp_path / "meta"),
                "rowsPerSplit": ",".join(map(str, LENGTHS)),
                "maxRowsPerTrigger": 100,
                "retainCheckpoints": 1000,
                "readLog": str(tmp_path / "reads"),
            },
        },
        "sink": {"format": "parquet", "checkpointLocation": str(tmp_path / "cp"), "options": {"path": str(tmp_path / "out")}},
        "trigger": "availableNow",
    }


def logged(cp: Path, log: str) -> set[int]:
    d = cp / log
    return {int(p.name) for p in d.iterdir() if p.name.isdigit()} if d.exists() else set()


# (point, what the metadata shows right after the kill). One pipeline is killed at each
# point in turn and restarted from the same checkpoints; the last run completes.
CHAIN = [
    # the metadata file of the 3rd epoch is written, Spark's offset log does not name it yet
    ("source.after_metadata_write:3", "orphan-metadata"),
    # Spark's offset log names a batch that is being planned: logged, never committed
    ("source.partitions:3", "offset-logged"),
    # mid-batch: a task has produced its first rows
    ("source.read:5", "offset-logged"),
]


def test_kill_driver_at_each_point_and_restart_gives_every_row_once(spark, run_pipeline, tmp_path: Path) -> None:
    s = spec(tmp_path)
    cp, meta = tmp_path / "cp", tmp_path / "meta" / "sources" / "seq"
    for point, check in CHAIN:
        run = run_pipeline(s, crash_at=point)
        assert run.killed, f"expected a kill at {point}, got rc={run.returncode}:\n{run.output[-3000:]}"
        offsets, commits = logged(cp, "offsets"), logged(cp, "commits")
        if check == "orphan-metadata":
            assert len(list(meta.glob("*.parquet"))) == len(offsets) + 1  # written, never referenced
        else:
            assert max(offsets) not in commits  # the batch is in the offset log but not committed

    last = run_pipeline(s)
    assert last.returncode == 0, last.output[-3000:]
    rows = spark.read.parquet(str(tmp_path / "out")).select("split", "seq").collect()
    got = collections.Counter((r.split, r.seq) for r in rows)
    want = collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))
    assert got == want
    # split 0 finished in the first epoch: across three crashes and restarts it was read once
    assert [r for r in read_log(str(tmp_path / "reads")) if r[0] == "0"] == [("0", 0, 10)]

    # A restart of the finished pipeline reads nothing and runs no batch.
    reads_before, batches_before = read_log(str(tmp_path / "reads")), logged(cp, "commits")
    assert run_pipeline(s).returncode == 0
    assert read_log(str(tmp_path / "reads")) == reads_before
    assert logged(cp, "commits") == batches_before
    assert spark.read.parquet(str(tmp_path / "out")).count() == sum(LENGTHS)
