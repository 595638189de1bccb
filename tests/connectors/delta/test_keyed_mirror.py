"""flinkish.postgres (snapshotThenChanges) -> flinkish.delta on S3, mode=upsert, deletes=true: a mirror.

A writer process (:mod:`flinkish_spark.testing.pg_writer`) inserts, updates (a few hot keys
many times per epoch, and random ones), changes keys and deletes rows of the source table
the whole time. The pipeline (no option
'key': the source carries the table's primary key in the stream's schema) is killed with
kill -9 of its whole process group at seeded random moments after it committed an epoch,
and restarted: ``KILLS`` times, then once more after it committed a change epoch.
Then the writer stops and the pipeline is stopped with drain: the table that delta-rs reads
(``DeltaTable.scan()``, deletion vectors applied) must equal the source table row for row,
no replication slot may be left, and nothing on storage may be unreferenced by the log.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.delta_log import log_mentions, unreferenced
from flinkish_spark.testing.spark_log import committed_batches

deltalake = pytest.importorskip("deltalake")
pytestmark = [pytest.mark.slow, pytest.mark.s3]

ROWS = 60_000
SPLIT = 15_000  # 4 chunks
KILLS = 1  # random ones, then one in the change stream (the keyed commit's own points: the keyed matrix of test_crash.py)
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "17"))
SLOT = "flinkish_mirror"




def spec(tmp_path: Path, url: str, endpoint: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "src",
            "splitSize": SPLIT, "maxRowsPerTrigger": 2 * SPLIT}},
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "dst", "checkpoint": str(tmp_path / "meta"), "path": "s3://test/mirror", "mode": "upsert",
            "deletes": "true", "endpointUrl": endpoint, "compactEvery": 8}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_postgres_mirror_into_delta_through_kills_and_drain(pg_url, run_pipeline, s3_proc: str, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, v text, n int)")
        conn.execute(f"INSERT INTO src SELECT g, 'v' || g, g % 1000 FROM generate_series(1, {ROWS}) g")
    stop_file = tmp_path / "stop-writer"
    writer = subprocess.Popen([sys.executable, "-m", "flinkish_spark.testing.pg_writer", pg_url, str(stop_file),
                               "--keys", str(ROWS)])
    try:
        rng = random.Random(SEED)
        for _ in range(KILLS):
            delay = rng.uniform(0.0, 5.0)
            before = len(committed_batches(tmp_path / "cp"))
            run = run_pipeline(spec(tmp_path, pg_url, s3_proc), kill_after=delay,
                               kill_when=lambda: len(committed_batches(tmp_path / "cp")) > before)
            assert run.killed, f"expected a kill {delay:.1f}s after a commit, got rc={run.returncode}:\n{run.output[-3000:]}"
        # One more run killed once it committed a change epoch (random kills alone took 2-3 more runs to get there).
        run = run_pipeline(spec(tmp_path, pg_url, s3_proc), kill_after=rng.uniform(0.0, 3.0),
                           kill_when=lambda: change_epoch_committed(tmp_path))
        assert run.killed, run.output[-3000:]
        assert change_epoch_committed(tmp_path), "the killed runs never reached a committed change epoch"
    finally:
        stop_file.touch()
        writer.wait(timeout=60)

    last = run_pipeline(spec(tmp_path, pg_url, s3_proc, end="drain", stopAfterBatches=2))
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]

    options = {"AWS_ENDPOINT_URL": s3_proc, "AWS_ALLOW_HTTP": "true"}
    table = deltalake.DeltaTable("s3://test/mirror", storage_options=options)
    mirrored = sorted((r["id"], r["v"], r["n"]) for r in pa.table(table.scan()).to_pylist())
    with psycopg.connect(pg_url) as conn:
        source = sorted(conn.execute("SELECT id, v, n FROM src").fetchall())
        changed = conn.execute("SELECT count(*) FROM src WHERE v LIKE '%+%' OR v LIKE '%*%' OR id > 60000").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()[0] == 0
    assert changed > 50  # the writer really changed the table while the pipeline ran
    assert len(mirrored) == len(source) and mirrored == source
    assert sorted(table.schema().to_arrow().names) == ["id", "n", "v"]  # no change columns in the table
    io = FileIO.for_url("s3://test", {"endpoint_url": s3_proc})
    assert log_mentions(io, "s3://test/mirror", '"deletionVector"')
    assert unreferenced(io, "s3://test/mirror") == set()


def change_epoch_committed(tmp_path: Path) -> bool:
    """Whether Spark committed an epoch that read the slot's changes (the change split moved)."""
    from flinkish_spark.testing.postgres import committed_checkpoint

    done = committed_checkpoint(str(tmp_path / "cp"), str(tmp_path / "meta"), "mirror")
    change = None if done is None else next((s for s in done.splits if s.split_id.startswith("changes-")), None)
    return change is not None and change.position > 0
