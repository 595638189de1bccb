"""``flinkish.postgres`` snapshotThenChanges: a table mirrored into another one, through kills and a drain.

A writer process inserts, updates (also keys) and deletes rows of the source table the
whole time. The pipeline (snapshot chunks, then the slot's changes) writes into a second
table through the ``flinkish.postgres`` sink in ``upsert`` mode with ``deletes=true``
(exactly-once, two-phase commit). It is killed with kill -9 (its whole process group:
driver, JVM, Python workers) at random moments -- a seeded random delay after the run
committed its first epoch (so that every run makes progress), which lands anywhere in the
1-second epoch cycle: planning, reading, the sink's prepare or commit, a notification -- and
restarted, until at least ``KILLS`` kills happened and a change epoch is committed. After each kill the slot's confirmed position is checked against the last
committed epoch. Then the writer stops, the pipeline is stopped with drain, and the target
must equal the source row for row, with no slot or publication left.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from flinkish_spark.connectors.postgres.pgoutput import parse_lsn
from flinkish_spark.testing.postgres import committed_checkpoint
from flinkish_spark.testing.spark_log import committed_batches

pytestmark = pytest.mark.slow

ROWS = 100_000
SPLIT = 12_500  # 8 chunks
UID = "mirror"
KILLS = 2  # at least; more (up to MAX_KILLS) while no change epoch is committed yet
MAX_KILLS = 6
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "11"))
SLOT = "flinkish_mirror"

WRITER = r'''
import os, random, sys, time, psycopg
url, stop_file = sys.argv[1], sys.argv[2]
rnd = random.Random(7)
next_id = 10_000_000
with psycopg.connect(url, autocommit=True) as conn:
    while not os.path.exists(stop_file):
        op = rnd.random()
        k = rnd.randint(1, 100_000)
        with conn.transaction():
            if op < 0.35:
                conn.execute("INSERT INTO src VALUES (%s, %s, %s)", (next_id, "new", next_id % 97))
                next_id += 1
            elif op < 0.7:
                conn.execute("UPDATE src SET v = v || '+', n = n + 1 WHERE id = %s", (k,))
                conn.execute("UPDATE src SET n = n * 2 WHERE id = %s", (k + 1,))
            elif op < 0.9:
                conn.execute("DELETE FROM src WHERE id = %s", (k,))
            else:
                conn.execute("UPDATE src SET id = %s WHERE id = %s", (next_id, k))  # a key change
                next_id += 1
        time.sleep(0.003)
'''


def slot_confirmed(url: str) -> int | None:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
    return None if row is None else parse_lsn(row[0])



def spec(tmp_path: Path, url: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": UID, "checkpoint": str(tmp_path / "meta"), "url": url, "table": "src",
            "splitSize": SPLIT, "maxRowsPerTrigger": 2 * SPLIT, "retainCheckpoints": 1000}},
        "sink": {"format": "flinkish.postgres", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "dst", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "public.dst",
            "mode": "upsert", "key": "id", "deletes": "true"}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_mirror_through_kills_and_drain_equals_the_source(pg_url, run_pipeline, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, v text, n int)")
        conn.execute(f"INSERT INTO src SELECT g, 'v' || g, g % 1000 FROM generate_series(1, {ROWS}) g")
        conn.execute("CREATE TABLE dst (id bigint PRIMARY KEY, v text, n int)")
    stop_file = tmp_path / "stop-writer"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, pg_url, str(stop_file)])
    try:
        rng = random.Random(SEED)
        start_lsn: int | None = None
        kills = 0
        reached_changes = False
        while kills < KILLS or (not reached_changes and kills < MAX_KILLS):
            delay = rng.uniform(0.0, 6.0)
            before = len(committed_batches(tmp_path / "cp"))
            run = run_pipeline(spec(tmp_path, pg_url), kill_after=delay, kill_when=lambda: len(committed_batches(tmp_path / "cp")) > before)
            assert run.killed, f"expected a kill {delay:.1f}s after a commit, got rc={run.returncode}:\n{run.output[-3000:]}"
            kills += 1
            confirmed = slot_confirmed(pg_url)
            done = committed_checkpoint(str(tmp_path / "cp"), str(tmp_path / "meta"), UID)
            change = None if done is None else next((s for s in done.splits if s.split_id.startswith("changes-")), None)
            if confirmed is None:
                # Killed before the first epoch created the slot: then nothing is committed either.
                assert done is None, (kills, delay)
            elif change is None or change.position == 0:
                # No change epoch committed yet: the slot has not moved from where it was created.
                start_lsn = confirmed if start_lsn is None else start_lsn
                assert confirmed == start_lsn, (kills, delay, confirmed, start_lsn)
            else:
                # Never past the end of the last committed epoch (it lags by at most that epoch).
                assert confirmed <= change.position, (kills, delay, confirmed, change.position)
                reached_changes = True
        assert reached_changes, f"{kills} kills never reached a committed change epoch"
    finally:
        stop_file.touch()
        writer.wait(timeout=60)

    last = run_pipeline(spec(tmp_path, pg_url, end="drain", stopAfterBatches=2))
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]

    with psycopg.connect(pg_url) as conn:
        count = conn.execute("SELECT count(*) FROM src").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM dst").fetchone()[0] == count
        missing = conn.execute("SELECT count(*) FROM (SELECT * FROM src EXCEPT SELECT * FROM dst) d").fetchone()[0]
        extra = conn.execute("SELECT count(*) FROM (SELECT * FROM dst EXCEPT SELECT * FROM src) d").fetchone()[0]
        assert (missing, extra) == (0, 0)
        changed = conn.execute("SELECT count(*) FROM src WHERE v LIKE '%+' OR id > 100000").fetchone()[0]
        assert changed > 50  # the writer really changed the table while the pipeline ran
        # A drained source drops the slot and publication it created (final notification).
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s", (SLOT,)).fetchone()[0] == 0
