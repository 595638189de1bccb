"""kill -9 of the Connect *client* and of the Connect *server*, then restart: every row exactly once.

Under Spark Connect the query runs in the server; the client only holds the session, the
finish controller and the ``StreamingQuery`` handle. A killed client leaves its query running
in the server until a restarted client starts it again (Spark stops the earlier run of the
same checkpoint); a killed server takes the query, its Python workers and the
``foreachBatch`` function down with it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow.dataset as ds
import pytest

from flinkish_spark.faults import ENV_DIR, ENV_POINT
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.runner import child_spec
from flinkish_spark.sink.decisions import DecisionLog

pytestmark = pytest.mark.slow
LENGTHS = [300, 200]


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def rows(out: Path) -> collections.Counter:
    t = ds.dataset(str(out), format="parquet").to_table()
    return collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist()))


def sequence(tmp_path: Path, **options: Any) -> dict:
    return {"format": "flinkish.sequence", "options": {
        "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": ",".join(map(str, LENGTHS)), **options}}


def staged(out: Path) -> list[Path]:
    return [p for p in out.rglob("*.parquet.staged") if p.is_file()]


def committed(log: DecisionLog) -> int:
    return len(log.epochs()[1])


class Client:
    """A client in a child process whose output is collected while it runs."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout or ()), daemon=True)
        self.reader.start()

    @classmethod
    def runner(cls, spec: dict, path: Path) -> "Client":
        """The runner (:mod:`flinkish_spark.runner`) on ``spec``, written to ``path``."""
        path.write_text(json.dumps(child_spec(spec)))
        return cls([sys.executable, "-m", "flinkish_spark.runner", str(path)])

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_until(self, predicate: Callable[[], bool], what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"the client ended before {what}: {self.output[-3000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.output[-3000:]}"
            time.sleep(0.2)

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.reader.join(timeout=10)


def test_kill_9_of_the_client_then_stop_and_restart_is_exactly_once(connect_server, run_client, tmp_path: Path) -> None:
    out = tmp_path / "out"
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "out")
    spec = {
        # Paced: the query of the killed client goes on in the server until the next client starts it again.
        "source": sequence(tmp_path, rowsPerSecond=12, maxRowsPerTrigger=30),
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(out), "checkpoint": str(tmp_path / "meta")}},
        "trigger": "1 second", "end": "finish", "runSeconds": 300,
    }
    killed = run_client(spec, kill_after=0.5, kill_when=lambda: committed(log) >= 1)
    assert killed.killed, killed.output[-3000:]

    # A second client starts the query again -- Spark stops the first client's run, still going
    # in the server -- and is stopped (no drain) by `flinkish stop` from a third process.
    client = Client.runner({**spec, "end": "external", "remote": connect_server.url}, tmp_path / "external.json")
    try:
        client.wait_until(lambda: "QUERY_STARTED" in client.output, "the start")
        at_start = committed(log)
        client.wait_until(lambda: committed(log) > at_start, "an epoch of the second client")
        stop = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "stop", str(tmp_path / "meta"),
                               "--timeout", "120"], capture_output=True, text=True, timeout=180)
    finally:
        returncode = client.finish(timeout=120)
    assert stop.returncode == 0 and "query ended: stopped" in stop.stdout, stop.stdout + stop.stderr
    assert returncode == 0 and "QUERY_END=stopped" in client.output, client.output[-3000:]
    partial = rows(out)
    assert 0 < sum(partial.values()) < sum(LENGTHS) and max(partial.values()) == 1

    last = run_client(spec)
    assert last.returncode == 0 and "QUERY_END=finished" in last.output, last.output[-3000:]
    assert rows(out) == expected()


