"""``flinkish orphans postgresql://...``: prepared transactions and staged rows no commit will use."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from flinkish_spark.cli import main
from flinkish_spark.connectors.postgres import PostgresSink
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext

SCHEMA = StructType([StructField("id", LongType())])


def batches(*ids: int):
    yield pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})


def gids(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as c:
        return sorted(r[0] for r in c.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"))


def test_orphans_lists_and_removes_prepared_transactions_and_staged_rows(pg_url: str, tmp_path: Path, capsys) -> None:
    prepared = PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA, create_table=True, commit_mode="prepared")
    staged = PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA, commit_mode="staged")
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "out")
    try:
        done = prepared.prepare(batches(1), PrepareContext("out", 0, 0, 0))
        failed_attempt = prepared.prepare(batches(2), PrepareContext("out", 0, 1, 0))
        assert done is not None and failed_attempt is not None
        log.record(0, [prepared.encode(done)], "run")
        assert prepared.commit([done], 0) == "COMMITTED"
        log.mark_done(0)
        awaiting = prepared.prepare(batches(3), PrepareContext("out", 1, 0, 0))  # decided, commit not done
        assert awaiting is not None
        log.record(1, [prepared.encode(awaiting)], "run")
        newest = prepared.prepare(batches(4), PrepareContext("out", 2, 0, 0))  # undecided newest epoch
        staged_rows = staged.prepare(batches(5, 6), PrepareContext("out", 0, 3, 0))  # staged in a committed epoch
        assert newest is not None and staged_rows is not None

        assert main(["orphans", pg_url, "--uid", "out", "--checkpoint", str(tmp_path / "meta"), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        states = {(e["kind"], e["epoch"], e["state"]) for e in report["leftovers"]}
        assert states == {("prepared", 0, "orphan"), ("prepared", 1, "decided"), ("prepared", 2, "pending"),
                          ("staged", 0, "orphan")}
        assert main(["orphans", pg_url, "--uid", "out", "--checkpoint", str(tmp_path / "meta"), "--delete"]) == 0
        text = capsys.readouterr().out
        assert "removed 2" in text
        assert gids(pg_url) == sorted([awaiting.gid, newest.gid])
        with psycopg.connect(pg_url) as c:
            assert c.execute(f"SELECT count(*) FROM {staged.plan.staging}").fetchone() == (0,)
        assert main(["orphans", pg_url, "--uid", "out", "--checkpoint", str(tmp_path / "meta"), "--delete",
                     "--include-pending"]) == 0
        assert gids(pg_url) == [awaiting.gid]  # a decided epoch is never removed: a restart commits it
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            for g in gids(pg_url):
                c.execute(f"ROLLBACK PREPARED '{g}'")
