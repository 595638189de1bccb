"""``flinkish mirror --remote sc://...``: the mirror's query in a Spark Connect server of its own process.

While a writer changes the tables, the server is killed with SIGKILL mid-run. The mirror notices within
``--server-timeout`` (not pyspark's ten minutes), says so in one line and exits 75 (a supervisor restarts it);
the server comes back "on a new machine" (its Spark checkpoint folder deleted: the server restores it from the
copy the sink keeps with the metadata), the same command is started again, and after the writer stopped SIGTERM
drains it: every Delta target equals its source table. The command is given relative paths and runs in another
folder than the server.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import delta_differences, slots_and_publications, table_states
from flinkish_spark.testing.mirror_process import drain, ended, flinkish, wait_for, writer_running
from flinkish_spark.testing.spark_log import committed_batches

pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

TABLES = ["public.m_a", "public.m_b", "public.m_c", "public.m_drop"]
BOUND_S = 10
SLACK_S = 60  # the call in flight when the server died, the exit, a busy two-core machine


def start(url: str, remote: str, work: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [*flinkish(), "mirror", "--from", url, "--tables", "public.m_*", "--to", "lake", "--checkpoint", "meta",
           "--trigger", "1s", "--remote", remote, "--server-timeout", f"{BOUND_S}s",
           "--source-option", "splitSize=500", "--source-option", "maxRowsPerTrigger=2000",
           "--sink-option", "keepSparkCheckpoint=true"]  # a copy of Spark's checkpoint with the metadata
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=work)


def test_a_killed_connect_server_ends_the_mirror_quickly_and_the_same_command_continues_exactly_once(
        connect_server, pg_url: str, tmp_path: Path) -> None:
    spark_cp = str(tmp_path / "meta" / "spark")  # written by the server: an absolute path
    # no schema changes here: they are tests/mirror/test_pipeline.py's
    with writer_running(pg_url, tmp_path) as stop_writer:
        log1 = tmp_path / "run1.log"
        run1 = start(pg_url, connect_server.url, tmp_path, log1)
        wait_for("3 committed epochs", lambda: len(committed_batches(spark_cp)) >= 3, run1, log1)
        connect_server.kill()  # kill -9 of the server's JVM and its Python workers
        killed_at = time.monotonic()
        rc, out = ended(run1, log1, timeout=BOUND_S + SLACK_S)
        took = time.monotonic() - killed_at
        assert rc == 75, out[-4000:]
        assert (f"the Spark Connect server {connect_server.url} did not answer for {BOUND_S}s (--server-timeout): the "
                "mirror's query no longer runs there") in out and "run the same command again" in out, out[-4000:]
        assert "Traceback" not in out, out[-4000:]  # one line, the details in the log
        assert re.search(r"^epoch \d+: .*, rows [1-9]", out, re.M), out[-4000:]  # the progress events' figures
        committed = len(committed_batches(spark_cp))
        shutil.rmtree(spark_cp)  # the server comes back on a new machine: its local folder is empty

        connect_server.start()
        log2 = tmp_path / "run2.log"
        run2 = start(pg_url, connect_server.url, tmp_path, log2)  # the same command
        wait_for("3 more epochs", lambda: len(committed_batches(spark_cp)) >= committed + 3, run2, log2)
        stop_writer()
        out = drain(run2, log2)
        assert f"connecting to the Spark Connect server {connect_server.url}" in out
        first = re.search(r"^epoch (\d+):", out, re.M)  # restored in the server: it goes on numbering
        assert first is not None and int(first.group(1)) >= committed - 1, out[-4000:]

    print(f"the mirror exited {took:.1f}s after kill -9 of its server (bound {BOUND_S}s)")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    assert slots_and_publications(pg_url) == (0, [])
