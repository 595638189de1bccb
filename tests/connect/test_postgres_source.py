"""The ``flinkish.postgres`` CDC source through Spark Connect: snapshot, then changes, then a drain.

The source runs in the server; the drain's end -- the final checkpoint notification, which drops
the replication slot and publication -- is delivered by the client's finish controller as a
one-task job on the server. The target (a keyed ``flinkish.postgres`` table) must equal the
source table, and nothing of the source may be left on the PostgreSQL server.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
UID = "connectcdc"
SLOT = f"flinkish_{UID}"


def test_snapshot_then_changes_then_drain_mirrors_the_table(run_client, pg_url: str, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, v text, n int)")
        conn.execute("INSERT INTO src SELECT g, 'v' || g, g % 7 FROM generate_series(1, 3000) g")

    changed = threading.Event()

    def change_once_the_slot_exists() -> None:
        # Changes after the slot's creation (the first epoch) are the change split's to deliver.
        deadline = time.monotonic() + 180
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                if conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone():
                    conn.execute("INSERT INTO src SELECT g, 'new', 0 FROM generate_series(5001, 5100) g")
                    conn.execute("UPDATE src SET v = v || '+', n = n + 1 WHERE id % 10 = 3")
                    conn.execute("DELETE FROM src WHERE id % 10 = 7")
                    changed.set()
                    return
                time.sleep(0.1)

    writer = threading.Thread(target=change_once_the_slot_exists, daemon=True)
    writer.start()
    run = run_client({
        "source": {"format": "flinkish.postgres", "options": {
            "uid": UID, "checkpoint": str(tmp_path / "meta"), "url": pg_url, "table": "src",
            "splitSize": 500, "maxRowsPerTrigger": 1000}},
        "sink": {"format": "flinkish.postgres", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "dst", "checkpoint": str(tmp_path / "meta"), "url": pg_url, "table": "public.dst",
            "mode": "upsert", "key": "id", "deletes": "true", "createTable": "true"}},
        # The snapshot takes 3 epochs; the drain comes after the 5th, when the changes are in the WAL.
        "trigger": "1 second", "end": "drain", "stopAfterBatches": 5, "runSeconds": 240,
    }, timeout=400)
    writer.join(timeout=10)

    assert changed.is_set(), "the source never created its slot"
    assert run.returncode == 0 and "QUERY_END=drained" in run.output, run.output[-3000:]
    with psycopg.connect(pg_url) as conn:
        missing = conn.execute("SELECT count(*) FROM (SELECT * FROM src EXCEPT SELECT * FROM dst) d").fetchone()[0]
        extra = conn.execute("SELECT count(*) FROM (SELECT * FROM dst EXCEPT SELECT * FROM src) d").fetchone()[0]
        assert (missing, extra) == (0, 0)
        # The changes arrived: 300 updated old rows, 90 of the 100 new ones (10 deleted, 10 of the rest updated too).
        assert conn.execute("SELECT count(*) FROM dst WHERE v LIKE 'new%' OR v LIKE '%+'").fetchone()[0] == 300 + 90
        # The drained source's final notification (run on the server) dropped its slot and publication.
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s", (SLOT,)).fetchone()[0] == 0
