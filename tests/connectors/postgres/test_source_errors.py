"""``flinkish.postgres`` source: each bad setup is one clear error, and nothing is written.

wal_level not logical, no REPLICATION privilege, a table without primary key, a slot or
publication of the source's name that something else owns, the slot lost while the source
was stopped (and ``onSlotLost=resnapshot`` to start again with a new snapshot).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import flinkish_spark


def load(spark: Any, url: str, tmp_path: Path, uid: str, **options: Any) -> Any:
    reader = spark.readStream.format("flinkish.postgres")
    for k, v in {"uid": uid, "checkpoint": str(tmp_path / "meta"), "url": url, **options}.items():
        reader = reader.option(k, str(v))
    return reader.load()


def start(df: Any, tmp_path: Path, trigger: str = "availableNow") -> Any:
    w = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("checkpoint", str(tmp_path / "meta"))
         .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "cp")))
    w = w.trigger(availableNow=True) if trigger == "availableNow" else w.trigger(processingTime=trigger)
    return w.start()


def nothing_written(tmp_path: Path, uid: str) -> bool:
    meta = tmp_path / "meta" / "sources" / uid
    return not list(meta.glob("*.parquet")) and not list((tmp_path / "out").glob("*.parquet"))


def execute(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def failure(query: Any) -> str:
    end = flinkish_spark.await_finished(query, timeout=120)
    assert end == "failed", end
    return str(query.exception())


@pytest.fixture(scope="module")
def replica_server() -> Any:
    import os

    if os.environ.get("FLINKISH_TEST_POSTGRES_URL"):
        pytest.skip("needs a second embedded server")
    from flinkish_spark.embedded.postgres import temporary_postgres

    with temporary_postgres("flinkish-test-pg-replica-", settings={"wal_level": "replica"}) as server:
        yield server


def test_wal_level_not_logical_says_how_to_set_it(spark, replica_server, tmp_path: Path) -> None:
    url = replica_server.uri
    execute(url, "DROP TABLE IF EXISTS t", "CREATE TABLE t (id int PRIMARY KEY)")
    with pytest.raises(Exception, match=r"PostgresSourceError.*wal_level is 'replica'.*ALTER SYSTEM SET wal_level = 'logical'"):
        load(spark, url, tmp_path, "w", table="t")
    assert nothing_written(tmp_path, "w")


def test_no_replication_privilege(spark, postgres, pg_url, tmp_path: Path) -> None:
    execute(pg_url, "CREATE TABLE t (id int PRIMARY KEY)", "DROP ROLE IF EXISTS plain_reader",
            "CREATE ROLE plain_reader LOGIN", "GRANT SELECT ON t TO plain_reader")
    url = pg_url.replace("postgres@", "plain_reader@", 1)
    with pytest.raises(Exception, match=r"role 'plain_reader' has no REPLICATION privilege.*ALTER ROLE plain_reader WITH REPLICATION"):
        load(spark, url, tmp_path, "p", table="t")
    assert nothing_written(tmp_path, "p")


def test_table_without_primary_key_is_refused_unless_split_column_for_a_snapshot(spark, pg_url, tmp_path: Path) -> None:
    execute(pg_url, "CREATE TABLE nokey (k int, v text)",
            "INSERT INTO nokey SELECT g, 'v' || g FROM generate_series(1, 1000) g",
            "INSERT INTO nokey VALUES (NULL, 'null key'), (5, 'dup')")
    with pytest.raises(Exception, match=r"public.nokey has no primary key.*'splitColumn'"):
        load(spark, pg_url, tmp_path, "nk", table="nokey")
    with pytest.raises(Exception, match=r"option 'splitColumn' names 'nope'"):
        load(spark, pg_url, tmp_path, "nk", table="nokey", startup="snapshot", splitColumn="nope")
    assert nothing_written(tmp_path, "nk")
    # With a split column a snapshot works; equal values share a chunk, NULLs go to the last one.
    q = start(load(spark, pg_url, tmp_path, "nk", table="nokey", startup="snapshot", splitColumn="k", splitSize=300), tmp_path)
    assert flinkish_spark.await_finished(q, timeout=180) == "finished"
    rows = pq.read_table(str(tmp_path / "out")).to_pylist()
    assert sorted((r["k"] is None, r["k"] or 0, r["v"]) for r in rows) == sorted(
        [(False, g, f"v{g}") for g in range(1, 1001)] + [(True, 0, "null key"), (False, 5, "dup")])


def test_slot_or_publication_of_that_name_owned_by_something_else(spark, pg_url, tmp_path: Path) -> None:
    execute(pg_url, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)",
            "SELECT pg_create_logical_replication_slot('flinkish_taken', 'pgoutput')")
    try:
        q = start(load(spark, pg_url, tmp_path / "a", "taken", table="t"), tmp_path / "a")
        assert "replication slot named 'flinkish_taken' already exists and was not created by this source" in failure(q)
        assert nothing_written(tmp_path / "a", "taken")
    finally:
        execute(pg_url, "SELECT pg_drop_replication_slot('flinkish_taken')")
    execute(pg_url, "CREATE PUBLICATION flinkish_pubtaken FOR ALL TABLES")
    q = start(load(spark, pg_url, tmp_path / "b", "pubtaken", table="t"), tmp_path / "b")
    assert "publication named 'flinkish_pubtaken' already exists and was not created by this source" in failure(q)
    assert nothing_written(tmp_path / "b", "pubtaken")
    import psycopg

    with psycopg.connect(pg_url) as conn:  # refused before creating anything
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'flinkish_pubtaken'").fetchone()[0] == 0


@pytest.mark.both_postgres
def test_slot_lost_while_stopped_is_refused_then_resnapshot_starts_over(spark, pg_url, tmp_path: Path) -> None:
    execute(pg_url, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
    q = start(load(spark, pg_url, tmp_path, "lost", table="t"), tmp_path, trigger="1 second")
    deadline = time.time() + 120
    while (q.lastProgress is None or q.lastProgress.batchId < 1) and time.time() < deadline:
        time.sleep(0.5)
    assert flinkish_spark.stop(q, drain=False, timeout=120) == "stopped"
    before = pq.read_table(str(tmp_path / "out")).num_rows
    assert before == 100
    # Stopped without drain: the slot is kept, and `flinkish inspect` shows it and the WAL it holds.
    from flinkish_spark.inspect import postgres_slots
    from flinkish_spark.io.fileio import FileIO

    (shown,) = postgres_slots(FileIO.for_url(str(tmp_path / "meta")), str(tmp_path / "meta"))
    assert shown.slot == "flinkish_lost" and shown.confirmed_lsn and shown.wal_held_back_bytes is not None, shown
    execute(pg_url, "SELECT pg_drop_replication_slot('flinkish_lost')", "UPDATE t SET v = 'lost' WHERE id = 1")

    q = start(load(spark, pg_url, tmp_path, "lost", table="t"), tmp_path, trigger="1 second")
    msg = failure(q)
    assert "replication slot 'flinkish_lost' is missing" in msg and "onSlotLost=resnapshot" in msg
    assert pq.read_table(str(tmp_path / "out")).num_rows == before  # nothing written

    q = start(load(spark, pg_url, tmp_path, "lost", table="t", onSlotLost="resnapshot"), tmp_path, trigger="1 second")
    deadline = time.time() + 120
    while pq.read_table(str(tmp_path / "out")).num_rows < 200 and time.time() < deadline and q.isActive:
        time.sleep(0.5)
    assert flinkish_spark.stop(q, drain=True, timeout=120) == "drained"
    rows = pq.read_table(str(tmp_path / "out")).to_pylist()
    again = [r for r in rows if r["_op"] == "r"]
    assert len(again) == 200 and {r["v"] for r in again if r["id"] == 1} == {"a", "lost"}  # read again, with the lost change
