"""flinkish.delta under kill -9, task failures, random kills and a concurrent writer.

Pipelines run in child driver processes (conftest.run_pipeline). What is checked is what
a user of the table would see: rows read with deltalake (and DuckDB over the files the
log lists), the epoch each table version committed (its commit info), and data files on
storage that no version names.

The append matrix, the keyed (upsert) matrix and the random kills under a processing-time trigger
are one test on one S3 server, three tables: a kill ends a driver, so each kill is a driver start of
its own, but the three last runs share one driver (one after the other,
flinkish_spark.testing.queries), every task's first attempt failing. Every assertion names its
matrix and point.

Keyed matrix: a bounded change stream -- two sequence splits made into changes: every other change hits
one of 20 hot keys (each changed several times per epoch), the others sweep 200 cold keys (so an epoch
replaces only some rows of earlier files: deletion vectors); one change in nine is a delete -- killed at
each point of the keyed commit in turn. No kill after the commit (``sink.after_commit``): there the
decision log already says done, so the restart's commit_epoch never reaches the keyed sink's commit
(ALREADY_COMMITTED, the replay's files aborted -- as after the kill at ``delta.keyed.before_version``).

Append matrix: killed before and after the decision and before the done marker -- not after the commit
either. At ``sink.after_commit`` the decision log says done: the restart's tasks prepare nothing (the epoch
is decided), commit_epoch answers ALREADY_COMMITTED without calling the Delta sink's commit, and the
sink's cleanup of the epoch runs a second time over a folder it already cleaned. None of that is Delta's
code; the point is killed once for every sink in tests/sink/test_sink_crash.py (its S3 chain, the
format's path through sink/datasource.py, and its foreachBatch kill, foreach_batch.py's own point).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.runner import child_spec
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.testing.delta_log import log_mentions, unreferenced
from flinkish_spark.testing.queries import outputs

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

# no sink.after_commit: see the module docstring (tests/sink/test_sink_crash.py kills there)
CHAIN = ["sink.before_decision", "sink.after_decision", "sink.before_done"]
LENGTHS = [500, 400]


def expected(lengths: list[int] = LENGTHS) -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(lengths) for i in range(n))


def spec(cp: Path, table: str, meta: str, uid: str = "out", lengths: list[int] = LENGTHS, per_trigger: int = 150,
         **extra: str) -> dict:
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": meta, "rowsPerSplit": ",".join(map(str, lengths)),
            "maxRowsPerTrigger": per_trigger, **extra}},
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(cp),
                 "options": {"uid": uid, "path": table, "rowsPerFile": 60, "checkpointInterval": 3, **extra}},
    }


class Table:
    """The Delta table as its readers see it, local or on S3."""

    def __init__(self, uri: str, endpoint: str | None = None) -> None:
        self.uri = uri
        self.options = {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"} if endpoint else None
        self.io = FileIO.for_url(uri, {"endpoint_url": endpoint} if endpoint else {})

    def load(self):
        return deltalake.DeltaTable(self.uri, storage_options=self.options)

    def rows(self) -> collections.Counter:
        t = self.load().to_pyarrow_table(columns=["split", "seq"])
        return collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist()))

    def epochs(self, uid: str = "out") -> list[int]:
        """The epoch of every version that ``uid`` committed (a replay would list one twice)."""
        return sorted(int(h["flinkish.epoch"]) for h in self.load().history() if h.get("flinkish.uid") == uid)

    def txn(self, uid: str = "out") -> int:
        v = self.load().transaction_version(uid)
        return -1 if v is None else v

    def stray_files(self) -> set[str]:
        """Data files on storage that no version of the log names."""
        root = self.io.strip(self.uri).rstrip("/") + "/"
        named = {self.io.strip(u)[len(root):] for u in self.load().file_uris()}
        on_disk = {p[len(root):] for p in self.io.find(self.uri) if p.endswith(".parquet") and "/_delta_log/" not in p}
        return on_disk - named

    def epoch_files(self, uid: str, epoch: int) -> list[str]:
        return self.io.find(f"{self.uri}/flinkish/{uid}/e{epoch:012d}")


def check_killed_at(point: str, epoch: int, table: Table, log: DecisionLog, cp: Path) -> None:
    decided, done = log.epochs()
    if point == "sink.before_decision":  # prepared files written, nothing decided or in the table
        assert epoch not in decided and table.epoch_files("out", epoch) and table.txn() == epoch - 1
    elif point == "sink.after_decision":  # decided, the table does not have it yet
        assert epoch in decided and epoch not in done and table.txn() == epoch - 1
    elif point == "sink.before_done":  # the table has it, the sink's done marker does not
        assert epoch not in done and table.txn() == epoch
    else:  # the table and the sink have it, Spark's commit log does not
        assert epoch in done and table.txn() == epoch and not (cp / "commits" / str(epoch)).exists()


# The keyed matrix: run k is killed at its point's 2nd hit, in epoch 1.. (the first epoch's files replace nothing).
KEYED_CHAIN = ["sink.before_decision", "delta.keyed.before_version", "sink.before_done"]
KEYED_LENGTHS = [600, 450]
HOT, COLD = 20, 200
CHANGES = [  # split s, sequence number seq -> a change of key(seq) * 2 + s
    f"CAST((CASE WHEN seq % 2 = 0 THEN seq % {HOT} ELSE 1000 + seq % {COLD} END) * 2 + split AS BIGINT) AS id",
    "concat('v', seq) AS v", "CAST(seq AS INT) AS n",
    "CASE WHEN seq % 9 = 4 THEN 'd' ELSE 'u' END AS _op", "CAST(seq AS BIGINT) AS _lsn",
    "CAST(NULL AS TIMESTAMP) AS _commit_ts",
]


def keyed_expected() -> list[tuple]:
    last: dict[int, tuple | None] = {}
    for split, length in enumerate(KEYED_LENGTHS):
        for seq in range(length):
            key = (seq % HOT if seq % 2 == 0 else 1000 + seq % COLD) * 2 + split
            last[key] = None if seq % 9 == 4 else (key, f"v{seq}", seq)
    return sorted(v for v in last.values() if v is not None)


def keyed_spec(cp: Path, endpoint: str) -> dict:
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/keyed-meta", "rowsPerSplit": ",".join(map(str, KEYED_LENGTHS)),
            "maxRowsPerTrigger": 150, "endpointUrl": endpoint}},
        "select": CHANGES,
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(cp), "options": {
            "uid": "out", "path": "s3://test/keyed", "mode": "upsert", "key": "id", "deletes": "true",
            "checkpointInterval": 3, "compactEvery": 4, "rowsPerFile": 50, "endpointUrl": endpoint}},
        "master": "local[2,4]",
    }


def check_keyed_killed_at(point: str, epoch: int, txn: Callable[[], int], log: DecisionLog) -> None:
    decided, done = log.epochs()
    if point == "sink.before_decision":
        assert epoch not in decided and txn() == epoch - 1
    elif point == "delta.keyed.before_version":  # decided; files and deletion vectors written, no version
        assert epoch in decided and txn() == epoch - 1
    else:  # sink.before_done
        assert epoch not in done and txn() == epoch


def kill_chain(run_pipeline: Callable[..., Any], name: str, spec: dict, chain: list[str], env: dict[str, str],
               check: Callable[[str, int], None]) -> None:
    """Run ``spec`` killed at each point of ``chain`` in turn (run k in epoch k), ``check`` after each kill."""
    for epoch, point in enumerate(chain, start=1):
        run = run_pipeline(spec, crash_at=f"{point}:2", env=env)
        assert run.killed, f"{name}: no kill at {point}: {run.output[-3000:]}"
        try:
            check(point, epoch)
        except AssertionError as e:
            raise AssertionError(f"{name}, killed at {point} in epoch {epoch}: {e}") from e


@pytest.mark.s3
@pytest.mark.timeout(2400)  # nine driver runs; on two cores shared with other Spark jobs one run took 2 minutes
def test_crash_matrices_and_random_kills_on_s3_with_failed_first_attempts(run_pipeline, s3_proc: str, tmp_path: Path) -> None:
    """kill -9 at the protocol points of the append (all but sink.after_commit) and of the keyed commit in turn,
    every task's first attempt failing; kill -9 at random moments under a processing-time trigger; then the three last runs. Each
    row (each key's last change) once, one table version per epoch, and no data file outside the log."""
    env = {"FLINKISH_FAIL_AT": "sink.write:first"}
    io = FileIO.for_url("s3://test", {"endpoint_url": s3_proc})

    # append, killed at every point of the commit
    append = {**spec(tmp_path / "cp", "s3://test/table", "s3://test/meta", endpointUrl=s3_proc), "master": "local[2,4]"}
    table = Table("s3://test/table", s3_proc)
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    kill_chain(run_pipeline, "append", append, CHAIN, env,
               lambda point, epoch: check_killed_at(point, epoch, table, log, tmp_path / "cp"))

    # upsert with deletes, killed at every point of the keyed commit
    keyed = keyed_spec(tmp_path / "keyed" / "cp", s3_proc)
    keyed_table = Table("s3://test/keyed", s3_proc)
    keyed_log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "keyed" / "cp" / "flinkish"), "out")

    def keyed_txn() -> int:
        try:
            return keyed_table.txn()
        except deltalake.exceptions.TableNotFoundError:
            return -1

    kill_chain(run_pipeline, "keyed", keyed, KEYED_CHAIN, env,
               lambda point, epoch: check_keyed_killed_at(point, epoch, keyed_txn, keyed_log))

    # append under a processing-time trigger, kill -9 of the whole driver at random moments: each kill
    # waits until the run committed an epoch, then lands 0-1.5 s later (somewhere in the next epoch)
    timed = {**spec(tmp_path / "timed" / "cp", "s3://test/timed", "s3://test/timed-meta", lengths=[600, 600],
                    per_trigger=200, endpointUrl=s3_proc), "trigger": "1 second", "end": "finish", "runSeconds": 300}
    timed_table = Table("s3://test/timed", s3_proc)

    def timed_committed() -> int:
        try:
            return timed_table.txn()
        except deltalake.exceptions.TableNotFoundError:  # the first run has not created it yet
            return -1

    rng = random.Random(12)
    for kill in range(2):
        start = timed_committed()
        run = run_pipeline(timed, kill_after=rng.uniform(0, 1.5), kill_when=lambda: timed_committed() > start)
        assert run.killed, f"random kill {kill + 1} of 2 did not land (the query ended): {run.output[-3000:]}"

    # the three last runs in one driver; every task's first attempt fails
    last = run_pipeline({"queries": [{**append}, {**keyed}, {**timed, "master": "local[2,4]"}]}, env=env, timeout=600)
    assert last.returncode == 0, last.output[-3000:]
    for name, out in zip(("append", "keyed", "random kills"), outputs(last.output)):
        assert "QUERY_END=finished" in out and "injected failure at sink.write (attempt 0)" in out, f"{name}: {out[-3000:]}"

    assert table.rows() == expected(), "append"
    assert table.epochs() == list(range(6)), "append"  # 900 rows at 150 per epoch: each epoch exactly once
    assert table.stray_files() == set(), "append"
    assert any(p.endswith(".checkpoint.parquet") for p in io.find("s3://test/table/_delta_log"))

    rows = sorted((r["id"], r["v"], r["n"]) for r in pa.table(keyed_table.load().scan()).to_pylist())
    assert rows == keyed_expected(), "keyed"
    keyed_epochs = sorted(int(h["flinkish.epoch"]) for h in keyed_table.load().history()
                          if h.get("flinkish.uid") == "out" and "flinkish.epoch" in h)  # (compactions have none)
    assert keyed_epochs == list(range(7)), "keyed"  # 1,050 changes at 150 per epoch, each epoch exactly once
    assert log_mentions(io, "s3://test/keyed", '"deletionVector"'), "keyed: replaced rows were marked, not rewritten"
    assert unreferenced(io, "s3://test/keyed") == set(), "keyed"

    assert timed_table.rows() == expected([600, 600]), "random kills"
    assert timed_table.epochs() == list(range(6)), "random kills"
    assert timed_table.stray_files() == set(), "random kills"


