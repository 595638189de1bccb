"""``flinkish mirror`` end to end: the command as a subprocess on the embedded PostgreSQL into local Delta tables.

* While a writer changes every table of ``public.m_*`` (and, once the mirror runs, adds a
  column, widens a numeric, creates a table and drops one: flinkish_spark.testing.mirror's
  workload), ``flinkish stop`` stops the command without drain (exit 0, the slot stays); the same
  command started again continues from the checkpoint; after the writer stopped, Ctrl-C twice exits it
  at once (130) and the same command recovers and ends drained by one SIGTERM (exit 0). Every Delta
  target then equals its source table, ``other`` has no target, and no slot or publication is left.
  Two tables have a shape of their own (``--sink-option tableModes=...``: m_a soft deletes, m_b history).
* ``--stop-after-snapshot`` copies the tables and ends by itself (exit 0) with nothing left on
  the server; ``flinkish mirror compare`` with the same flags (``deletes=soft`` for every table) says equal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from flinkish_spark.source.offset import SourceOffset
from flinkish_spark.testing.mirror import SETUP, delta_differences, history_problems, slots_and_publications, table_states
from flinkish_spark.testing.mirror_process import (drain, ended, flinkish, logs_on_failure, start, wait_for,
                                                   writer_running)
from flinkish_spark.testing.spark_log import committed_batches, planned_offsets

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

TABLES = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]
MODES = '[{"tables": "public.m_a", "deletes": "soft"}, {"tables": "public.m_b", "mode": "history"}]'
#: The embedded server trusts local connections; a password in the URL lets the test look for it everywhere.
SECRET = "s3cr3t-pw"


def with_password(url: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def files_holding(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]




def command(url: str, tmp_path: Path, *extra: str) -> list[str]:
    return [*flinkish(), "mirror", "--from", url, "--tables", "public.m_*", "--to", str(tmp_path / "lake"),
            "--checkpoint", str(tmp_path / "meta"), "--trigger", "1s", "--source-option", "splitSize=500",
            "--source-option", "maxRowsPerTrigger=2000", "--source-option", "discoveryInterval=1", *extra]








def test_a_stop_without_drain_then_ctrl_c_twice_and_each_time_the_same_command_continues(pg_url: str,
                                                                                        tmp_path: Path) -> None:
    """``flinkish stop`` (no drain) ends run 1, the same command continues through the writer's schema changes and
    new table; then Ctrl-C twice in its terminal exits run 2 at once (130), and the same command recovers and ends
    drained (SIGTERM) -- or finished by itself, when the first Ctrl-C's drain had planned its final epoch.

    Ctrl-C reaches the terminal's foreground process group: here the command's group (its own session, as a shell
    gives it); Spark's processes are in another one and never see it. (One chain of three runs: the Ctrl-C test
    was a mirror process of its own on a snapshot of its own before, ~35 s.) A failure shows the end of every
    run's output and of the pipeline's log (Spark's output, a failure's full error)."""
    with logs_on_failure(*(tmp_path / f"run{i}.log" for i in range(1, 5)), tmp_path / "meta" / "spark.log"):
        stop_then_ctrl_c_twice(pg_url, tmp_path)


def stop_then_ctrl_c_twice(pg_url: str, tmp_path: Path) -> None:
    spark_cp = str(tmp_path / "meta" / "spark")
    # The writer's schema changes start once this folder holds two numbered files: opened below when the
    # snapshot is complete (a widening during the snapshot is another case: test_widening_during_the_snapshot).
    gate = tmp_path / "ddl-gate"
    gate.mkdir()
    cmd = command(with_password(pg_url), tmp_path, "--sink-option", f"tableModes={MODES}")
    with writer_running(pg_url, tmp_path, ddl_after=str(gate)) as stop_writer:
        log1 = tmp_path / "run1.log"
        run1 = start(cmd, log1)
        wait_for("3 committed epochs", lambda: len(committed_batches(spark_cp)) >= 3, run1, log1)
        stop = subprocess.run([*flinkish(), "stop", str(tmp_path / "meta")], capture_output=True, text=True, timeout=300)
        assert stop.returncode == 0, stop.stdout + stop.stderr  # a stop without drain: resumable
        rc, out = ended(run1, log1)
        assert rc == 0 and "flinkish mirror: stopped (flinkish stop, no drain)" in out, out[-4000:]
        assert slots_and_publications(pg_url) == (1, ["flinkish_mirror"])  # kept for the restart

        log2 = tmp_path / "run2.log"  # the same command, in a session of its own (a terminal's foreground group)
        run2 = subprocess.Popen(cmd, stdout=open(log2, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_for("the snapshot's end", lambda: "tables snapshotted 4/4" in log2.read_text(), run2, log2)
        (gate / "0").touch()
        (gate / "1").touch()
        # The writer's schema changes and the new table happen 2 s apart from now; its last step drops m_drop.
        wait_for("the writer's schema changes", lambda: dropped(pg_url, "public.m_drop"), run2, log2, timeout=120)
        after = len(committed_batches(spark_cp))
        wait_for("5 epochs after them", lambda: len(committed_batches(spark_cp)) >= after + 5, run2, log2)
        stop_writer()
        os.killpg(run2.pid, signal.SIGINT)
        # The second Ctrl-C once the first one's drain has started (not after a fixed pause: the pipeline, looking
        # twice a second, mostly saw both in one look, its drain never begun).
        wait_for("the drain's start", lambda: "flinkish mirror: stopping with drain" in log2.read_text(), run2, log2)
        os.killpg(run2.pid, signal.SIGINT)
        rc, out = ended(run2, log2)
        assert rc == 130 and "flinkish mirror: stopped at once" in out, out[-3000:]
        # The Python workers never got the SIGINT (Spark's own shutdown of the cancelled batch may still log).
        assert "KeyboardInterrupt" not in out, out[-3000:]
        assert "epoch " in out and "tables snapshotted" in out  # plain progress lines (stdout is not a terminal)

        log3 = tmp_path / "run3.log"
        # The first Ctrl-C asked for a drain. Its final epoch is planned two plannings (>= 1 s) after the request,
        # so it usually is not when the second Ctrl-C stops the query -- but it can be on a loaded machine, whose
        # pipeline may act on the second signal a second late. Then the restart replays that epoch and ends by itself
        # ("finished": the drain is complete); else it goes on until drained by SIGTERM, sent once it committed
        # an epoch. Told apart by run 2's offset log before the restart: watching the restart for its end, the test
        # saw the replayed epoch's commit first and drained a run that was finishing by itself (not "drained").
        planned = drain_planned(spark_cp)
        run3 = start(cmd, log3)
        if planned:
            rc, out = ended(run3, log3)
            assert rc == 0 and "flinkish mirror: finished" in out, out[-3000:]
        else:
            # The writer has stopped: when run 2's last epoch read every change, the restart has nothing to commit
            # until the source changes (seen once: it sat idle, "caught up", and the wait below timed out).
            done = len(committed_batches(spark_cp))
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("UPDATE m_a SET v = v || '+' WHERE id = (SELECT min(id) FROM m_a)")
            wait_for("an epoch of the restart", lambda: len(committed_batches(spark_cp)) > done, run3, log3)
            out = drain(run3, log3)
        assert SECRET not in log1.read_text() + log2.read_text() + out

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
    assert "extra" in schemas["public.m_a"].names
    assert delta_differences(str(tmp_path / "lake"), source, schemas, {"tableModes": MODES}) == {}
    versions = pa.table(deltalake.DeltaTable(str(tmp_path / "lake" / "public" / "m_b")).scan())
    assert history_problems(versions, ["k"]) == [] and versions.num_rows > len(source["public.m_b"])
    assert sorted(os.listdir(tmp_path / "lake" / "public")) == ["m_a", "m_b", "m_c", "m_drop", "m_new"]  # never 'other'
    assert slots_and_publications(pg_url) == (0, [])
    assert files_holding(tmp_path / "meta", SECRET) == [] and files_holding(tmp_path / "lake", SECRET) == []

    log4 = tmp_path / "run4.log"  # the same command once more: a drained mirror is finished for good
    rc, out = ended(start(command(pg_url, tmp_path), log4), log4)
    assert rc == 0 and "this mirror was drained before" in out, out[-3000:]
    assert slots_and_publications(pg_url) == (0, [])  # nothing created again


def drain_planned(spark_cp: str) -> bool:
    """Whether the last batch Spark planned (committed or not) ends the source: a drain's final epoch."""
    offsets = [SourceOffset.from_json(line) for line in planned_offsets(spark_cp)]
    return bool(offsets) and all(o is not None and o.finished for o in offsets)


