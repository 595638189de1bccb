"""``flinkish mirror --from mysql://`` into routed Delta, Iceberg and PostgreSQL targets, killed with SIGKILL at named
crash points of snapshot and change epochs, restarted with the same command each time, then drained: every target
equals its MariaDB table, no key twice (the crash matrix of issue 29, chained to keep driver starts few).

Three keyed tables (one with a composite key) of a few thousand rows; a writer (flinkish_spark.testing.mysql_mirror)
changes all of them all the time in multi-statement transactions (inserts, updates, deletes, key moves). Each run of
a target's chain (:data:`CHAINS`) is armed at the next point: a point with a hit number is hit in the snapshot (the
run's log says the snapshot was not done); one without is armed only once the run reports every table snapshotted,
and then the writer adds a column (``ADD COLUMN``) and creates a new matching table, which joins with a snapshot of
its own. Across the targets: ``source.after_metadata_write`` (Delta, snapshot), ``sink.after_commit`` (Iceberg,
changes); the PostgreSQL target's chain is its last run alone. The last run of every target waits for the new
table's snapshot and two more epochs, then drains.

The PostgreSQL target was killed at ``sink.before_decision`` in the snapshot (a run and a mirror start of its
own). What a restart from there runs is the MySQL source's replay of a planned, uncommitted snapshot epoch --
Delta's kill at ``source.after_metadata_write`` in the snapshot replays one the same way (the source re-reads the
epoch's chunks from Spark's offset log; nothing of the source knows the sink's point) -- and the routed
PostgreSQL sink's restart of an undecided epoch: the tasks stage it again, the commit applies the new attempts
once, cleanup deletes the killed attempt's staged rows. That is the sink's code alone, and
``tests/connectors/postgres/test_routed.py::test_a_kill_before_the_decision_of_a_snapshot_epoch_and_the_restart_commits_its_new_attempt_once``
kills it there in process.

Delta's last run also (1) kills ``mariadbd`` with SIGKILL and starts it again on the same data folder and port
while the mirror and the writer run: the mirror rides through, or (when one of its queries met the gap; both happen)
ends with "a transient failure ... DatabaseUnavailableError" and the same command continues; (2) it is stopped
with SIGKILL at ``sink.between_tables`` of a change epoch (some tables of the epoch committed, the others not: an
epoch planned in Spark's offset log and not committed), the writer goes on, the server's binary logs are purged
past that epoch's range: the same command refuses to start (exit 2, Spark not started), naming
``onSlotLost=resnapshot``, and with ``--source-option onSlotLost=resnapshot`` replays the epoch (its changes unread:
the log is gone), snapshots every table again and drains: the changes only the purged log held are in the targets
all the same (docs/mysql-source.md, "A purged replay").
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.testing.mirror_process import drain, ended, flinkish, start, wait_for
from flinkish_spark.testing.mysql_mirror import SETUP, Writer, delta_rows, differences, iceberg_rows, postgres_rows

pytestmark = pytest.mark.slow

CHANGES = None  # armed in the change epochs, after the new column and the new table
#: Where Delta's last run is killed before the purge (a change epoch left planned, some of its tables committed).
LAST_KILL = "sink.between_tables"
#: Per target: the runs' kill points (each run one, the next run armed at the next), and how the snapshot is cut
#: (rows per chunk, rows per epoch): several epochs where a run is killed in the snapshot, few elsewhere.
CHAINS: dict[str, list[tuple[str, int | None]]] = {
    # Delta's sink.between_tables of a change epoch is its last run's kill (LAST_KILL); the replay of a change
    # epoch planned and not committed is Iceberg's kill (and, at sink.between_tables, tests/connectors/delta/
    # test_routed_crash.py's): a run of its own here was one driver start more (docs/testing.md).
    "delta": [("source.after_metadata_write", 3)],
    "iceberg": [("sink.after_commit", CHANGES)],
    "postgres": [],  # see the module docstring: sink.before_decision moved in process (postgres/test_routed.py)
}
SNAPSHOT = {"delta": (300, 600), "iceberg": (1000, 3000), "postgres": (1000, 3000)}


def snapshotted(log: Path) -> tuple[int, int]:
    """The last ``tables snapshotted i/n`` of a run's progress lines ((0, 0) before the first)."""
    found = re.findall(r"tables snapshotted (\d+)/(\d+)", log.read_text())
    return (int(found[-1][0]), int(found[-1][1])) if found else (0, 0)


