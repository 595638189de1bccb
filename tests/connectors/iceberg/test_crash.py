"""flinkish.iceberg (append) under kill -9 at the protocol points from the decision on and at a random
moment, with failing first task attempts, on S3 (the keyed matrix, test_keyed_crash.py, is killed
before the decision too).

Pipelines run in child driver processes (conftest.run_pipeline); the table is read with
pyiceberg as a user would, and its snapshots say which epoch each one committed.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest


pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

LENGTHS = [675, 675]  # 9 epochs of 150 rows: 4 through the crash points, at least 1 before the random kill, the rest after
# conftest's CHAIN but sink.before_decision: the keyed matrix (test_keyed_crash.py) is killed there, and what a
# restart does with an undecided epoch's files -- IcebergSink.cleanup of the epoch's folder -- is one code for
# both modes.
APPEND_CHAIN = ["sink.after_decision", "sink.before_done", "sink.after_commit"]


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


ENV = {"FLINKISH_FAIL_AT": "sink.write:first"}


@pytest.mark.s3
@pytest.mark.timeout(2400)  # five driver runs; on two cores shared with other Spark jobs one run took 2 minutes
def test_crash_matrix_then_a_random_kill_on_s3_with_failed_first_attempts(run_pipeline, run_with_random_kills, s3_proc: str,
                                                                          s3_table, kill_at_each_point, tmp_path: Path) -> None:
    """kill -9 at each point of APPEND_CHAIN in turn, then at a random moment under a processing-time
    trigger, restarted until the bounded query ends by itself; every task's first attempt fails.
    Each row once, one snapshot per epoch, no data file outside the table. (One random kill: the
    points are the matrix's; the tail checks that a kill anywhere in an epoch of a processing-time
    trigger and the restart's end by itself hold too -- a second random kill would re-check the same.)"""
    catalog_uri = f"sqlite:///{tmp_path}/catalog.db"
    s = {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/meta", "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 150, "endpointUrl": s3_proc}},
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "table": "db.events", "catalogUri": catalog_uri, "warehouse": "s3://test/wh",
            "partitionBy": "split", "rowsPerFile": 60, "endpointUrl": s3_proc}},
        "master": "local[2,4]",
    }
    table = s3_table(catalog_uri, s3_proc, "db.events")
    kill_at_each_point(run_pipeline, s, table, tmp_path / "cp", env=ENV, chain=APPEND_CHAIN)
    last = run_with_random_kills(s, table.last_epoch, kills=1, seed=12, env=ENV)
    assert "injected failure at sink.write (attempt 0)" in last
    t = table.load().scan(selected_fields=("split", "seq")).to_arrow()
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == expected()
    assert table.epochs() == list(range(9))  # one snapshot per epoch: a replay added none
    assert len(table.load().snapshots()) == 9
    assert table.stray_files() == set()
