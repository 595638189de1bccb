"""flinkish.iceberg under kill -9, append and upsert, on S3: the append matrix is killed from the decision on and
at a random moment, with failing first task attempts; the keyed (upsert) matrix at each point of the keyed commit.

Pipelines run in child driver processes (conftest.run_pipeline); the tables are read with pyiceberg as a user
would, and their snapshots say which epoch each one committed. One test, two tables of one catalog: a kill ends
a driver, so each kill is a driver start of its own, but the two last runs share one driver (one after the
other, flinkish_spark.testing.queries). Every assertion names its matrix and point.

Keyed matrix: killed after the tasks wrote their data files (sink.before_decision), after the driver wrote the
epoch's position delete files of the decided epoch (iceberg.keyed.before_snapshot), and after the commit
(before the decision log says done). Each restart replays the epoch; the table must end exact -- every key
holds its last change, deleted keys are gone -- with one snapshot per epoch and no file on storage that the
table does not name. No kill right after the decision (``sink.after_decision``): its restart runs
IcebergSink.commit of the decided epoch from the start, as the restart after the kill at
``iceberg.keyed.before_snapshot`` does (which also finds the killed attempt's delete files) -- the Delta keyed
matrix has no kill there either. No kill after the commit before Spark's commit log (``sink.after_commit``):
there the decision log already says done, so the restart's commit_epoch never reaches the keyed sink's commit
(ALREADY_COMMITTED, the replay's files aborted -- as after the kill at ``iceberg.keyed.before_snapshot``). The
append matrix is killed after the decision; after the commit neither: there the restart's tasks prepare nothing
(the epoch is decided), commit_epoch answers ALREADY_COMMITTED without calling IcebergSink's commit, and
IcebergSink.cleanup runs a second time over an epoch folder it already cleaned (the one cleanup every replay
runs). None of that is Iceberg's code; tests/sink/test_sink_crash.py kills there for every sink (its S3 chain,
the format's path through sink/datasource.py, and its foreachBatch kill).
"""

from __future__ import annotations

import collections
import random
from pathlib import Path

import pytest

from flinkish_spark.testing.queries import outputs


pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

LENGTHS = [675, 675]  # 9 epochs of 150 rows: 2 through the crash points, at least 1 before the random kill, the rest after
# conftest's CHAIN but sink.before_decision: the keyed matrix is killed there, and what a restart does with an
# undecided epoch's files -- IcebergSink.cleanup of the epoch's folder -- is one code for both modes; and but
# sink.after_commit, killed in tests/sink/test_sink_crash.py (see the module docstring).
APPEND_CHAIN = ["sink.after_decision", "sink.before_done"]
# before the decision, after the driver wrote the epoch's position delete files before the snapshot names
# them, after the snapshot (see the module docstring for the points left to the append matrix)
KEYED_CHAIN = ["sink.before_decision", "iceberg.keyed.before_snapshot", "sink.before_done"]
ROWS, PER_EPOCH, KEYS = 900, 150, 50  # keyed: 6 epochs (killed in 1-3), each changing every key about three times


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def keyed_expected() -> dict[int, str]:
    state: dict[int, str] = {}
    for seq in range(ROWS):
        if seq % 7 == 0:
            state.pop(seq % KEYS, None)
        else:
            state[seq % KEYS] = f"v{seq}"
    return state


def keyed_rows(table) -> dict[int, str]:
    t = table.load().scan(selected_fields=("id", "v")).to_arrow()
    ids = t["id"].to_pylist()
    assert len(ids) == len(set(ids)), "keyed: a key is in the table twice"
    return dict(zip(ids, t["v"].to_pylist()))


ENV = {"FLINKISH_FAIL_AT": "sink.write:first"}


