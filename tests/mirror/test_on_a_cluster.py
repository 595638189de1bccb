"""``flinkish mirror --master local-cluster[2,1,1024]``: the same command on separate executor JVMs, exactly once.

While a writer changes the tables, the pipeline process -- the Spark driver -- is killed with SIGKILL in the middle
of an epoch (the command exits 137 and says the same command continues); the same command continues, and after
the writer stopped, SIGTERM drains it: every Delta target equals its source table. The executors resolve paths
against their own working folders: the command is given relative ones (config makes them absolute).
"""

from __future__ import annotations

import os
import random
import re
import signal
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
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "26"))
MASTER = "local-cluster[2,1,1024]"


def command(url: str) -> list[str]:
    return [*flinkish(), "mirror", "--from", url, "--tables", "public.m_*", "--to", "lake", "--checkpoint", "meta",
            "--trigger", "1s", "--master", MASTER, "--source-option", "splitSize=500",
            "--source-option", "maxRowsPerTrigger=2000"]


def start(url: str, work: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command(url), stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=work)


def pipeline_process(command_pid: int) -> int:
    """The pid of the command's pipeline process (the Spark driver's Python): its child."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    line = f.read()
            except (OSError, IndexError, ValueError):
                continue
            if ppid == command_pid and b"flinkish_spark.mirror.pipeline" in line:
                return int(entry)
    raise AssertionError(f"no pipeline process under {command_pid}")


def executor_jvms() -> int:
    """Spark executor JVMs running now (local-cluster starts them as processes of their own)."""
    found = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found += b"CoarseGrainedExecutorBackend" in f.read()
            except OSError:
                continue
    return found


def test_a_killed_driver_on_a_local_cluster_continues_exactly_once(pg_url: str, tmp_path: Path) -> None:
    spark_cp = str(tmp_path / "meta" / "spark")
    # no schema changes here: they are tests/mirror/test_pipeline.py's
    with writer_running(pg_url, tmp_path) as stop_writer:
        log1 = tmp_path / "run1.log"
        run1 = start(pg_url, tmp_path, log1)
        wait_for("3 committed epochs", lambda: len(committed_batches(spark_cp)) >= 3, run1, log1, timeout=400)
        assert executor_jvms() >= 2, log1.read_text()[-3000:]  # the tasks run in executor JVMs of their own
        time.sleep(random.Random(SEED).uniform(0.0, 1.5))  # somewhere inside the next epoch
        os.kill(pipeline_process(run1.pid), signal.SIGKILL)  # the driver: kill -9
        rc, out = ended(run1, log1)
        assert rc == 137 and "run the same command again: it continues from the checkpoint" in out, out[-4000:]
        committed = len(committed_batches(spark_cp))

        log2 = tmp_path / "run2.log"
        run2 = start(pg_url, tmp_path, log2)  # the same command
        wait_for("3 more epochs", lambda: len(committed_batches(spark_cp)) >= committed + 3, run2, log2, timeout=400)
        stop_writer()
        out = drain(run2, log2)
        assert f"starting Spark ({MASTER})" in out, out[-4000:]
        first = re.search(r"^epoch (\d+):", out, re.M)  # it goes on numbering, it does not start over
        assert first is not None and int(first.group(1)) >= committed - 1, out[-4000:]

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    assert slots_and_publications(pg_url) == (0, [])
