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


# Keyed changes (issue 17) through Connect: one sequence split as changes of KEYS keys, many per
# key and epoch, one in nine a delete; the target must hold each key's last change.
KEYS, CHANGES = 25, 700


def keyed_pipeline(tmp_path: Path, sink: dict[str, Any]) -> dict:
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": str(CHANGES), "maxRowsPerTrigger": 200}},
        "select": [f"CAST(seq % {KEYS} AS BIGINT) AS id", "concat('v', seq) AS v",
                   "CASE WHEN seq % 9 = 4 THEN 'd' ELSE 'u' END AS _op", "CAST(seq AS BIGINT) AS _lsn"],
        "sink": {"checkpointLocation": str(tmp_path / "cp"), **sink},
        "trigger": "1 second", "end": "finish", "runSeconds": 240,
    }


def keyed_expected() -> list[tuple]:
    last: dict[int, tuple | None] = {}
    for seq in range(CHANGES):
        last[seq % KEYS] = None if seq % 9 == 4 else (seq % KEYS, f"v{seq}")
    return sorted(v for v in last.values() if v is not None)


KEYED = {"mode": "upsert", "key": "id", "deletes": "true"}


def test_keyed_delta_sink(run_client, tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    import pyarrow as pa

    table = tmp_path / "table"
    run = run_client(keyed_pipeline(tmp_path, {"format": "flinkish.delta", "options": {
        "uid": "out", "path": str(table), **KEYED}}))
    assert_finished(run)
    rows = pa.table(deltalake.DeltaTable(str(table)).scan()).to_pylist()  # deletion vectors applied
    assert sorted((r["id"], r["v"]) for r in rows) == keyed_expected()


def test_keyed_iceberg_sink(run_client, tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog.sql import SqlCatalog

    uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse"
    run = run_client(keyed_pipeline(tmp_path, {"format": "flinkish.iceberg", "options": {
        "uid": "out", "table": "db.events", "catalogUri": uri, "warehouse": warehouse, **KEYED}}))
    assert_finished(run)
    t = SqlCatalog("flinkish", uri=uri, warehouse=warehouse).load_table("db.events").scan().to_arrow()
    assert sorted(zip(t["id"].to_pylist(), t["v"].to_pylist())) == keyed_expected()
