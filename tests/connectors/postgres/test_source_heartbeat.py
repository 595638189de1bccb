"""Idle followed tables in a busy database: the slot still advances (``heartbeatInterval``), exactly once.

End to end: a multi-table source follows two tables that never change while another table of
the database (outside the pattern) gets about 80 MB of WAL. Run 1 (1-second trigger,
``startup=changes``) is killed with kill -9 in the commit of its second epoch -- the first is the
empty epoch that registers the change split, the second can only be a heartbeat epoch, since
nothing of ours changed: until it is committed the slot must keep every byte. Run 2 replays and
commits it, and the slot's retained WAL (``pg_current_wal_lsn() - restart_lsn``) and its
``confirmed_flush_lsn`` lag must drop below a bound soon, also after a second burst while it
runs. Then a row inserted into a followed table must arrive exactly once.

Without a query: a heartbeat comes only once the slot holds a WAL segment, at most once per
interval, its range holds no rows, and its completion advances the slot. On PostgreSQL 18 and
15 (which, unlike 14 and older, sends nothing for a transaction without a change of the
publication).

The end-to-end test runs on PostgreSQL 18 only. What depends on the server's version is checked on
both by the test without a query: the peek of the slot finds nothing for the other table's
transactions (15 and later send nothing for them), so the heartbeat is what ends a range, at the
flush position; ``pg_replication_slot_advance`` at its completion moves the slot past the other
table's WAL; the next change of a followed table is read after it. What the end-to-end test adds
-- a kill -9 in the commit of a heartbeat epoch, its replay from the checkpoint, exactly-once
output, the slot released again while the query runs -- is the source's checkpoint and commit
code and the same server calls, with nothing that asks which version it talks to; a second
version cost ~30-40 s of a quiet CI machine for no other check.
"""

from __future__ import annotations

import collections
import glob
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
import pyarrow.parquet as pq
import pytest

from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource
from flinkish_spark.errors import ConfigError
from flinkish_spark.testing.mirror import replay


UID = "hb"
SLOT = "flinkish_hb"
MB = 1024 * 1024
BURST = 80 * MB
#: Retained WAL the slot must get below: a heartbeat epoch is made once it holds a WAL segment (16 MB).
BOUND = 24 * MB


def spec(tmp_path: Path, url: str) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": UID, "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.m_*",
            "startup": "changes", "heartbeatInterval": 1}},
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "out")}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 240,
        "stopWhenExists": str(tmp_path / "stop"),
    }


def held(url: str) -> tuple[int, int] | None:
    """(bytes from restart_lsn, bytes from confirmed_flush_lsn) to the current WAL position, or None: no slot yet."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def burst(url: str, nbytes: int) -> None:
    """About ``nbytes`` of WAL into the table outside the pattern, in transactions of ~10 MB."""
    with psycopg.connect(url, autocommit=True) as conn:
        start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        while conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (start,)).fetchone()[0] < nbytes:
            conn.execute("INSERT INTO other (pad) SELECT repeat('x', 1000) FROM generate_series(1, 10000)")


def held_text(url: str) -> str:
    h = held(url)
    return "no slot" if h is None else f"{h[0] / MB:.1f} MB from restart_lsn, {h[1] / MB:.1f} MB from confirmed_flush_lsn"


def wait_for(what: str, condition: Callable[[], Any], seconds: float, url: str, run: tuple[threading.Thread, list],
             stop: Path) -> None:
    """Poll ``condition``; else end the run (gracefully) and fail with the slot's figures and the run's output."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    slot = held_text(url)
    stop.touch()
    run[0].join(60)
    raise AssertionError(f"not within {seconds:.0f}s: {what} (slot: {slot})\n" + (run[1][0].output[-3000:] if run[1] else ""))


def in_background(run_pipeline: Any, spec_: dict, **kw: Any) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(run_pipeline(spec_, **kw)), daemon=True)
    t.start()
    return t, out


def changes(out: str) -> collections.Counter[tuple[str, str]]:
    """(table, _op) -> how many rows of that kind the exactly-once output holds."""
    rows: collections.Counter[tuple[str, str]] = collections.Counter()
    for f in glob.glob(os.path.join(out, "**", "part-*.parquet"), recursive=True):
        for r in pq.read_table(f, columns=["_table", "_op"]).to_pylist():
            if r["_op"] in ("r", "c", "u", "d"):
                rows[(r["_table"], r["_op"])] += 1
    return rows


@pytest.mark.parametrize("options, message", [
    ({"heartbeatInterval": "0"}, "option 'heartbeatInterval' must be > 0"),
    ({"heartbeatInterval": "5", "startup": "snapshot"}, "startup=snapshot uses no replication slot; drop the options "
                                                        "slotName, publication, onSlotLost and heartbeatInterval"),
])
def test_heartbeat_interval_is_checked(options: dict, message: str, tmp_path: Path) -> None:
    src = PostgresSourceDataSource({"uid": "hb", "checkpoint": str(tmp_path), "url": "postgresql://u@h/db",
                                    "tables": "public.*", **options})
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        src.setup_source()