def epochs(log: Path) -> int:
    return len(re.findall(r"^epoch \d+:", log.read_text(), re.M))


def all_snapshotted(log: Path, tables: int) -> bool:
    done, of = snapshotted(log)
    return done == of == tables


@pytest.mark.parametrize("target", list(CHAINS))
def test_killed_at_each_point_of_snapshot_and_changes_then_drained_every_target_equals_its_table(
        target: str, mariadb: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    db = f"m_kill_{target}"
    mariadb.sql(f"DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}`")
    mariadb.sql(SETUP, db)
    url, meta = mariadb.url_for(db), tmp_path / "meta"
    if target == "delta":
        to, read = [str(tmp_path / "lake")], delta_rows(str(tmp_path / "lake"), db)
    elif target == "iceberg":
        to, read = ["mirror.{schema}_{table}", "--format", "iceberg"], iceberg_rows(str(meta), db)
    else:
        pg_url = request.getfixturevalue("pg_url")
        to, read = [pg_url], postgres_rows(pg_url, db)
    cmd = [*flinkish(), "mirror", "--from", mariadb.url, "--tables", f"{db}.*", "--to", *to,
           "--checkpoint", str(meta), "--trigger", "1s", "--source-option", f"splitSize={SNAPSHOT[target][0]}",
           "--source-option", "maxRowsPerTrigger=600", "--source-option", f"snapshotRowsPerTrigger={SNAPSHOT[target][1]}",
           "--source-option", "discoveryInterval=1"]
    writer = Writer(url)
    writer.start()
    proc: Any = None
    try:
        for run, (point, nth) in enumerate(CHAINS[target], 1):
            crash_dir, log = tmp_path / f"run{run}", tmp_path / f"run{run}.log"
            crash_dir.mkdir()
            proc = start(cmd, log, env={"FLINKISH_CRASH_AT": f"{point}:{nth or 1_000_000}",
                                        "FLINKISH_CRASH_DIR": str(crash_dir)})
            if nth is CHANGES:  # every table snapshotted: armed (its hit counter one short), then the DDL
                wait_for("every table snapshotted", lambda: all_snapshotted(log, 3), proc, log)
                (crash_dir / f"{point}.hits").write_bytes(b"x" * 999_999)
                writer.ddl.set()
            rc, out = ended(proc, log)
            assert rc == 137 and "run the same command again" in out, (point, out[-4000:])
            if nth is not CHANGES:
                assert not all_snapshotted(log, 3), (point, "killed after the snapshot", out[-4000:])

        # The last run: the same command; the new column and table (now, if no run did them), the new table's
        # snapshot, a few epochs of changes.
        log = tmp_path / "last.log"
        # Delta's last run is killed at a point armed later (server_restart_kill_purge), its hit counter in last/.
        last_env = {"FLINKISH_CRASH_AT": f"{LAST_KILL}:1000000", "FLINKISH_CRASH_DIR": str(tmp_path / "last")}
        (tmp_path / "last").mkdir()
        proc = start(cmd, log, env=last_env if target == "delta" else None)
        if not writer.ddl.is_set():
            wait_for("every table snapshotted", lambda: all_snapshotted(log, 3), proc, log)
            writer.ddl.set()
        wait_for("the new table snapshotted", lambda: all_snapshotted(log, 4), proc, log)
        seen = epochs(log)
        wait_for("2 more epochs", lambda: epochs(log) >= seen + 2, proc, log)
        if target == "delta":
            proc, log = server_restart_kill_purge(mariadb, cmd, proc, log, meta, writer, last_env)
        writer.finish()
        drain(proc, log)
    finally:
        writer.stop.set()
        if proc is not None and proc.poll() is None:  # a failed wait: the mirror would run on against the next tests' server
            proc.kill()
    assert writer.transactions > 100
    assert differences(url, read) == {}
    mariadb.sql(f"DROP DATABASE IF EXISTS `{db}`")


def server_restart_kill_purge(mariadb: Any, cmd: list[str], proc: Any, log: Path, meta: Path,
                              writer: Writer, env: dict[str, str]) -> tuple[Any, Path]:
    """Delta's last run: ``mariadbd`` killed and started again while the mirror runs (it rides through, or fails
    with a transient error and the same command continues); the mirror killed in a change epoch (:data:`LAST_KILL`,
    armed now); the log purged past that epoch's range; the refused restart; the restart with
    ``onSlotLost=resnapshot`` (returned, running, once it has re-snapshotted every table)."""
    seen, reconnects = epochs(log), writer.reconnects
    mariadb.crash()  # kill -9: no shutdown, InnoDB and the binary log recover at the start
    mariadb.start()
    deadline = time.time() + 300
    while proc.poll() is None and epochs(log) < seen + 3 and time.time() < deadline:
        time.sleep(0.2)
    if proc.poll() is not None:  # it did not ride through (it asked the server while it was down): it says why, and
        rc, out = ended(proc, log)  # the same command continues
        assert rc == 1 and "a transient failure" in out and "DatabaseUnavailableError" in out, out[-4000:]
        log = meta.parent / "after-restart.log"
        proc, seen = start(cmd, log, env=env), 0
        wait_for("3 epochs after the server's restart", lambda: epochs(log) >= 3, proc, log)
    assert epochs(log) >= seen + 3, log.read_text()[-4000:]
    # Killed between two tables' commits of a change epoch: an epoch planned and not committed, replayed at the
    # restart -- after the purge below, from a log that is gone.
    (Path(env["FLINKISH_CRASH_DIR"]) / f"{LAST_KILL}.hits").write_bytes(b"x" * 999_999)
    rc, out = ended(proc, log)
    assert rc == 137 and "run the same command again" in out, out[-4000:]

    # More changes (the writer connected again), then the log they are in purged.
    deadline = time.time() + 120
    while writer.reconnects == reconnects:
        assert writer.is_alive() and time.time() < deadline, repr(writer.error)
        time.sleep(0.1)
    done = writer.transactions
    while writer.transactions < done + 30:
        assert writer.is_alive(), repr(writer.error)
        time.sleep(0.1)
    newest = mariadb.sql("FLUSH BINARY LOGS; SHOW MASTER STATUS").split()[0]
    deadline = time.time() + 60
    while len(mariadb.sql(f"PURGE BINARY LOGS TO '{newest}'; SHOW BINARY LOGS").splitlines()) > 1:
        assert time.time() < deadline, mariadb.sql("SHOW BINARY LOGS")
        time.sleep(0.2)  # MariaDB keeps a file InnoDB still needs for its crash recovery a moment longer

    log = meta.parent / "refused.log"
    rc, out = ended(start(cmd, log), log)
    assert rc == 2 and "was purged" in out and "onSlotLost=resnapshot" in out, out[-4000:]
    assert "starting Spark" not in out, out[-4000:]

    # The new snapshot in big chunks (a restart may change how the snapshot is cut; 300-row chunks took ~70 epochs).
    log = meta.parent / "resnapshot.log"
    bigger = [{"splitSize=300": "splitSize=5000", "snapshotRowsPerTrigger=600": "snapshotRowsPerTrigger=20000"}.get(a, a)
              for a in cmd]
    proc = start([*bigger, "--source-option", "onSlotLost=resnapshot"], log)
    wait_for("every table snapshotted again", lambda: epochs(log) >= 2 and all_snapshotted(log, 4), proc, log)
    return proc, log
