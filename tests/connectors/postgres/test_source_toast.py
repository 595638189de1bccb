"""``flinkish.postgres`` source: an update that leaves a TOASTed value unchanged.

With the option ``table`` (one table, typed columns) it needs ``REPLICA IDENTITY FULL`` and then
arrives as a full row. With ``tables`` (the multi-table stream) the default replica identity is
enough: the row marks the column unchanged and a keyed target keeps its stored value (one Iceberg
mirror ending equal to the source; and one routed Delta mirror killed with kill -9 inside the commit of
such an epoch, restarted from its checkpoint).

One mirror process per test, not one per target kind: the code that fills an unchanged value is each routed
sink's, and each is driven in process (no Spark) with hand-made stream rows through every case the mirror
run makes -- the table's row, the epoch's own insert or update of the key, a change then an unchanged
update, another task's snapshot row, a value nothing holds (null), a replay:
``tests/connectors/delta/test_routed.py::test_an_unchanged_column_keeps_the_value_of_the_keys_latest_version_in_the_epoch_or_the_table``
(``lakehouse/resolve.py``, which Delta and Iceberg share) and
``tests/connectors/postgres/test_routed.py::test_an_unchanged_column_keeps_the_value_of_the_keys_latest_version_in_the_epoch_or_the_target``
(``postgres/routed_apply.py``, against a real PostgreSQL); Iceberg's in-process test
(``iceberg/test_routed_modes.py``) takes only the table's row, so the end-to-end mirror is Iceberg's. The
end-to-end Delta path from the real source is the kill test's. What only a mirror run shows -- pgoutput's 'u'
reaching the target through ``flinkish mirror`` -- is format-independent (the source's stream rows).

pgoutput sends an unchanged value that is stored out of line as 'u' ("unchanged TOASTed value",
no data) in the new row; with REPLICA IDENTITY FULL the old row carries it. The value here is
10 kB of random hex in a column with ``STORAGE EXTERNAL``: out of line and not compressed, so it
really is TOASTed (checked), as a large document or JSON column would be.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
import pyarrow.parquet as pq
import pytest

import flinkish_spark


def run_available_now(spark: Any, url: str, tmp_path: Path) -> None:
    df = (spark.readStream.format("flinkish.postgres").option("uid", "docs").option("checkpoint", str(tmp_path / "meta"))
          .option("url", url).option("table", "public.docs").load())
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("checkpoint", str(tmp_path / "meta"))
         .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(availableNow=True).start())
    end = flinkish_spark.await_finished(q, timeout=180)
    assert q.exception() is None, q.exception()
    assert end != "timeout"


def test_update_of_another_column_carries_the_unchanged_toasted_value(spark, pg_url: str, tmp_path: Path) -> None:
    big = os.urandom(5_000).hex()  # 10 kB
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE docs (id int PRIMARY KEY, n int, body text)")
        conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute("ALTER TABLE docs REPLICA IDENTITY FULL")  # what docs/postgres-source.md says to do
        conn.execute("INSERT INTO docs VALUES (1, 0, %s), (2, 0, 'small')", (big,))
        toast = conn.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'docs'::regclass").fetchone()[0]
        assert conn.execute(f"SELECT count(*) FROM {toast}").fetchone()[0] > 0  # really stored out of line

    run_available_now(spark, pg_url, tmp_path)  # the snapshot; the slot stays for the next run
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE docs SET n = 1 WHERE id = 1")  # body unchanged: sent as 'u'
        conn.execute("UPDATE docs SET n = 2, body = 'changed' WHERE id = 2")
    run_available_now(spark, pg_url, tmp_path)  # the changes

    rows = pq.read_table(str(tmp_path / "out")).to_pylist()
    updates = sorted((r["id"], r["n"], r["body"]) for r in rows if r["_op"] == "u")
    assert updates == [(1, 1, big), (2, 2, "changed")]


# -- the multi-table stream into keyed targets, without REPLICA IDENTITY FULL ---------------------------------------

MIRROR_SETUP = """
CREATE TABLE t_docs (id int PRIMARY KEY, n int, body text);
ALTER TABLE t_docs ALTER COLUMN body SET STORAGE EXTERNAL;
"""



def _wait(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not check():
        assert proc.poll() is None, f"the mirror ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.time() < deadline, f"no {what} within {timeout}s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_mirror_keeps_the_unchanged_toasted_value_in_its_target(pg_url: str, tmp_path: Path) -> None:
    """The default replica identity: an update of another column sends the large value as "unchanged"; the
    Iceberg target keeps its stored value -- the table's row (an earlier epoch), the epoch's own insert or update
    of the key -- and ends equal to the source. (Delta and PostgreSQL targets: see the module docstring.)"""
    pytest.importorskip("pyiceberg")
    big = [os.urandom(2_000).hex() for _ in range(5)]  # 4 kB each: out of line (checked)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(MIRROR_SETUP)
        conn.execute("INSERT INTO t_docs VALUES (1, 0, %s), (2, 0, %s), (3, 0, 'small')", (big[0], big[1]))
        toast = conn.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 't_docs'::regclass").fetchone()[0]
        assert conn.execute(f"SELECT count(*) FROM {toast}").fetchone()[0] > 0
    to = ["mirror.{schema}_{table}", "--format", "iceberg"]
    args = ["--from", pg_url, "--tables", "public.t_*", "--to", *to, "--checkpoint", str(tmp_path / "meta")]
    log = tmp_path / "run.log"
    proc = subprocess.Popen([sys.executable, "-m", "flinkish_spark.cli", "mirror", *args, "--trigger", "1s"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        _wait("the snapshot", lambda: "tables snapshotted 1/1" in log.read_text(), proc, log)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE t_docs SET n = 1 WHERE id = 1")  # the value is in the target's row
            with conn.transaction():  # an insert, then an update of the key in the same epoch
                conn.execute("INSERT INTO t_docs VALUES (10, 0, %s)", (big[2],))
                conn.execute("UPDATE t_docs SET n = 5 WHERE id = 10")
            conn.execute("UPDATE t_docs SET body = %s WHERE id = 2", (big[3],))  # changed, then unchanged
            conn.execute("UPDATE t_docs SET n = 7 WHERE id = 2")
        _wait("the changes", lambda: "changes 5" in log.read_text(), proc, log)
        with psycopg.connect(pg_url, autocommit=True) as conn:  # later epochs: the values are in the target's rows
            conn.execute("UPDATE t_docs SET n = 9 WHERE id IN (1, 2, 10)")
            conn.execute("UPDATE t_docs SET n = 11 WHERE id = 10")
            conn.execute("INSERT INTO t_docs VALUES (11, 0, %s)", (big[4],))
        proc.send_signal(signal.SIGTERM)  # a drain: every change up to now
        assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "mirror", "compare", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr + log.read_text()[-3000:]
    assert "all 1 tables equal to their source" in out.stdout, out.stdout


@pytest.mark.slow
def test_a_kill_inside_an_epoch_of_unchanged_toasted_values_ends_with_the_values_in_the_target(
        pg_url: str, run_pipeline: Callable[..., Any], tmp_path: Path) -> None:
    """kill -9 of the driver in the routed Delta sink's commit of an epoch whose updates leave TOASTed values
    unchanged (``sink.between_tables``: one table has the epoch, the other not yet), then the same pipeline
    again: the replay skips the table that has the epoch and fills the other's unchanged values from its stored
    rows and the epoch's own earlier versions -- every target ends equal to its source, no value null."""
    pytest.importorskip("deltalake")
    from flinkish_spark.testing.mirror import delta_differences, delta_reader, table_states

    tables = ["public.t_docs", "public.t_notes"]
    big = [os.urandom(2_000).hex() for _ in range(4)]  # 4 kB each: out of line (checked)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(MIRROR_SETUP + MIRROR_SETUP.replace("t_docs", "t_notes"))
        for i, table in enumerate(tables):
            conn.execute(f"INSERT INTO {table} VALUES (1, 0, %s), (2, 0, %s)", (big[2 * i], big[2 * i + 1]))
            toast = conn.execute(f"SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = '{table}'::regclass").fetchone()[0]
            assert conn.execute(f"SELECT count(*) FROM {toast}").fetchone()[0] > 0
    meta, lake = str(tmp_path / "meta"), str(tmp_path / "lake")
    spec = {"source": {"format": "flinkish.postgres", "options": {"uid": "mirror", "checkpoint": meta, "url": pg_url,
                                                                  "tables": "public.t_*"}},
            "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"),
                     "options": {"uid": "lake", "checkpoint": meta, "path": lake + "/{schema}/{table}"}},
            "trigger": "availableNow"}
    first = run_pipeline(spec)  # the snapshot
    assert first.returncode == 0, first.output[-4000:]

    # One transaction: one epoch holding both tables' changes, the only one the next run commits.
    with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
        for i, table in enumerate(tables):
            conn.execute(f"UPDATE {table} SET n = 1 WHERE id = 1")  # the value is in the target's row
            conn.execute(f"INSERT INTO {table} VALUES (10, 0, %s)", (big[2 * i],))  # then unchanged in the epoch
            conn.execute(f"UPDATE {table} SET n = 5 WHERE id = 10")
            conn.execute(f"UPDATE {table} SET body = %s WHERE id = 2", (big[2 * i] + "x",))  # changed, then unchanged
            conn.execute(f"UPDATE {table} SET n = 7 WHERE id = 2")
    killed = run_pipeline(spec, crash_at="sink.between_tables:1")
    assert killed.killed, killed.output[-4000:]
    read = delta_reader(lake)
    n_of_1 = {t: dict(zip(*read(t).select(["id", "n"]).to_pydict().values()))[1] for t in tables}
    assert sorted(n_of_1.values()) == [0, 1], n_of_1  # the kill landed inside that epoch: one table has it

    again = run_pipeline(spec)  # the replay of the epoch, from the checkpoint
    assert again.returncode == 0, again.output[-4000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, tables)
    assert sorted(len(r["body"]) for t in tables for r in source[t].values()) == [4000] * 4 + [4001] * 2
    assert delta_differences(lake, source, schemas) == {}
