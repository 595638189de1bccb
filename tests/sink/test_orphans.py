"""flinkish orphans: staged files no commit will use are found and removed; pending ones are kept."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from flinkish_spark.connectors.parquet_sink import ParquetSink
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext

SCHEMA = StructType([StructField("id", LongType())])


def batch(start: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": pa.array(range(start, start + 10), pa.int64())})


def orphans_cli(*args: str, endpoint: str | None = None) -> dict:
    extra = ["--endpoint-url", endpoint] if endpoint else []
    out = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "orphans", *args, "--json", *extra],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_orphans_are_listed_and_removed_pending_kept(backend: str, tmp_path, request) -> None:
    if backend == "s3":
        endpoint = request.getfixturevalue("s3")
        io, path, meta = FileIO.for_url("s3://test", {"endpoint_url": endpoint}), "s3://test/out", "s3://test/meta"
    else:
        endpoint = None
        io, path, meta = FileIO.for_url(str(tmp_path)), str(tmp_path / "out"), str(tmp_path / "meta")
    sink = ParquetSink(io, path, "out", SCHEMA, (), 1000, 1 << 30, "snappy")
    log = DecisionLog(io, meta, "out")
    # epoch 0 committed; a failed attempt's file of epoch 0 left behind (a cleanup that crashed)
    committed = [sink.prepare(iter([batch(0)]), PrepareContext("out", 0, p, 0)) for p in range(2)]
    commit_epoch(sink, log, 0, committed, run_id="r1")
    sink.prepare(iter([batch(100)]), PrepareContext("out", 0, 0, 1))
    # epoch 1 prepared, the driver died before deciding: a restart would redo it
    sink.prepare(iter([batch(20)]), PrepareContext("out", 1, 0, 0))

    listed = orphans_cli(path, "--uid", "out", "--checkpoint", meta, endpoint=endpoint)
    states = sorted((e["epoch"], e["state"]) for e in listed["staged"])
    assert states == [(0, "orphan"), (1, "pending")] and listed["removed"] == []

    removed = orphans_cli(path, "--uid", "out", "--checkpoint", meta, "--delete", endpoint=endpoint)
    assert [p.split("/")[-2] for p in removed["removed"]] == ["000000000000"]
    assert sorted(e["state"] for e in orphans_cli(path, "--uid", "out", "--checkpoint", meta, endpoint=endpoint)["staged"]) == ["pending"]

    orphans_cli(path, "--uid", "out", "--checkpoint", meta, "--delete", "--include-pending", endpoint=endpoint)
    assert orphans_cli(path, "--uid", "out", "--checkpoint", meta, endpoint=endpoint)["staged"] == []
    # the committed output is untouched
    finals = [p for p in io.find(path) if p.endswith(".parquet")]
    assert len(finals) == 2
