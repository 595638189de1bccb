"""The driver's machine is lost: ``flinkish mirror --checkpoint s3://...`` continues on another one.

The metadata and the Delta targets are on S3 (moto), Spark's own checkpoint is a local folder of the
machine (the default: under ``$XDG_STATE_HOME``). While a writer changes the tables, the whole process
tree of the command is killed with SIGKILL mid-run and its local state folder deleted; the *same*
command on a "new machine" (another ``$XDG_STATE_HOME``, empty) continues from what is on S3. After
the writer stopped, SIGTERM drains it: every Delta target equals its source table.
"""

from __future__ import annotations

import glob
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import delta_differences, slots_and_publications, table_states
from flinkish_spark.testing.mirror_process import flinkish, wait_for, writer_running
from flinkish_spark.testing.spark_log import committed_batches

pytest.importorskip("deltalake")
pytestmark = [pytest.mark.slow, pytest.mark.s3]

TABLES = ["public.m_a", "public.m_b", "public.m_c", "public.m_drop"]
LAKE, META = "s3://test/lake", "s3://test/meta"
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "27"))




def command(url: str) -> list[str]:
    return [*flinkish(), "mirror", "--from", url, "--tables", "public.m_*", "--to", LAKE, "--checkpoint", META,
            "--trigger", "1s", "--source-option", "splitSize=500", "--source-option", "maxRowsPerTrigger=2000"]


def start(url: str, machine: Path, endpoint: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "XDG_STATE_HOME": str(machine), "AWS_ENDPOINT_URL": endpoint}
    return subprocess.Popen(command(url), stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def spark_folder(machine: Path) -> str:
    """The machine's default Spark checkpoint (one mirror: one folder), '' before the command made it."""
    found = [p for p in glob.glob(str(machine / "flinkish_spark" / "mirror" / "*")) if os.path.isdir(p)]  # not its .log
    return found[0] if found else ""


def commits(machine: Path) -> int:
    folder = spark_folder(machine)
    return len(committed_batches(folder)) if folder else 0


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the pipeline process runs in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL for the command, its pipeline process, Spark's JVM and its Python workers at once: the machine is gone."""
    pids = descendants(proc.pid)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    for p in pids:  # none of them may live on (a JVM holding the slot would be a process of the lost machine)
        deadline = time.time() + 30
        while os.path.exists(f"/proc/{p}") and time.time() < deadline:
            try:
                with open(f"/proc/{p}/stat", encoding="utf-8") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.1)




def test_the_same_command_on_a_new_machine_continues_exactly_once(pg_url: str, s3_proc: str, tmp_path: Path) -> None:
    old, new = tmp_path / "machine-1", tmp_path / "machine-2"
    # no schema changes here (tests/mirror/test_pipeline.py has them)
    with writer_running(pg_url, tmp_path) as stop_writer:
        log1 = tmp_path / "machine-1.log"
        run1 = start(pg_url, old, s3_proc, log1)
        wait_for("5 committed epochs", lambda: commits(old) >= 5, run1, log1)
        time.sleep(random.Random(SEED).uniform(0.0, 1.5))  # somewhere inside the next epoch
        committed = commits(old)
        kill_tree(run1)
        assert slots_and_publications(pg_url) == (1, ["flinkish_mirror"])
        shutil.rmtree(old)  # the machine and its disk are gone

        log2 = tmp_path / "machine-2.log"
        run2 = start(pg_url, new, s3_proc, log2)  # the same command, an empty local state folder
        wait_for("5 epochs committed on the new machine", lambda: commits(new) >= committed + 5, run2, log2)
        stop_writer()
        run2.send_signal(signal.SIGTERM)
        try:
            rc = run2.wait(timeout=300)
        except subprocess.TimeoutExpired:
            kill_tree(run2)
            raise AssertionError(f"no drain within 300 s:\n{log2.read_text()[-4000:]}") from None
        out = log2.read_text()
        assert rc == 0 and "flinkish mirror: drained" in out, out[-4000:]
        first = re.search(r"^epoch (\d+):", out, re.M)  # the new machine goes on numbering, it does not start over
        assert first is not None and int(first.group(1)) >= committed - 1, out[-4000:]

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
    assert delta_differences(LAKE, source, schemas, {"endpointUrl": s3_proc}) == {}
    assert slots_and_publications(pg_url) == (0, [])
