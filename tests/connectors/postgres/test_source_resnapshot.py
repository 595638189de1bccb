"""``flinkish.postgres`` source: a slot the server *invalidated* (``max_slot_wal_keep_size``) while the
query was stopped -- the usual way a slot is lost -- and ``onSlotLost=resnapshot``.

A mirror (source -> ``flinkish.postgres`` sink, upsert with deletes) runs, is stopped, and while
it is stopped rows are deleted, updated and inserted, then enough WAL is written and a checkpoint
taken that the server invalidates the slot. Restarted with the default ``onSlotLost=fail`` the
query refuses to start; with ``resnapshot`` the invalidated slot is dropped and made again, the
table is read again, and the target must equal the table -- also without the rows deleted while
no slot kept their WAL. On a server of its own per version (18 and the machine's 15), started
with ``max_slot_wal_keep_size = 1MB``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

import flinkish_spark

POSTGRES_15_BIN = "/usr/lib/postgresql/15/bin"


@pytest.fixture(scope="module", params=["pg18", "pg15"])
def small_wal_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    if os.environ.get("FLINKISH_TEST_POSTGRES_URL"):
        pytest.skip("needs servers of its own (restarted with max_slot_wal_keep_size)")
    bin_dir = None
    if request.param == "pg15":
        if not os.path.isfile(os.path.join(POSTGRES_15_BIN, "postgres")):
            pytest.skip(f"no PostgreSQL 15 installed in {POSTGRES_15_BIN} (apt-get install postgresql-15)")
        bin_dir = POSTGRES_15_BIN
    from flinkish_spark.embedded.postgres import temporary_postgres

    with temporary_postgres("flinkish-test-small-wal-", settings={"max_slot_wal_keep_size": "1MB"}, bin_dir=bin_dir) as server:
        yield server


def q(url: str, sql: str, *params: Any) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as c:
        cur = c.execute(sql, params or None)
        return cur.fetchall() if cur.description else []


def start(spark: Any, url: str, tmp_path: Path, **options: str) -> Any:
    reader = spark.readStream.format("flinkish.postgres")
    for k, v in {"uid": "m", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "src", **options}.items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.format("flinkish.postgres").option("uid", "dst").option("url", url)
            .option("table", "dst").option("mode", "upsert").option("key", "id").option("deletes", "true")
            .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="1 second").start())


def wait_until(condition: Any, query: Any, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert query.isActive, query.exception()
        assert time.time() < deadline, "timed out"
        time.sleep(0.5)


def table(url: str, name: str) -> list[tuple]:
    return q(url, f"SELECT id, v FROM {name} ORDER BY id")


def test_an_invalidated_slot_is_refused_then_resnapshot_makes_the_keyed_target_equal_the_table(
        spark, small_wal_server, tmp_path: Path) -> None:
    admin = small_wal_server.uri
    q(admin, "DROP DATABASE IF EXISTS resnap WITH (FORCE)")
    q(admin, "CREATE DATABASE resnap")
    url = small_wal_server.uri_for("resnap")
    q(url, "CREATE TABLE src (id int PRIMARY KEY, v text)")
    q(url, "INSERT INTO src SELECT g, 'a' FROM generate_series(1, 100) g")
    q(url, "CREATE TABLE dst (id int PRIMARY KEY, v text)")

    query = start(spark, url, tmp_path)
    q(url, "UPDATE src SET v = 'b' WHERE id = 50")  # a change, read through the slot
    wait_until(lambda: table(url, "dst") == table(url, "src"), query)
    assert flinkish_spark.stop(query, drain=False, timeout=120) == "stopped"

    # While the query is stopped: changes, then the server invalidates the slot that kept them.
    q(url, "DELETE FROM src WHERE id <= 10")
    q(url, "UPDATE src SET v = 'gap' WHERE id = 11")
    q(url, "INSERT INTO src VALUES (101, 'new')")
    q(url, "CREATE TABLE junk AS SELECT g, repeat(md5(g::text), 8) AS v FROM generate_series(1, 20000) g")
    q(url, "SELECT pg_switch_wal()")
    q(url, "CHECKPOINT")
    assert q(url, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'flinkish_m'") == [("lost",)]

    refused = start(spark, url, tmp_path)
    assert flinkish_spark.await_finished(refused, timeout=120) == "failed"
    message = str(refused.exception())
    assert "replication slot 'flinkish_m' is lost" in message and "onSlotLost=resnapshot" in message, message

    query = start(spark, url, tmp_path, onSlotLost="resnapshot")
    wait_until(lambda: table(url, "dst") == table(url, "src"), query)
    q(url, "UPDATE src SET v = 'after' WHERE id = 12")  # the new slot's changes flow
    wait_until(lambda: table(url, "dst") == table(url, "src"), query)
    assert flinkish_spark.stop(query, drain=True, timeout=120) == "drained"

    assert table(url, "dst") == table(url, "src")
    assert [r[0] for r in table(url, "dst")][:2] == [11, 12]  # the rows deleted in the gap are gone
    assert q(url, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'flinkish_m'") == [(0,)]
    # The sink's bookkeeping of the re-snapshot is gone once it is applied.
    assert q(url, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'flinkish_seen%'") == []
