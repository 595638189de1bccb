"""``flinkish mirror`` end to end: the command as a subprocess on the embedded PostgreSQL into local Delta tables.

* While a writer changes every table of ``public.m_*`` (and, once the mirror runs, adds a
  column, widens a numeric, creates a table and drops one: flinkish_spark.testing.mirror's
  workload), two SIGTERMs stop the command without drain (exit 130, the slot stays); the same
  command started again continues from the checkpoint; after the writer stopped, one SIGTERM
  drains it (exit 0). Every Delta target then equals its source table, ``other`` has no target,
  and no slot or publication is left.
* ``--stop-after-snapshot`` copies the tables and ends by itself (exit 0) with nothing left on
  the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import SETUP, WRITER, delta_differences, slots_and_publications, spark_commits, table_states

pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

TABLES = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]
#: The embedded server trusts local connections; a password in the URL lets the test look for it everywhere.
SECRET = "s3cr3t-pw"


def with_password(url: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


def files_holding(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def flinkish() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "flinkish")  # the console script users run
    return [script] if os.path.exists(script) else [sys.executable, "-m", "flinkish_spark.cli"]


def command(url: str, tmp_path: Path, *extra: str) -> list[str]:
    return [*flinkish(), "mirror", "--from", url, "--tables", "public.m_*", "--to", str(tmp_path / "lake"),
            "--checkpoint", str(tmp_path / "meta"), "--trigger", "1s", "--source-option", "splitSize=500",
            "--source-option", "maxRowsPerTrigger=2000", "--source-option", "discoveryInterval=1", *extra]


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def wait_for(what: str, check, proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not check():
        assert proc.poll() is None, f"the mirror ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.time() < deadline, f"no {what} within {timeout}s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def ended(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the mirror did not end within {timeout}s:\n{log.read_text()[-4000:]}") from None
    return rc, log.read_text()


def test_sigterm_drains_and_the_same_command_continues_after_a_stop_without_drain(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    spark_cp = str(tmp_path / "meta" / "spark")
    stop_writer = tmp_path / "stop-writer"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, pg_url, str(stop_writer), os.path.join(spark_cp, "commits")])
    try:
        log1 = tmp_path / "run1.log"
        run1 = start(command(with_password(pg_url), tmp_path), log1)
        wait_for("3 committed epochs", lambda: spark_commits(spark_cp) >= 3, run1, log1)
        run1.send_signal(signal.SIGTERM)  # drain ...
        time.sleep(0.5)
        run1.send_signal(signal.SIGTERM)  # ... no: stop now, without drain
        rc, out = ended(run1, log1)
        assert rc == 130 and "stopped without drain" in out, out[-4000:]
        assert slots_and_publications(pg_url) == (1, ["flinkish_mirror"])  # kept for the restart

        log2 = tmp_path / "run2.log"
        run2 = start(command(with_password(pg_url), tmp_path), log2)  # the same command
        before = spark_commits(spark_cp)
        # The writer's schema changes and the new table happen 2 s apart once it runs: give them time.
        wait_for("12 more epochs", lambda: spark_commits(spark_cp) >= before + 12, run2, log2)
        stop_writer.touch()
        writer.wait(timeout=60)
        run2.send_signal(signal.SIGTERM)
        rc, out = ended(run2, log2)
        assert rc == 0 and "flinkish mirror: drained" in out, out[-4000:]
        assert "epoch " in out and "tables snapshotted" in out  # plain progress lines (stdout is not a terminal)
        assert SECRET not in log1.read_text() + out
    finally:
        stop_writer.touch()
        writer.wait(timeout=60)

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
    assert "extra" in schemas["public.m_a"].names
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    assert sorted(os.listdir(tmp_path / "lake" / "public")) == ["m_a", "m_b", "m_c", "m_drop", "m_new"]  # never 'other'
    assert slots_and_publications(pg_url) == (0, [])
    assert files_holding(tmp_path / "meta", SECRET) == [] and files_holding(tmp_path / "lake", SECRET) == []


def test_stop_after_snapshot_copies_the_tables_and_ends_by_itself(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    log = tmp_path / "run.log"
    rc, out = ended(start(command(pg_url, tmp_path, "--stop-after-snapshot"), log), log)
    assert rc == 0 and "flinkish mirror: finished" in out, out[-4000:]
    assert "tables snapshotted 4/4" in out, out[-4000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, ["public.m_a", "public.m_b", "public.m_c", "public.m_drop"])
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    assert slots_and_publications(pg_url) == (0, [])
