"""``commitMode=prepared`` into a table with a primary key: earlier attempts never block an epoch's tasks.

A prepared transaction keeps the row locks of the keys it inserted until COMMIT/ROLLBACK
PREPARED. The attempts that wrote an epoch before -- a run that crashed past PREPARE, a task
attempt whose executor died past PREPARE -- must therefore be resolved before the epoch's
rows are written again; otherwise the new insert of the same key waits on them for ever, and
only the driver resolves them, after the tasks. And a wait on a lock nobody resolves (another
client's transaction) ends after ``lockTimeout`` with an error that says who holds the keys.

The sink class is driven as Spark drives it (prepare per task attempt, then commit_epoch on the
driver); each prepare that could hang runs in a thread with a deadline.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from flinkish_spark.connectors.postgres import PostgresSink
from flinkish_spark.errors import TargetWriteError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext

SCHEMA = StructType([StructField("id", LongType(), False), StructField("v", StringType())])


def q(url: str, sql: str, *params: Any) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as c:
        cur = c.execute(sql, params or None)
        return cur.fetchall() if cur.description else []


def rows(ids: range) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": pa.array(list(ids), pa.int64()), "v": [f"v{i}" for i in ids]})]


def within(seconds: float, fn: Callable[[], Any], unblock: Callable[[], None]) -> Any:
    """``fn()``, which must return within ``seconds``; if it hangs, ``unblock()`` frees it and the test fails."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        unblock()
        t.join(30)
        raise AssertionError(f"blocked for more than {seconds}s (a lock held by a prepared transaction)")
    if "error" in out:
        raise out["error"]
    return out["value"]


def rollback_all(url: str) -> None:
    for (gid,) in q(url, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"):
        q(url, f"ROLLBACK PREPARED '{gid}'")


def make_table(url: str) -> None:
    q(url, "CREATE TABLE events (id bigint PRIMARY KEY, v text)")


def test_a_crashed_runs_prepared_epoch_does_not_block_its_replay(pg_url: str, tmp_path: Path) -> None:
    make_table(pg_url)
    crashed = PostgresSink.create(pg_url, "events", uid="out", schema=SCHEMA, commit_mode="prepared")
    for part in (0, 1):  # both tasks of epoch 3 prepared, then the driver died before deciding
        crashed.prepare(iter(rows(range(part * 50, part * 50 + 50))), PrepareContext("out", 3, part, 0))
    assert len(q(pg_url, "SELECT gid FROM pg_prepared_xacts")) == 2

    replay = PostgresSink.create(pg_url, "events", uid="out", schema=SCHEMA, commit_mode="prepared")  # the restart
    prepared = [within(60, lambda p=part: replay.prepare(iter(rows(range(p * 50, p * 50 + 50))), PrepareContext("out", 3, p, 0)),
                       lambda: rollback_all(pg_url))
                for part in (0, 1)]
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "out")
    assert commit_epoch(replay, log, 3, prepared, "run-2").outcome == "COMMITTED"
    assert q(pg_url, "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM events") == [(100, 100, 0, 99)]
    assert q(pg_url, "SELECT gid FROM pg_prepared_xacts") == []


def test_a_task_retried_after_its_attempt_prepared_does_not_block(pg_url: str, tmp_path: Path) -> None:
    make_table(pg_url)
    sink = PostgresSink.create(pg_url, "events", uid="out", schema=SCHEMA, commit_mode="prepared")
    other = sink.prepare(iter(rows(range(50, 100))), PrepareContext("out", 0, 1, 0))
    # Attempt 0 of partition 0 prepared, then its executor died: Spark never got its message.
    sink.prepare(iter(rows(range(0, 50))), PrepareContext("out", 0, 0, 0))
    retry = within(60, lambda: sink.prepare(iter(rows(range(0, 50))), PrepareContext("out", 0, 0, 1)),
                   lambda: rollback_all(pg_url))
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "out")
    commit_epoch(sink, log, 0, [retry, other], "run-1")
    assert q(pg_url, "SELECT count(*), count(DISTINCT id) FROM events") == [(100, 100)]
    assert q(pg_url, "SELECT gid FROM pg_prepared_xacts") == []


def test_a_lock_held_by_someone_else_ends_after_lock_timeout_with_a_clear_error(pg_url: str) -> None:
    make_table(pg_url)
    with psycopg.connect(pg_url) as c:  # another client's prepared transaction holds key 7
        c.execute("INSERT INTO events VALUES (7, 'theirs')")
        c.execute("PREPARE TRANSACTION 'someone-else'")
    try:
        sink = PostgresSink.create(pg_url, "events", uid="out", schema=SCHEMA, commit_mode="prepared", lock_timeout=2)
        with pytest.raises(TargetWriteError, match=r"waited longer than lockTimeout \(2 s\) for a lock on public.events.*"
                                                   r"Prepared transactions in this database.*'someone-else'"):
            within(60, lambda: sink.prepare(iter(rows(range(0, 10))), PrepareContext("out", 0, 0, 0)),
                   lambda: q(pg_url, "ROLLBACK PREPARED 'someone-else'"))
        assert q(pg_url, "SELECT gid FROM pg_prepared_xacts") == [("someone-else",)]  # not ours: left alone
    finally:
        rollback_all(pg_url)
    assert q(pg_url, "SELECT count(*) FROM events") == [(0,)]
