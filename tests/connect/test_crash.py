"""kill -9 of the Connect *client* and of the Connect *server*, then restart: every row exactly once.

Under Spark Connect the query runs in the server; the client only holds the session, the
finish controller and the ``StreamingQuery`` handle. A killed client leaves its query running
in the server until a restarted client starts it again (Spark stops the earlier run of the
same checkpoint); a killed server takes the query, its Python workers and the
``foreachBatch`` function down with it.

One test, one chain of clients and server starts (a Connect server start is a Spark driver start,
the cost of this file): the paced ``flinkish.parquet`` query is killed in its client, started again
by a second client and stopped with ``flinkish stop``, continued by a bounded script whose server is
then killed (the script fails within its bound); the server comes back armed to die in the middle of
a ``foreachBatch`` commit of a second query; a clean server then finishes both. Each step's
assertions name it.
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


# A pipeline script on a session of its own (not flinkish_spark.session): the bound comes from await_finished.
# The same query as the runner's PACED spec below (paths, uids, pacing), so that it continues that query.
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


def paced_spec(tmp_path: Path) -> dict:
    """The paced query: the query of a killed client goes on in the server until the next client starts it again."""
    return {
        "source": sequence(tmp_path, rowsPerSecond=12, maxRowsPerTrigger=30),
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "path": str(tmp_path / "out"), "checkpoint": str(tmp_path / "meta")}},
        "trigger": "1 second", "end": "finish", "runSeconds": 300,
    }


def foreach_batch_spec(work: Path) -> dict:
    """transactional(...) in foreachBatch: the function is pickled to the server and commits there."""
    return {
        "source": sequence(work, maxRowsPerTrigger=150),
        "sink": {"checkpointLocation": str(work / "cp"), "foreachBatch": {
            "uid": "out", "path": str(work / "out"), "checkpoint": str(work / "sinkmeta"), "rowsPerFile": 40}},
        "trigger": "1 second", "end": "finish", "runSeconds": 300,
    }


def test_client_kill_stop_server_kill_and_server_crash_mid_commit_then_restarts_are_exactly_once(
        connect_server, run_client, tmp_path: Path) -> None:
    out = tmp_path / "out"
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "out")
    spec = paced_spec(tmp_path)

    # 1. kill -9 of the client: its query goes on in the server.
    killed = run_client(spec, kill_after=0.5, kill_when=lambda: committed(log) >= 1)
    assert killed.killed, f"client kill: {killed.output[-3000:]}"

    # 2. A second client starts the query again -- Spark stops the first client's run, still going
    # in the server -- and is stopped (no drain) by `flinkish stop` from a third process.
    client = Client.runner({**spec, "end": "external", "remote": connect_server.url}, tmp_path / "external.json")
    try:
        client.wait_until(lambda: "QUERY_STARTED" in client.output, "the start of the second client")
        at_start = committed(log)
        client.wait_until(lambda: committed(log) > at_start, "an epoch of the second client")
        stop = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "stop", str(tmp_path / "meta"),
                               "--timeout", "120"], capture_output=True, text=True, timeout=180)
    finally:
        returncode = client.finish(timeout=120)
    assert stop.returncode == 0 and "query ended: stopped" in stop.stdout, f"flinkish stop: {stop.stdout + stop.stderr}"
    assert returncode == 0 and "QUERY_END=stopped" in client.output, f"stopped client: {client.output[-3000:]}"
    partial = rows(out)
    assert 0 < sum(partial.values()) < sum(LENGTHS) and max(partial.values()) == 1, f"after the stop: {partial}"

    # 3. A script (await_finished with server_timeout) continues the query; kill -9 of its server: the
    # script fails within the bound, naming the server.
    script = tmp_path / "pipeline.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, str(script), connect_server.url, str(tmp_path), str(BOUND_S)]
    before = committed(log)
    client = Client(argv)
    try:
        client.wait_until(lambda: committed(log) > before, "a committed epoch of the script")
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
    assert returncode != 0 and len(errors) == 1, f"server kill under the script: {client.output[-3000:]}"
    assert connect_server.url in errors[0] and "again" in errors[0], errors[0]
    partial = rows(out)
    assert 0 < sum(partial.values()) < sum(LENGTHS) and max(partial.values()) == 1, f"after the server kill: {partial}"

    # 4. The server comes back armed: its Python workers kill the server's whole process group at the
    # second commit's first file move (epoch 1) of a foreachBatch query -- kill -9 of the server with
    # one file of the epoch visible.
    fb = tmp_path / "fb"
    fb_out, fb_log = fb / "out", DecisionLog(FileIO.for_url(str(tmp_path)), str(fb / "sinkmeta"), "out")
    (tmp_path / "crash").mkdir()
    connect_server.start(env={ENV_POINT: "sink.mid_commit:2", ENV_DIR: str(tmp_path / "crash")})
    crashed = run_client(foreach_batch_spec(fb), kill_after=0, kill_when=lambda: not connect_server.running())
    assert connect_server.wait_exit(60) == -signal.SIGKILL, f"server crash mid-commit: {crashed.output[-3000:]}"
    decided, done = fb_log.epochs()
    assert 1 in decided and 1 not in done, f"server crash mid-commit: decided {decided}, done {done}"
    # one file of epoch 1 visible, the rest staged
    assert list(fb_out.glob("part-000000000001-*")) and staged(fb_out), sorted(p.name for p in fb_out.iterdir())
    # `flinkish orphans` (a third process, no Spark) sees the crashed commit's staged files as decided
    # (completed by the next start), none as an orphan to delete.
    orphans = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "orphans", str(fb_out), "--uid", "out",
                              "--checkpoint", str(fb / "sinkmeta"), "--json"], capture_output=True, text=True, timeout=120)
    assert orphans.returncode == 0, orphans.stderr
    entries = json.loads(orphans.stdout)["staged"]
    assert len(entries) == len(staged(fb_out)) and {(e["epoch"], e["state"]) for e in entries} == {(1, "decided")}

    # 5. A clean server: the same script continues the paced query, and the foreachBatch query
    # restarts, at the same time; each ends with every row once and nothing staged.
    connect_server.start()
    again = Client(argv)
    try:
        last = run_client(foreach_batch_spec(fb))
        returncode = again.finish(timeout=400)
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            again.finish(timeout=0)
    assert returncode == 0 and "QUERY_END=finished" in again.output, f"script after the server kill: {again.output[-3000:]}"
    assert rows(out) == expected()
    assert last.returncode == 0 and "QUERY_END=finished" in last.output, f"foreachBatch after the crash: {last.output[-3000:]}"
    assert rows(fb_out) == expected()
    assert staged(fb_out) == [] and staged(out) == []