def test_two_queries_with_different_uids_append_concurrently(spark, tmp_path: Path) -> None:
    """Two drivers append to one table at the same time: this test's own (uid a, no driver start of its own) and a
    child driver (uid b), each under a processing-time trigger. The test's query starts first and spreads 30 commits
    over 30+ seconds; the child starts once the first of them is in the table and commits 10, so that they overlap
    however long the child's start takes on a loaded machine (up to ~30 s; with the child first and 10 commits each,
    a slow start of the test's query once let the child finish alone)."""
    import flinkish_spark

    table = tmp_path / "table"
    specs = {}
    for name, per_trigger in (("a", 20), ("b", 60)):
        s = spec(tmp_path / f"cp-{name}", str(table), str(tmp_path / f"meta-{name}"), uid=name, lengths=[300, 300],
                 per_trigger=per_trigger)
        s["sink"]["options"]["rowsPerFile"] = 1000
        s.update(trigger="1 second", end="finish", runSeconds=300)
        specs[name] = s
    a = specs["a"]
    stream = spark.readStream.format(a["source"]["format"])
    for key, value in a["source"]["options"].items():
        stream = stream.option(key, str(value))
    writer = stream.load().writeStream.format("flinkish.delta").option("checkpointLocation", a["sink"]["checkpointLocation"])
    for key, value in a["sink"]["options"].items():
        writer = writer.option(key, str(value))
    query = writer.trigger(processingTime="1 second").start()
    lines: list[str] = []
    proc = None
    try:
        deadline = time.monotonic() + 300
        # is_deltatable, not the _delta_log folder: the folder exists a moment before its first version does
        while not deltalake.DeltaTable.is_deltatable(str(table)) or not Table(str(table)).epochs("a"):
            assert query.isActive and time.monotonic() < deadline, "the test's query committed nothing"
            time.sleep(0.2)
        path = tmp_path / "b.json"
        path.write_text(json.dumps(child_spec(specs["b"])))
        proc = subprocess.Popen([sys.executable, "-m", "flinkish_spark.runner", str(path)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
        reader.start()
        assert flinkish_spark.await_finished(query, timeout=300) == "finished"
        proc.wait(timeout=400)
        reader.join(timeout=10)
    finally:
        query.stop()
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, "".join(lines)[-3000:]
    t = Table(str(table))
    assert t.rows() == expected([300, 300]) + expected([300, 300])
    assert t.epochs("a") == list(range(30)) and t.epochs("b") == list(range(10))
    # The two writers' versions interleave: they really committed at the same time.
    order = [h.get("flinkish.uid") for h in reversed(t.load().history()) if h.get("flinkish.uid")]
    assert sum(x != y for x, y in zip(order, order[1:])) >= 2, order
    assert t.stray_files() == set()
