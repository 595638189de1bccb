"""flinkish.delta under kill -9, task failures, random kills and a concurrent writer.

Pipelines run in child driver processes (conftest.run_pipeline). What is checked is what
a user of the table would see: rows read with deltalake (and DuckDB over the files the
log lists), the epoch each table version committed (its commit info), and data files on
storage that no version names.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.runner import child_spec
from flinkish_spark.sink.decisions import DecisionLog

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

CHAIN = ["sink.before_decision", "sink.after_decision", "sink.before_done", "sink.after_commit"]
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


@pytest.mark.s3
@pytest.mark.timeout(1800)  # five driver runs; on two cores shared with other Spark jobs one run took 2 minutes
def test_crash_matrix_on_s3_with_failed_first_attempts(run_pipeline, s3_proc: str, tmp_path: Path) -> None:
    """kill -9 at each protocol point in turn, every task's first attempt failing: each row once,
    one table version per epoch, and no data file outside the log."""
    s = {**spec(tmp_path / "cp", "s3://test/table", "s3://test/meta", endpointUrl=s3_proc), "master": "local[2,4]"}
    env = {"FLINKISH_FAIL_AT": "sink.write:first"}
    table = Table("s3://test/table", s3_proc)
    io = FileIO.for_url("s3://test", {"endpoint_url": s3_proc})
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    for epoch, point in enumerate(CHAIN, start=1):  # run k is killed in epoch k (the point's 2nd pass)
        run = run_pipeline(s, crash_at=f"{point}:2", env=env)
        assert run.killed, f"no kill at {point}: {run.output[-3000:]}"
        check_killed_at(point, epoch, table, log, tmp_path / "cp")
    last = run_pipeline(s, env=env)
    assert last.returncode == 0, last.output[-3000:]
    assert "injected failure at sink.write (attempt 0)" in last.output
    assert table.rows() == expected()
    assert table.epochs() == list(range(6))  # 900 rows at 150 per epoch: each epoch exactly once
    assert table.stray_files() == set()
    assert any(p.endswith(".checkpoint.parquet") for p in io.find("s3://test/table/_delta_log"))


def test_two_queries_with_different_uids_append_concurrently(tmp_path: Path) -> None:
    table = tmp_path / "table"
    specs = []
    for name in ("a", "b"):
        s = spec(tmp_path / f"cp-{name}", str(table), str(tmp_path / f"meta-{name}"), uid=name, lengths=[300, 300],
                 per_trigger=60)
        s["sink"]["options"]["rowsPerFile"] = 1000
        # A processing-time trigger spreads each query's 10 commits over 10+ seconds: they overlap.
        s.update(trigger="1 second", end="finish", runSeconds=300)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(child_spec(s)))
        specs.append(path)
    procs = [subprocess.Popen([sys.executable, "-m", "flinkish_spark.runner", str(p)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for p in specs]
    try:
        outs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outs)
    t = Table(str(table))
    assert t.rows() == expected([300, 300]) + expected([300, 300])
    assert t.epochs("a") == t.epochs("b") == list(range(10))
    # The two writers' versions interleave: they really committed at the same time.
    order = [h.get("flinkish.uid") for h in reversed(t.load().history()) if h.get("flinkish.uid")]
    assert order != sorted(order)
    assert t.stray_files() == set()


@pytest.mark.s3
def test_random_kill_until_done_on_s3_under_processing_time_trigger(run_with_random_kills, s3_proc: str, tmp_path: Path) -> None:
    """kill -9 of the whole driver at random moments, restarted until the bounded query ends by itself."""
    s = spec(tmp_path / "cp", "s3://test/table", "s3://test/meta", lengths=[600, 600], per_trigger=200, endpointUrl=s3_proc)
    table = Table("s3://test/table", s3_proc)

    def committed() -> int:
        try:
            return table.txn()
        except deltalake.exceptions.TableNotFoundError:  # the first run has not created it yet
            return -1

    run_with_random_kills(s, committed, kills=2, seed=12)
    assert table.rows() == expected([600, 600])
    assert table.epochs() == list(range(6))
    assert table.stray_files() == set()
