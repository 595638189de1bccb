"""``flinkish.postgres`` source: the end of a drain is delivered twice at once, and neither may fail.

After the drain epoch is committed, two parties deliver its "checkpoint complete" -- which
advances the slot to the epoch's end and then drops the slot and publication the source created
-- at the same moment: the finish controller (the final notification, in the driver's process)
and Spark's next trigger (``latestOffset`` notifies the previous epoch; under
``processingTime='0 seconds'`` it comes at once). Each looks at the slot, then acts on it; the
one that comes second must take "already gone" as done. Seen before the fix in 20 drains under a
zero interval: a query that had drained completely failed in ``latestOffset`` ("replication slot
... does not exist"), and the controller logged a failed final notification.

Two tests: a deterministic interleaving (the other party drops the slot between this one's look
and its act, for the advance and for the drop), and two source copies delivering the same final
checkpoint from two threads at once, many times.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import psycopg

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource


class DropsFirst:
    """A connection on which, just before the given statement runs, ``other`` happens (the other party)."""

    def __init__(self, conn: psycopg.Connection, statement: str, other: Callable[[], None]) -> None:
        self.conn, self.statement, self.other = conn, statement, other

    def execute(self, sql: Any, params: Any = None) -> Any:
        text = sql if isinstance(sql, str) else sql.as_string(self.conn)
        if self.statement in text and self.other is not None:
            other, self.other = self.other, None
            other()
        return self.conn.execute(sql, params)


def source(url: str, tmp_path: Path) -> PostgresSourceDataSource:
    src = PostgresSourceDataSource({"uid": "dr", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "t"})
    src.setup_source()
    return src


def drop_elsewhere(url: str) -> Callable[[], None]:
    def run() -> None:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT pg_drop_replication_slot('flinkish_dr')")
    return run


def test_the_slot_dropped_between_look_and_act_is_taken_as_done(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        src = source(pg_url, tmp_path)
        src.create_enumerator().discover(set())  # creates publication and slot, claimed as the source's
        owned = slots.Ownership.read(src.io, src.checkpoint_store().directory)
        assert owned is not None
        lsn = slots.start_lsn(conn, "flinkish_dr") + 1
        # The other party drops the slot after this one saw it and before it advances it.
        assert slots.advance(DropsFirst(conn, "pg_replication_slot_advance", drop_elsewhere(pg_url)), "flinkish_dr", lsn) is False
        conn.execute("SELECT pg_create_logical_replication_slot('flinkish_dr', 'pgoutput')")
        # ... and after this one saw it and before it drops it.
        slots.drop(DropsFirst(conn, "pg_drop_replication_slot", drop_elsewhere(pg_url)), owned)
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'flinkish_dr'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = 'flinkish_dr'").fetchone()[0] == 0


def test_two_copies_deliver_the_final_checkpoint_at_once(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    for i in range(30):
        src = source(pg_url, tmp_path / str(i))
        enum = src.create_enumerator()
        chunks = enum.discover(set())
        state = enum.snapshot_state()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (%s)", (i,))
            end = slots.start_lsn(conn, "flinkish_dr") + 64
        final = SourceCheckpoint("dr", src.name(), 5, 4, 0, "{}", state, True,
                                 tuple(SplitRecord(s.split_id, 0, 1, 1, True, 1) for s in chunks)
                                 + (SplitRecord("changes-0", 0, end, end, True, 5),))
        copies = [source(pg_url, tmp_path / str(i)).create_enumerator() for _ in range(2)]  # worker and controller
        for c in copies:
            c.restore(state)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def deliver(enumerator: Any) -> None:
            try:
                barrier.wait()
                enumerator.on_checkpoint_complete(final)
            except BaseException as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        threads = [threading.Thread(target=deliver, args=(c,)) for c in copies]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], f"delivery {i}: {errors}"
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'flinkish_dr'").fetchone()[0] == 0
