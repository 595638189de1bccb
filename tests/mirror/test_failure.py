"""``flinkish mirror`` when something fails after the start: the cause on the last line, the traces in the log.

* A real failure inside Spark (the mirror's role loses SELECT on a table while its snapshot is
  read): the command exits 1 and its last line names the exception and its message; no Java
  frame or Python traceback on the terminal, they are in the log file whose path it prints;
  Spark's start-up warnings are in that log too, not on the terminal. The slot and publication
  this run created stay (the same command continues from its committed epochs) and the command
  prints the SQL that drops them, which does.
* A run that fails before its source wrote any checkpoint drops the slot and publication it
  created itself (fast: no Spark, the source's own code creates them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import slots_and_publications
from flinkish_spark.testing.spark_log import committed_batches

SPARK_WARNINGS = ("Using incubator modules", "NativeCodeLoader", "replaced a previously registered data source")


def as_role(url: str, role: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


def setup_owner(conn: psycopg.Connection, db: str) -> None:
    """Role fh_owner (REPLICATION, CREATE on the database) owning fh_a (1 chunk) and fh_b (6 chunks of 500 rows)."""
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'fh_owner'").fetchone()
    conn.execute(f"{'ALTER' if exists else 'CREATE'} ROLE fh_owner WITH LOGIN NOSUPERUSER REPLICATION")
    conn.execute(f'GRANT CREATE ON DATABASE "{db}" TO fh_owner')
    conn.execute("CREATE TABLE fh_a (id int PRIMARY KEY, v text); INSERT INTO fh_a SELECT g, 'a' FROM generate_series(1, 400) g;"
                 "CREATE TABLE fh_b (id int PRIMARY KEY, v text); INSERT INTO fh_b SELECT g, 'b' FROM generate_series(1, 3000) g;"
                 "ALTER TABLE fh_a OWNER TO fh_owner; ALTER TABLE fh_b OWNER TO fh_owner")


@pytest.mark.slow
def test_a_failure_inside_spark_ends_with_its_cause_and_leaves_the_traces_in_the_log(pg_url: str, tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    db = pg_url.rsplit("/", 1)[-1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        setup_owner(conn, db)
    cmd = [sys.executable, "-m", "flinkish_spark.cli", "mirror", "--from", as_role(pg_url, "fh_owner"),
           "--tables", "public.fh_*", "--to", str(tmp_path / "lake"), "--checkpoint", str(tmp_path / "meta"),
           "--trigger", "1s", "--source-option", "splitSize=500", "--source-option", "maxRowsPerTrigger=500"]
    out_file, err_file = tmp_path / "out.txt", tmp_path / "err.txt"
    proc = subprocess.Popen(cmd, stdout=open(out_file, "wb"), stderr=open(err_file, "wb"), cwd=tmp_path)
    try:
        deadline = time.time() + 300
        while not committed_batches(tmp_path / "meta" / "spark"):  # the slot exists, a snapshot chunk is committed
            assert proc.poll() is None, out_file.read_text() + err_file.read_text()
            assert time.time() < deadline, out_file.read_text() + err_file.read_text()
            time.sleep(0.2)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("REVOKE SELECT ON fh_b FROM fh_owner")  # its chunks are read one per epoch from now
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = out_file.read_text(), err_file.read_text()
    shown = out + err
    print(shown)
    assert rc == 1, shown[-4000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"flinkish mirror: failed: \w+: .*permission denied for table fh_b.*", last), last
    assert "\tat " not in shown and "Traceback" not in shown and "PYTHON_" not in shown, shown[-4000:]
    for warning in SPARK_WARNINGS:
        assert warning not in shown, warning
    logged = re.search(r"the full error \(Java and Python traces\) is in (\S+)", shown)
    assert logged, shown[-4000:]
    log = Path(logged.group(1)).read_text()
    assert "Traceback" in log and "permission denied for table fh_b" in log
    assert "Using incubator modules" in log  # Spark's start-up warnings went to the log, not away

    # The slot and publication this run created stay for the same command (epochs are committed); the SQL it
    # prints drops them.
    assert slots_and_publications(pg_url) == (1, ["flinkish_mirror"])
    sql = re.search(r'-c "([^"]+)"', err)
    assert sql and "pg_drop_replication_slot('flinkish_mirror')" in sql.group(1), err
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.group(1))
    assert slots_and_publications(pg_url) == (0, [])


def test_a_run_that_fails_before_its_first_checkpoint_drops_the_slot_and_publication_it_created(
        pg_url: str, tmp_path: Path) -> None:
    from flinkish_spark.connectors.postgres import slot as slots
    from flinkish_spark.connectors.postgres.connection import connect
    from flinkish_spark.mirror.config import from_args
    from flinkish_spark.mirror.leftovers import claimed, release
    from flinkish_spark.mirror.preflight import source_of

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE fh_a (id int PRIMARY KEY, v text)")
    config = from_args(source=pg_url, tables="public.fh_*", to=str(tmp_path / "lake"), fmt=None,
                       checkpoint=str(tmp_path / "meta"))
    assert not claimed(config)
    source = source_of(config)
    with connect(source.conn_info, autocommit=True) as conn:  # what the source's enumerator does at its start
        slots.ensure_slot_and_publication(conn, source.io, source.checkpoint_store().directory, source.slot_name,
                                          source.publication, {("public", "fh_a"): ["id", "v"]}, False, "test")
    assert slots_and_publications(pg_url) == (1, ["flinkish_mirror"])
    lines = release(config, claimed_before=False)
    assert any("dropped the replication slot 'flinkish_mirror' and the publication 'flinkish_mirror' this run "
               "created" in ln for ln in lines), lines
    assert slots_and_publications(pg_url) == (0, [])


def test_the_advice_for_a_fenced_second_copy_names_the_flinkish_mirror_process_to_stop(tmp_path: Path) -> None:
    """The lease names the process that holds it -- the first copy's driver JVM or a Spark worker; the advice
    names the ``flinkish mirror`` command that process runs under (the parent of the pipeline process)."""
    import socket

    from flinkish_spark.mirror.failure import advice, cause

    # A stand-in for the first copy: this test is its "flinkish mirror", a process with the pipeline's module
    # name in its command line is its pipeline process, and that one's child is the lease holder.
    ready = tmp_path / "holder.pid"
    pipeline = subprocess.Popen([sys.executable, "-c",
                                 "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
                                 "'import time; time.sleep(60)']); open(sys.argv[1], 'w').write(str(p.pid)); p.wait()",
                                 str(ready), "-m", "flinkish_spark.mirror.pipeline"])
    try:
        deadline = time.time() + 30
        while not ready.exists() or not ready.read_text():
            assert time.time() < deadline
            time.sleep(0.05)
        holder = int(ready.read_text())
        text = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
                '  File "x.py", line 1, in commit\n    lease.acquire()\n'
                "flinkish_spark.errors.FencedError: sink uid 'mirror_sink' is in use by another live run of this "
                f"query (run r1 on host {socket.gethostname()} pid {holder}, renewed 0.4s ago). Stop that run first\n"
                "\tat org.apache.spark.api.python.BasePythonRunner.read(PythonRunner.scala:1)")
        root = cause(text)
        assert root.startswith("FencedError: sink uid 'mirror_sink' is in use by another live run"), root
        said = advice(root, text)
        assert f"pid {os.getpid()} (" in said and f"kill -TERM {os.getpid()}" in said, said
        assert "run the same command again" not in said
    finally:
        if ready.exists() and ready.read_text():
            os.kill(int(ready.read_text()), 9)
        pipeline.wait(timeout=30)


def test_the_cause_of_an_error_raised_outside_spark_names_its_type() -> None:
    from flinkish_spark.errors import EnvironmentSetupError
    from flinkish_spark.mirror.failure import cause, cause_of

    exc = EnvironmentSetupError("no Java 17 found: install a JDK\nmore detail")
    assert cause_of(exc, str(exc)) == "EnvironmentSetupError: no Java 17 found: install a JDK"
    # Chained Python exceptions in Spark's text: the last traceback's is the one the code raised.
    text = ("[STREAM_FAILED] Query terminated with exception: [PYTHON_EXCEPTION] Traceback (most recent call last):\n"
            '  File "a.py", line 1, in f\n    g()\npsycopg.errors.InsufficientPrivilege: permission denied for table t\n\n'
            "The above exception was the direct cause of the following exception:\n\n"
            'Traceback (most recent call last):\n  File "b.py", line 2, in h\n    raise X from e\n'
            "flinkish_spark.errors.PostgresSourceError: reading a chunk of public.t failed: permission denied\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.read(PythonRunner.scala:1)\n")
    assert cause(text) == "PostgresSourceError: reading a chunk of public.t failed: permission denied"