def test_kill_9_of_the_server_mid_commit_then_restart_is_exactly_once(connect_server, run_client, tmp_path: Path) -> None:
    out = tmp_path / "out"
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "sinkmeta"), "out")
    spec = {
        "source": sequence(tmp_path, maxRowsPerTrigger=150),
        # transactional(...) in foreachBatch: the function is pickled to the server and commits there.
        "sink": {"checkpointLocation": str(tmp_path / "cp"), "foreachBatch": {
            "uid": "out", "path": str(out), "checkpoint": str(tmp_path / "sinkmeta"), "rowsPerFile": 40}},
        "trigger": "1 second", "end": "finish", "runSeconds": 300,
    }
    # The server's Python workers kill the server's whole process group at the second commit's
    # first file move (epoch 1): kill -9 of the server with one file of the epoch visible.
    (tmp_path / "crash").mkdir()
    connect_server.stop()
    connect_server.start(env={ENV_POINT: "sink.mid_commit:2", ENV_DIR: str(tmp_path / "crash")})
    crashed = run_client(spec, kill_after=0, kill_when=lambda: not connect_server.running())
    assert connect_server.wait_exit(60) == -signal.SIGKILL, crashed.output[-3000:]
    decided, done = log.epochs()
    assert 1 in decided and 1 not in done
    assert list(out.glob("part-000000000001-*")) and staged(out)  # one file of epoch 1 visible, the rest staged
    # `flinkish orphans` (a third process, no Spark) sees the crashed commit's staged files as decided
    # (completed by the next start), none as an orphan to delete.
    orphans = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "orphans", str(out), "--uid", "out",
                              "--checkpoint", str(tmp_path / "sinkmeta"), "--json"], capture_output=True, text=True, timeout=120)
    assert orphans.returncode == 0, orphans.stderr
    entries = json.loads(orphans.stdout)["staged"]
    assert len(entries) == len(staged(out)) and {(e["epoch"], e["state"]) for e in entries} == {(1, "decided")}

    connect_server.start()
    last = run_client(spec)
    assert last.returncode == 0 and "QUERY_END=finished" in last.output, last.output[-3000:]
    assert rows(out) == expected()
    assert staged(out) == []


# A pipeline script on a session of its own (not flinkish_spark.session): the bound comes from await_finished.
SCRIPT = r"""
import sys
import flinkish_spark
from pyspark.sql import SparkSession

url, work, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
spark = SparkSession.builder.remote(url).getOrCreate()
flinkish_spark.register(spark)
df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", f"{work}/meta")
      .option("rowsPerSplit", "300,200").option("rowsPerSecond", "12").option("maxRowsPerTrigger", "30").load())
query = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", f"{work}/out")
         .option("checkpoint", f"{work}/meta").option("checkpointLocation", f"{work}/cp")
         .trigger(processingTime="1 second").start())
print("QUERY_STARTED", flush=True)
print(f"QUERY_END={flinkish_spark.await_finished(query, timeout=300, server_timeout=bound)}", flush=True)
"""
BOUND_S = 20.0
SLACK_S = 60.0  # the call in flight when the server died, the client's exit, a busy two-core machine


def test_a_client_whose_server_died_fails_within_the_bound_and_the_same_script_continues_exactly_once(
        connect_server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "out")
    script = tmp_path / "pipeline.py"
    script.write_text(SCRIPT)

    argv = [sys.executable, str(script), connect_server.url, str(tmp_path), str(BOUND_S)]
    client = Client(argv)
    try:
        client.wait_until(lambda: committed(log) >= 1 and any(out.glob("part-*")), "a committed epoch with rows")
        connect_server.kill()
        killed_at = time.monotonic()
        returncode = client.finish(timeout=BOUND_S + SLACK_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the client still waited {BOUND_S + SLACK_S:g}s after kill -9 of its server "
                             f"(server_timeout={BOUND_S:g}s): {client.output[-3000:]}") from None
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            client.finish(timeout=0)  # a client left running by a failed wait above
    took = time.monotonic() - killed_at
    print(f"the client exited {took:.1f}s after kill -9 of its server (server_timeout={BOUND_S:g}s)")
    errors = [line for line in client.output.splitlines() if "ConnectServerUnavailableError: " in line]
    assert returncode != 0 and len(errors) == 1, client.output[-3000:]
    assert connect_server.url in errors[0] and "again" in errors[0], errors[0]
    partial = rows(out)
    assert 0 < sum(partial.values()) < sum(LENGTHS) and max(partial.values()) == 1

    connect_server.start()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0 and "QUERY_END=finished" in again.stdout, (again.stdout + again.stderr)[-3000:]
    assert rows(out) == expected()