def dropped(url: str, table: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NULL", (table,)).fetchone()
    return row is not None and bool(row[0])


def test_stop_after_snapshot_copies_the_tables_and_ends_by_itself(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    log = tmp_path / "run.log"
    rc, out = ended(start(command(pg_url, tmp_path, "--stop-after-snapshot", "--sink-option", "deletes=soft"), log), log)
    assert rc == 0 and "flinkish mirror: finished" in out, out[-4000:]
    assert "tables snapshotted 4/4" in out, out[-4000:]
    # the rows of the four tables (SETUP: 3000 + 1500 + 1000 + 100), not the stream's schema rows
    assert re.findall(r"rows (\d+) \(changes 0\)", out)[-1] == "5600", out[-4000:]
    assert "flinkish mirror: read your tables" in out and f"pl.read_delta('{tmp_path / 'lake'}" in out, out[-2000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, ["public.m_a", "public.m_b", "public.m_c", "public.m_drop"])
    assert delta_differences(str(tmp_path / "lake"), source, schemas, {"deletes": "soft"}) == {}
    assert "_deleted" in deltalake.DeltaTable(str(tmp_path / "lake" / "public" / "m_a")).schema().to_arrow().names
    assert slots_and_publications(pg_url) == (0, [])
    check = subprocess.run([*flinkish(), "mirror", "compare",
                            *command(pg_url, tmp_path, "--sink-option", "deletes=soft")[len(flinkish()) + 1:]],
                           capture_output=True, text=True, timeout=120)  # the same flags, from the shell
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.splitlines()[-1] == "flinkish mirror compare: all 4 tables equal to their source"


def target_state(url: str, tmp_path: Path, tables: list[str]) -> tuple[dict, str]:
    """What differs between the Delta targets of ``tables`` and the source ({} when equal), and m_z's
    ``amount`` column type."""
    import deltalake

    with psycopg.connect(url, autocommit=True) as conn:
        source, schemas = table_states(conn, tables)
    amount = next(f for f in deltalake.DeltaTable(str(tmp_path / "lake" / "public" / "m_z")).schema().fields
                  if f.name == "amount")
    return delta_differences(str(tmp_path / "lake"), source, schemas), str(amount.type)


def test_widening_during_the_snapshot(pg_url: str, tmp_path: Path) -> None:
    """``numeric(12,2) -> numeric(14,2)`` after the slot exists and before the table's chunk is read: the chunk
    creates the target with the wide type, then the change stream delivers the older changes, announced with
    the narrow one (no narrowing: they fit), then the ALTER. The mirror goes on and ends equal to the source,
    the column wide.

    The command's default target (Delta) only: what each target kind does with this order of chunk and
    changes is its sink's code, which test_a_chunk_read_after_a_widening_* in tests/connectors/{delta,
    iceberg,postgres}/test_routed.py run in-process for every layout (created by the chunk or existing,
    later epoch or the same one, either task first), and ``flinkish mirror`` into each of the three runs end
    to end in tests/connectors/postgres/test_source_toast.py. (Parametrized over the three, this was three
    mirror processes of ~27 s each on CI.)"""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_big (id int PRIMARY KEY, v text);"
                     "INSERT INTO m_big SELECT g, 'b' || g FROM generate_series(1, 3000) g;"
                     "CREATE TABLE m_z (id int PRIMARY KEY, amount numeric(12,2));"
                     "INSERT INTO m_z SELECT g, g / 3.0 FROM generate_series(1, 10) g;")
    spark_cp = str(tmp_path / "meta" / "spark")
    log = tmp_path / "run.log"
    # One 500-row chunk per epoch: m_big's six chunks (tid 0) come before m_z's (tid 1).
    cmd = command(pg_url, tmp_path)
    cmd[cmd.index("maxRowsPerTrigger=2000")] = "maxRowsPerTrigger=500"
    run = start(cmd, log)
    wait_for("the first epoch", lambda: len(committed_batches(spark_cp)) >= 1, run, log)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE m_z SET amount = amount + 1 WHERE id = 1")  # a change under numeric(12,2) ...
        for i in range(1, 1201):  # ... then more transactions than one epoch takes (maxRowsPerTrigger=500) ...
            conn.execute("UPDATE m_big SET v = v || '+' WHERE id = %s", (i,))
        conn.execute("ALTER TABLE m_z ALTER COLUMN amount TYPE numeric(14,2)")  # ... so the first change epoch has m_z's old schema only
        conn.execute("UPDATE m_z SET amount = 123456789012.5 WHERE id = 2")  # needs (14,2)
    wait_for("the changes", lambda: re.search(r"\(changes [1-9]", log.read_text()) is not None, run, log)
    run.send_signal(signal.SIGTERM)
    rc, out = ended(run, log)
    assert rc == 0 and "flinkish mirror: drained" in out, out[-3000:]
    differs, amount = target_state(pg_url, tmp_path, ["public.m_big", "public.m_z"])
    assert differs == {}
    assert amount == 'PrimitiveType("decimal(14,2)")', amount
