"""flinkish.iceberg in upsert mode under kill -9 at each point of the keyed commit, on S3: after the
tasks wrote their data files (sink.before_decision), after the driver wrote the epoch's position
delete files of the decided epoch (iceberg.keyed.before_snapshot), and after the commit (before the
decision log says done). Each restart replays the epoch; the table must end exact -- every key
holds its last change, deleted keys are gone -- with one snapshot per epoch and no file on storage
that the table does not name.

No kill right after the decision (``sink.after_decision``): its restart runs IcebergSink.commit of
the decided epoch from the start, as the restart after the kill at ``iceberg.keyed.before_snapshot``
does (which also finds the killed attempt's delete files) -- the Delta keyed matrix has no kill
there either. No kill after the commit before Spark's commit log (``sink.after_commit``): there the
decision log already says done, so the restart's commit_epoch never reaches the keyed sink's commit
(ALREADY_COMMITTED, the replay's files aborted -- as after the kill at
``iceberg.keyed.before_snapshot``). The append matrix (test_crash.py) is killed at both points."""

from __future__ import annotations

from pathlib import Path

import pytest


pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

ROWS, PER_EPOCH, KEYS = 1200, 150, 50  # 8 epochs, each changing every key about three times


def expected() -> dict[int, str]:
    state: dict[int, str] = {}
    for seq in range(ROWS):
        if seq % 7 == 0:
            state.pop(seq % KEYS, None)
        else:
            state[seq % KEYS] = f"v{seq}"
    return state


def rows(table) -> dict[int, str]:
    t = table.load().scan(selected_fields=("id", "v")).to_arrow()
    ids = t["id"].to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    return dict(zip(ids, t["v"].to_pylist()))


@pytest.mark.s3
@pytest.mark.timeout(2400)
def test_upsert_crash_matrix_on_s3(run_pipeline, s3_proc: str, s3_table, kill_at_each_point, tmp_path: Path) -> None:
    catalog_uri = f"sqlite:///{tmp_path}/catalog.db"
    s = {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/meta", "rowsPerSplit": str(ROWS), "maxRowsPerTrigger": PER_EPOCH,
            "endpointUrl": s3_proc}},
        "select": [f"seq % {KEYS} AS id", "concat('v', seq) AS v",
                   "CASE WHEN seq % 7 = 0 THEN 'd' ELSE 'u' END AS _op", "seq AS _lsn"],
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "table": "db.mirror", "catalogUri": catalog_uri, "warehouse": "s3://test/wh",
            "mode": "upsert", "key": "id", "deletes": "true", "endpointUrl": s3_proc}},
        "master": "local[2,4]",
    }
    table = s3_table(catalog_uri, s3_proc, "db.mirror")
    # before the decision, after the driver wrote the epoch's position delete files before the snapshot names
    # them, after the snapshot (see the module docstring for the points left to the append matrix)
    chain = ["sink.before_decision", "iceberg.keyed.before_snapshot", "sink.before_done"]
    kill_at_each_point(run_pipeline, s, table, tmp_path / "cp", chain=chain)
    last = run_pipeline(s)
    assert last.returncode == 0 and "QUERY_END=finished" in last.output, last.output[-3000:]
    assert rows(table) == expected()
    # one snapshot per Spark batch (an epoch without rows commits its marker too): a replay added none
    batches = sorted(int(p.name) for p in (tmp_path / "cp" / "commits").iterdir() if p.name.isdigit())
    assert table.epochs() == batches and len(batches) >= ROWS // PER_EPOCH
    assert table.stray_files() == set()
    snap = table.load().current_snapshot()
    assert snap.summary.operation.value == "overwrite" and int(snap.summary["total-position-deletes"]) > 0
