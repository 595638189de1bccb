"""``flinkish mirror`` and matching tables without a primary key: left out with a warning, never an error.

One mirror (the command, into local Delta tables) over ``public.k_*``:

* ``k_a`` has a primary key; ``k_ri`` has none but ``REPLICA IDENTITY USING INDEX`` on a unique
  index (its key: the index's column); ``k_nokey`` has none at the start; ``k_scratch`` is created
  without one while the mirror runs (someone's scratch table).
* The keyed tables are snapshotted and followed; the keyless ones are reported -- the progress
  lines and ``flinkish inspect`` say which and what to do -- and the mirror keeps running.
* ``ALTER TABLE k_nokey ADD PRIMARY KEY`` while it runs: the next catalog poll picks it up
  (snapshot, then its changes) without a restart -- and the driver is killed with kill -9 inside
  the commit of the epoch that writes that snapshot (crash point ``delta.keyed.before_version``:
  the target's version 0 written, the epoch's version not yet). The same command again continues
  from the checkpoint. After a drain every followed target equals its table, ``k_scratch`` has
  none, and only ``k_scratch`` is still reported as not followed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.faults import ENV_DIR, ENV_POINT
from flinkish_spark.mirror.compare import delta_reader
from flinkish_spark.testing.mirror import delta_differences, table_states
from flinkish_spark.testing.mirror_process import ended, flinkish, start, wait_for

pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

SETUP = """
CREATE TABLE k_a (id int PRIMARY KEY, v text);
CREATE TABLE k_ri (code text NOT NULL, v text);
CREATE UNIQUE INDEX k_ri_code ON k_ri (code);
ALTER TABLE k_ri REPLICA IDENTITY USING INDEX k_ri_code;
CREATE TABLE k_nokey (id int NOT NULL, v text);
INSERT INTO k_a SELECT g, 'a' || g FROM generate_series(1, 200) g;
INSERT INTO k_ri SELECT 'c' || g, 'r' || g FROM generate_series(1, 200) g;
INSERT INTO k_nokey SELECT g, 'n' || g FROM generate_series(1, 200) g;
"""

#: The crash point of the kill: every table's keyed Delta commit passes it (after its files, before its version).
POINT = "delta.keyed.before_version"
#: The hit that kills; the test sets the counter to one below it once only k_nokey's snapshot can commit next.
KILL_AT = 1000


def inspect(meta: Path) -> str:
    out = subprocess.run([*flinkish(), "inspect", str(meta)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_tables_without_a_key_are_left_out_with_a_warning_and_picked_up_once_they_have_one(
        pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    meta = tmp_path / "meta"
    cmd = [*flinkish(), "mirror", "--from", pg_url, "--tables", "public.k_*", "--to", str(tmp_path / "lake"),
           "--checkpoint", str(meta), "--trigger", "1s", "--source-option", "discoveryInterval=1"]
    log = tmp_path / "run.log"
    crashes = tmp_path / "crashes"
    crashes.mkdir()
    # Armed, but far away: the earlier epochs' commits count a few hits (see the kill below).
    proc = start(cmd, log, {ENV_POINT: f"{POINT}:{KILL_AT}", ENV_DIR: str(crashes)})
    try:
        wait_for("the snapshot of the keyed tables", lambda: "tables snapshotted 2/2" in log.read_text(), proc, log)
        out = log.read_text()
        assert ("warning: public.k_nokey is not followed: it has no primary key. ALTER TABLE public.k_nokey ADD "
                "PRIMARY KEY (...) or ALTER TABLE public.k_nokey REPLICA IDENTITY USING INDEX") in out, out[-4000:]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE k_scratch (x int); INSERT INTO k_scratch VALUES (1), (1)")
            conn.execute("UPDATE k_a SET v = 'changed' WHERE id <= 10; DELETE FROM k_a WHERE id > 190; "
                         "INSERT INTO k_a VALUES (1000, 'new')")
            conn.execute("UPDATE k_ri SET v = 'changed' WHERE code IN ('c1', 'c2'); DELETE FROM k_ri WHERE code = 'c3'; "
                         "UPDATE k_ri SET code = 'moved' WHERE code = 'c4'")
            conn.execute("UPDATE k_nokey SET v = 'before its key' WHERE id <= 5")
        wait_for("the scratch table's warning", lambda: "public.k_scratch is not followed" in log.read_text(), proc, log)
        out = inspect(meta)
        assert "2 not followed" in out, out
        assert "warning: public.k_scratch is not followed: it has no primary key" in out, out

        # The keyed tables' targets hold every change: no commit is pending, and the keyless tables' changes
        # make none. So the next keyed commit is k_nokey's snapshot once it has a key: that one kills.
        keyed = ["public.k_a", "public.k_ri"]

        def keyed_targets_equal() -> bool:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                source, schemas = table_states(conn, keyed)
            return delta_differences(str(tmp_path / "lake"), source, schemas) == {}

        wait_for("the keyed tables' changes in their targets", keyed_targets_equal, proc, log)
        hits = crashes / f"{POINT}.hits"  # faults.crash_point counts a hit as one byte of this file
        assert hits.stat().st_size < KILL_AT - 1
        os.truncate(hits, KILL_AT - 1)
        # One transaction: committed before the poll that picks k_nokey up, so its first epoch is the snapshot.
        with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
            conn.execute("ALTER TABLE k_nokey ADD PRIMARY KEY (id)")
            conn.execute("UPDATE k_nokey SET v = 'after its key' WHERE id BETWEEN 6 AND 9; DELETE FROM k_nokey WHERE id = 200")
        rc, out = ended(proc, log)
        assert rc == 137 and "run the same command again" in out, out[-4000:]  # kill -9 of the driver
        assert "tables snapshotted 3/3" not in out, out[-4000:]  # inside the epoch of k_nokey's snapshot
        nokey = delta_reader(str(tmp_path / "lake"))("public.k_nokey")  # None: no target yet
        assert nokey is None or nokey.num_rows == 0, nokey
        out = inspect(meta)  # the catalog poll that picked it up said so at once: not with the epoch
        assert "1 not followed" in out and "public.k_nokey is not followed" not in out, out

        log = tmp_path / "again.log"
        proc = start(cmd, log)  # the same command
        wait_for("k_nokey's snapshot", lambda: "tables snapshotted 3/3" in log.read_text(), proc, log)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE k_nokey SET v = 'followed' WHERE id = 1; INSERT INTO k_nokey VALUES (500, 'new')")
        proc.send_signal(signal.SIGTERM)  # a drain: every change up to now reaches the targets
        rc, out = ended(proc, log)
        assert rc == 0 and "flinkish mirror: drained" in out, out[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()

    tables = ["public.k_a", "public.k_ri", "public.k_nokey"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, tables)
    assert schemas["public.k_ri"].key == ("code",)
    assert len(source["public.k_nokey"]) == 200  # 199 + the new one
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    assert sorted(os.listdir(tmp_path / "lake" / "public")) == ["k_a", "k_nokey", "k_ri"]  # never k_scratch
    out = inspect(meta)
    assert "1 not followed" in out and "public.k_nokey is not followed" not in out, out
    assert "warning: public.k_scratch is not followed" in out, out
    status = subprocess.run([*flinkish(), "mirror", "status", "--checkpoint", str(meta), "--json"], capture_output=True,
                            text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    states = {t["name"]: (t["state"], t["note"].split(":")[0]) for t in json.loads(status.stdout)["tables"]}
    assert states == {"public.k_a": ("streaming", ""), "public.k_ri": ("streaming", ""),
                      "public.k_nokey": ("streaming", ""),
                      "public.k_scratch": ("not followed", "public.k_scratch is not followed")}, states