@pytest.mark.both_postgres
def test_a_heartbeat_range_ends_at_the_flush_position_holds_no_rows_and_comes_at_most_every_interval(
        spark, pg_url, tmp_path: Path) -> None:
    """The enumerator and reader of a single-table source, without a query (Spark only parses the schema)."""
    from pyspark.sql.types import StructType

    from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
    from flinkish_spark.connectors.postgres.pgoutput import parse_lsn

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE other (id bigserial PRIMARY KEY, pad text)")
        src = PostgresSourceDataSource({"uid": "hb", "checkpoint": str(tmp_path / "meta"), "url": pg_url, "table": "t",
                                        "startup": "changes", "heartbeatInterval": "3600"})
        src.setup_source()
        enum = src.create_enumerator()
        (changes,) = enum.discover(set())
        burst(pg_url, 1 * MB)
        enum.dialect.heartbeat_at = float("-inf")  # the interval has passed
        assert enum.extent(changes, 0).available == 0  # the slot holds less than a WAL segment: no epoch
        burst(pg_url, 20 * MB)
        end = enum.extent(changes, 0).available
        flush = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        assert 0 < end <= flush and held(pg_url)[0] >= 20 * MB  # a heartbeat: the range ends at the flush position
        assert enum.extent(changes, 0).available == 0  # the next one an interval later, not at the next trigger
        reader = src.create_reader(StructType.fromDDL(src.table_info().spark_ddl()))
        assert [b.num_rows for b in reader.read(changes, 0, end)] == []  # no rows, on every read
        assert [b.num_rows for b in reader.read(changes, 0, end)] == []
        enum.on_checkpoint_complete(SourceCheckpoint("hb", src.name(), 1, None, 0, "{}", enum.snapshot_state(), False,
                                                     (SplitRecord(changes.split_id, 0, end),)))
        confirmed = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                 (SLOT,)).fetchone()[0]
        assert parse_lsn(confirmed) == end  # its completion advanced the slot past the other table's WAL
        conn.execute("INSERT INTO t VALUES (1, 'a')")
        rows = [r for b in reader.read(changes, end, enum.extent(changes, end).available) for r in b.to_pylist()]
        assert [(r["id"], r["_op"]) for r in rows] == [(1, "c")]  # the next change of ours, in the next range
        conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))


@pytest.mark.slow
def test_idle_tables_in_a_busy_database_release_the_wal_exactly_once(pg_url, run_pipeline, tmp_path: Path) -> None:
    stop, out = tmp_path / "stop", str(tmp_path / "out")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for t in ("m_a", "m_b"):
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {t} SELECT g, 'old' FROM generate_series(1, 10) g")
        conn.execute("CREATE TABLE other (id bigserial PRIMARY KEY, pad text)")

    # Run 1: killed in the commit of the heartbeat epoch (the second epoch of the run).
    run = thread, result = in_background(run_pipeline, spec(tmp_path, pg_url), crash_at="sink.before_decision:2")
    wait_for("the source made its slot", lambda: held(pg_url) is not None or not thread.is_alive(), 120, pg_url, run, stop)
    assert thread.is_alive(), result[0].output[-3000:]
    burst(pg_url, BURST)
    thread.join(90)
    if thread.is_alive():
        stop.touch()
        thread.join(60)
        raise AssertionError(f"no epoch in 90 s after {BURST // MB} MB of WAL while the followed tables were idle "
                             f"(slot: {held_text(pg_url)})")
    assert result[0].killed, result[0].output[-3000:]
    h = held(pg_url)
    assert h is not None and h[0] >= BURST, f"the slot moved before the heartbeat epoch was committed: {held_text(pg_url)}"

    # Run 2: replays the heartbeat epoch, commits it, the slot moves; again after a second burst.
    run = thread, result = in_background(run_pipeline, spec(tmp_path, pg_url))
    released = lambda: (h := held(pg_url)) is not None and h[0] < BOUND and h[1] < BOUND  # noqa: E731
    t0 = time.monotonic()
    wait_for(f"the slot holds < {BOUND // MB} MB after the replay", released, 120, pg_url, run, stop)
    first = time.monotonic() - t0
    burst(pg_url, BURST)
    t0 = time.monotonic()
    wait_for(f"the slot holds < {BOUND // MB} MB after a second burst", released, 90, pg_url, run, stop)
    second = time.monotonic() - t0
    print(f"released after the restart in {first:.1f}s, after the second burst in {second:.1f}s")

    # A change of a followed table still arrives, once.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO m_a VALUES (1000, 'new')")
    wait_for("the new row arrived", lambda: changes(out), 90, pg_url, run, stop)
    stop.touch()
    thread.join(120)
    assert not thread.is_alive() and result[0].returncode == 0, result[0].output[-3000:] if result else "still running"

    assert changes(out) == {("public.m_a", "c"): 1}  # the insert, once; nothing of 'other', nothing of the idle rows
    assert replay(out)[0] == {"public.m_a": {("1000",): {"id": 1000, "v": "new"}}}
