"""Sinks through Spark Connect (server in its own process, client in a child process): files_sink
(a foreachBatch function shipped to the server), flinkish.delta and flinkish.postgres. Each
pipeline is bounded under a processing-time trigger and must end by itself; the target is read
back by an independent reader."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

pytestmark = pytest.mark.slow
LENGTHS = [120, 80]


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def pipeline(tmp_path: Path, sink: dict[str, Any]) -> dict:
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 70}},
        "sink": {"checkpointLocation": str(tmp_path / "cp"), **sink},
        "trigger": "1 second", "end": "finish", "runSeconds": 240,
    }


def assert_finished(run: Any) -> None:
    assert run.returncode == 0 and "QUERY_END=finished" in run.output, run.output[-3000:]


def test_files_sink(run_client, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = run_client(pipeline(tmp_path, {"sparkFiles": {
        "uid": "out", "path": str(out), "checkpoint": str(tmp_path / "sinkmeta"), "format": "json",
        "partitionBy": "split"}}))
    assert_finished(run)
    t = ds.dataset(str(out), format="json", partitioning="hive").to_table()
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == expected()


def test_delta_sink(run_client, tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "table"
    run = run_client(pipeline(tmp_path, {"format": "flinkish.delta", "options": {"uid": "out", "path": str(table)}}))
    assert_finished(run)
    t = deltalake.DeltaTable(str(table)).to_pyarrow_table(columns=["split", "seq"])
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == expected()


def test_postgres_sink(run_client, pg_url: str, tmp_path: Path) -> None:
    import psycopg

    run = run_client(pipeline(tmp_path, {"format": "flinkish.postgres", "options": {
        "uid": "out", "url": pg_url, "table": "public.events", "createTable": "true"}}))
    assert_finished(run)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        got = conn.execute("SELECT split, seq FROM public.events").fetchall()
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()").fetchone()
    assert collections.Counter(got) == expected()
    assert prepared == (0,)
