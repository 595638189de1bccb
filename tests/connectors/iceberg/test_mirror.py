"""Acceptance (issue 17): a PostgreSQL table mirrored into an Iceberg table on S3 -- ``flinkish.postgres``
(snapshotThenChanges) -> ``flinkish.iceberg`` mode=upsert, deletes=true, the key the source carries --
while another client inserts, updates (the same keys many times per epoch, and keys themselves) and
deletes; kill -9 of the whole driver at random moments after it committed an epoch, restarts, then a
drain stop. The table read back by pyiceberg (which applies the position deletes) equals the source,
no key twice, nothing on storage the table does not name, no slot left."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.spark_log import committed_batches

pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = [pytest.mark.slow, pytest.mark.s3]

ROWS = 20_000
SPLIT = 5_000
KILLS = 1  # then one more in the change stream; the keyed commit's own points: the keyed matrix of test_crash.py (docs/testing.md)
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "5"))

WRITER = r'''
import os, random, sys, time, psycopg
url, stop_file = sys.argv[1], sys.argv[2]
rnd = random.Random(3)
next_id = 10_000_000
with psycopg.connect(url, autocommit=True) as conn:
    while not os.path.exists(stop_file):
        op = rnd.random()
        k = rnd.randint(1, 300)  # a small hot set: the same keys change many times per epoch
        with conn.transaction():
            if op < 0.25:
                conn.execute("INSERT INTO src VALUES (%s, %s, %s)", (next_id, "new", next_id % 97))
                next_id += 1
            elif op < 0.75:
                conn.execute("UPDATE src SET v = v || '+', n = n + 1 WHERE id = %s", (k,))
                conn.execute("UPDATE src SET n = n * 2 WHERE id = %s", (rnd.randint(1, 20_000),))
            elif op < 0.9:
                conn.execute("DELETE FROM src WHERE id = %s", (rnd.choice([k, rnd.randint(1, 20_000)]),))
            else:
                conn.execute("UPDATE src SET id = %s WHERE id = %s", (next_id, k))  # a key change
                next_id += 1
        time.sleep(0.003)
'''



def spec(tmp_path: Path, url: str, s3: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "pg", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "src",
            "splitSize": SPLIT, "maxRowsPerTrigger": 2 * SPLIT}},
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "mirror", "table": "db.src", "catalogUri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": "s3://test/wh", "endpointUrl": s3, "mode": "upsert", "deletes": "true"}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_postgres_mirror_into_iceberg_through_kills_and_drain_equals_the_source(pg_url, run_pipeline, s3_proc: str,
                                                                                tmp_path: Path) -> None:
    import psycopg
    from pyiceberg.catalog.sql import SqlCatalog

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, v text, n int)")
        conn.execute(f"INSERT INTO src SELECT g, 'v' || g, g % 1000 FROM generate_series(1, {ROWS}) g")
    stop_file = tmp_path / "stop-writer"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, pg_url, str(stop_file)])
    try:
        rng = random.Random(SEED)
        for _ in range(KILLS):
            before = len(committed_batches(tmp_path / "cp"))
            run = run_pipeline(spec(tmp_path, pg_url, s3_proc), kill_after=rng.uniform(0.0, 5.0),
                               kill_when=lambda: len(committed_batches(tmp_path / "cp")) > before)
            assert run.killed, run.output[-3000:]
        # one more run long enough to reach the change stream
        run = run_pipeline(spec(tmp_path, pg_url, s3_proc), kill_after=rng.uniform(0.0, 3.0),
                           kill_when=lambda: len(committed_batches(tmp_path / "cp")) >= ROWS // (2 * SPLIT) + 3)
        assert run.killed, run.output[-3000:]
    finally:
        stop_file.touch()
        writer.wait(timeout=60)
    last = run_pipeline(spec(tmp_path, pg_url, s3_proc, end="drain", stopAfterBatches=2))
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]

    catalog = SqlCatalog("flinkish", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse="s3://test/wh",
                         **{"s3.endpoint": s3_proc})
    table = catalog.load_table("db.src")
    got = table.scan().to_arrow()
    assert [f.name for f in table.schema().fields] == ["id", "v", "n"]  # the key came from the source
    ids = got["id"].to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    mirrored = set(zip(ids, got["v"].to_pylist(), got["n"].to_pylist()))
    with psycopg.connect(pg_url) as conn:
        source = set(conn.execute("SELECT id, v, n FROM src").fetchall())
        changed = conn.execute("SELECT count(*) FROM src WHERE v LIKE '%+' OR id > 20000").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
    assert changed > 50 and mirrored == source
    assert int(table.current_snapshot().summary["total-position-deletes"]) > 0  # merge-on-read did the work
    io = FileIO.for_url("s3://test", {"endpoint_url": s3_proc})
    named = set()
    for task in table.scan().plan_files():
        named.add(io.strip(task.file.file_path))
        named.update(io.strip(d.file_path) for d in task.delete_files)
    assert set(io.find("s3://test/wh/db/src/data")) - named == set()