@pytest.mark.s3
@pytest.mark.timeout(2400)  # eight driver runs; on two cores shared with other Spark jobs one run took 2 minutes
def test_append_and_keyed_crash_matrices_and_a_random_kill_on_s3(run_pipeline, s3_proc: str, s3_table,
                                                                 kill_at_each_point, tmp_path: Path) -> None:
    """Append: kill -9 at each point of APPEND_CHAIN in turn, then at a random moment under a processing-time
    trigger, restarted until the bounded query ends by itself; every task's first attempt fails. Each row
    once, one snapshot per epoch, no data file outside the table. (One random kill: the points are the
    matrix's; the tail checks that a kill anywhere in an epoch of a processing-time trigger and the restart's
    end by itself hold too.) Keyed: kill -9 at each point of KEYED_CHAIN; the last run's first attempts fail."""
    catalog_uri = f"sqlite:///{tmp_path}/catalog.db"
    append = {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/meta", "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 150, "endpointUrl": s3_proc}},
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "table": "db.events", "catalogUri": catalog_uri, "warehouse": "s3://test/wh",
            "partitionBy": "split", "rowsPerFile": 60, "endpointUrl": s3_proc}},
        "master": "local[2,4]",
    }
    table = s3_table(catalog_uri, s3_proc, "db.events")
    kill_at_each_point(run_pipeline, append, table, tmp_path / "cp", env=ENV, chain=APPEND_CHAIN, name="append")

    keyed_cp = tmp_path / "keyed" / "cp"
    keyed = {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/keyed-meta", "rowsPerSplit": str(ROWS), "maxRowsPerTrigger": PER_EPOCH,
            "endpointUrl": s3_proc}},
        "select": [f"seq % {KEYS} AS id", "concat('v', seq) AS v",
                   "CASE WHEN seq % 7 = 0 THEN 'd' ELSE 'u' END AS _op", "seq AS _lsn"],
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(keyed_cp), "options": {
            "uid": "out", "table": "db.mirror", "catalogUri": catalog_uri, "warehouse": "s3://test/wh",
            "mode": "upsert", "key": "id", "deletes": "true", "endpointUrl": s3_proc}},
        "master": "local[2,4]",
    }
    keyed_table = s3_table(catalog_uri, s3_proc, "db.mirror")
    kill_at_each_point(run_pipeline, keyed, keyed_table, keyed_cp, chain=KEYED_CHAIN, name="keyed")

    # append under a processing-time trigger: kill -9 of the whole driver once the run committed an epoch,
    # 0-1.5 s later (somewhere in the next epoch)
    timed = {**append, "trigger": "1 second", "end": "finish", "runSeconds": 300}
    start = table.last_epoch()
    run = run_pipeline(timed, env=ENV, kill_after=random.Random(12).uniform(0, 1.5),
                       kill_when=lambda: table.last_epoch() > start)
    assert run.killed, f"append: the random kill did not land (the query ended): {run.output[-3000:]}"

    # the two last runs in one driver, every task's first attempt failing
    last = run_pipeline({"queries": [timed, keyed]}, env=ENV, timeout=600)
    assert last.returncode == 0, last.output[-3000:]
    for name, out in zip(("append", "keyed"), outputs(last.output)):
        assert "QUERY_END=finished" in out and "injected failure at sink.write (attempt 0)" in out, f"{name}: {out[-3000:]}"

    t = table.load().scan(selected_fields=("split", "seq")).to_arrow()
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == expected(), "append"
    assert table.epochs() == list(range(9)), "append"  # one snapshot per epoch: a replay added none
    assert len(table.load().snapshots()) == 9, "append"
    assert table.stray_files() == set(), "append"

    assert keyed_rows(keyed_table) == keyed_expected(), "keyed"
    # one snapshot per Spark batch (an epoch without rows commits its marker too): a replay added none
    batches = sorted(int(p.name) for p in (keyed_cp / "commits").iterdir() if p.name.isdigit())
    assert keyed_table.epochs() == batches and len(batches) >= ROWS // PER_EPOCH, "keyed"
    assert keyed_table.stray_files() == set(), "keyed"
    snap = keyed_table.load().current_snapshot()
    assert snap.summary.operation.value == "overwrite" and int(snap.summary["total-position-deletes"]) > 0, "keyed"
