"""A keyed target's checkpoints written from the sink's state, and its tables read at a start without delta-rs:
what a long-running mirror's commit costs must not grow with every version its tables ever had (delta-rs lists
the whole ``_delta_log`` to load a table or write a checkpoint). Routed sink in process, no Spark."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flinkish_spark.connectors.delta.log import DeltaLog
from flinkish_spark.connectors.delta.state import load_state
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

from tests.connectors.delta.test_routed import Mirror

deltalake = pytest.importorskip("deltalake")

SCHEMAS = [table_schema(f"public.c{i}", [("id", "int"), ("v", "text")], ("id",)) for i in range(2)]


def _restart() -> None:
    """What a new driver process starts with: no state, no delta-rs table, no head, no vectors, no key index."""
    from flinkish_spark.connectors.delta import live, table
    from flinkish_spark.connectors.lakehouse.key_lookup import CACHE

    live._STATES.clear()
    live._forget_vectors()
    table._TABLES.clear()
    table._HEADS.clear()
    CACHE.clear()


def _epochs(m: Mirror, s: StreamBuilder, first: int, last: int, schemas: list = SCHEMAS) -> None:
    for e in range(first, last):  # an update, a delete and an insert per table: vectors, removes, new files
        s.transaction(*[(schema, "u", {"id": 1 + e % 5, "v": f"e{e}"}) for schema in schemas],
                      *[(schema, "d", {"id": 10 + e}) for schema in schemas],
                      *[(schema, "c", {"id": 100 + e, "v": f"n{e}"}) for schema in schemas])
        m.epoch(s.batch())


def _expected(last: int) -> list[dict]:
    rows = {i: f"x{i}" for i in range(1, 30)}
    for e in range(1, last):
        rows[1 + e % 5] = f"e{e}"
        rows.pop(10 + e, None)
        rows[100 + e] = f"n{e}"
    return [{"id": k, "v": v} for k, v in sorted(rows.items())]


def test_the_commit_and_a_restart_never_load_the_tables_through_delta_rs(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """After the tables exist, neither a restarted process's first commit nor the checkpoints every 3 versions
    load a table through delta-rs: each of its loads, updates and checkpoints lists every version of the log
    (O(the table's history)). The rows, txns and checkpoints are what delta-rs reads afterwards."""
    m = Mirror(tmp_path)  # checkpoint_interval=3
    s = StreamBuilder()
    for schema in SCHEMAS:
        s.snapshot(schema, [{"id": i, "v": f"x{i}"} for i in range(1, 30)])
    m.epoch(s.batch())
    _epochs(m, s, 1, 3)
    _restart()

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("delta-rs loaded a table on the commit's path")

    for name in ("__init__", "update_incremental", "create_checkpoint"):
        monkeypatch.setattr(deltalake.DeltaTable, name, refused)
    _epochs(m, s, 3, 9)  # versions 3..8 of each table: two checkpoints each
    monkeypatch.undo()
    for schema in SCHEMAS:
        log = Path(m.path(schema.table)) / "_delta_log"
        assert len(list(log.glob("*.checkpoint.parquet"))) >= 2, sorted(p.name for p in log.iterdir())
        assert m.rows(schema.table, "id") == _expected(9)
        assert deltalake.DeltaTable(m.path(schema.table)).transaction_version("m") == 8


def test_a_checkpoint_the_sink_writes_is_the_table_for_delta_rs_and_for_the_sink(tmp_path: Path) -> None:
    """The sink's checkpoint after one of delta-rs's (a process started on it): with every commit up to it
    deleted (what log cleanup does), delta-rs and the sink's own load read the same rows, txn and vectors
    from it, and it holds the tombstones delta-rs's checkpoint of that version holds (removed files, for
    VACUUM and time travel; none of a file live again with another vector)."""
    m = Mirror(tmp_path)
    s = StreamBuilder()
    one = SCHEMAS[:1]
    s.snapshot(one[0], [{"id": i, "v": f"x{i}"} for i in range(1, 30)])
    m.epoch(s.batch())
    _epochs(m, s, 1, 4, one)
    path = m.path(one[0].table)
    deltalake.DeltaTable(path).create_checkpoint()
    by_delta_rs = deltalake.DeltaTable(path).version()
    _restart()
    _epochs(m, s, 4, 9, one)
    full = load_state(DeltaLog(FileIO.for_url(path), path), 100)
    newest = max(int(p.name[:20]) for p in Path(path, "_delta_log").glob("*.checkpoint.parquet"))
    assert newest > by_delta_rs
    cleaned, again = str(tmp_path / "cleaned"), str(tmp_path / "again")
    shutil.copytree(path, cleaned)
    shutil.copytree(path, again)
    for v in range(newest + 1):
        Path(cleaned, "_delta_log", f"{v:020d}.json").unlink()
    from_checkpoint = load_state(DeltaLog(FileIO.for_url(cleaned), cleaned), 100)
    assert from_checkpoint.checkpoint[0] == newest
    assert {p: (f.dv, f.size) for p, f in from_checkpoint.files.items()} == {p: (f.dv, f.size) for p, f in full.files.items()}
    assert from_checkpoint.txns == full.txns == {"m": 8}
    table = deltalake.DeltaTable(cleaned)
    assert sorted(pa.table(table.scan()).to_pylist(), key=lambda r: r["id"]) == _expected(9)
    assert table.transaction_version("m") == 8

    def removes(root: str) -> list[tuple]:
        column = pq.read_table(Path(root, "_delta_log", f"{newest:020d}.checkpoint.parquet")).column("remove")
        return sorted((r["path"], str(r["deletionVector"]), r["deletionTimestamp"]) for r in column.to_pylist() if r)

    ours = removes(path)
    for p in Path(again, "_delta_log").iterdir():  # delta-rs's checkpoint of the same version
        if "checkpoint" in p.name or (p.name.endswith(".json") and int(p.name[:20]) > newest):
            p.unlink()
    deltalake.DeltaTable(again).create_checkpoint()
    assert len(ours) >= 5 and ours == removes(again)


def test_tombstones_older_than_the_tables_retention_are_left_out(tmp_path: Path) -> None:
    """``delta.deletedFileRetentionDuration`` (1 week by default) bounds what a checkpoint carries of removed files."""
    from flinkish_spark.connectors.delta.checkpoint import write_checkpoint

    m = Mirror(tmp_path)
    s = StreamBuilder()
    for schema in SCHEMAS[:1]:
        s.snapshot(schema, [{"id": i, "v": f"x{i}"} for i in range(1, 30)])
    m.epoch(s.batch())
    s.transaction((SCHEMAS[0], "d", {"id": 1}))
    m.epoch(s.batch())
    path = m.path(SCHEMAS[0].table)
    log = DeltaLog(FileIO.for_url(path), path)

    def tombstones(retention: str | None) -> int:
        state = load_state(log, 100)
        assert state.metadata is not None
        config = dict(state.metadata["configuration"])
        if retention is not None:
            config["delta.deletedFileRetentionDuration"] = retention
        state.metadata["configuration"] = config
        for p in Path(path, "_delta_log").glob("*checkpoint*"):
            p.unlink()
        state.checkpoint = (-1, ())
        assert write_checkpoint(log, state, state.version)
        table = pq.read_table(Path(path, "_delta_log", f"{state.version:020d}.checkpoint.parquet"))
        return sum(r is not None for r in table.column("remove").to_pylist())

    assert tombstones(None) == 1  # the snapshot's file, replaced by itself with a vector
    Path(path, "_delta_log", "_last_checkpoint").write_bytes(b'{"vers')  # a hint torn by a crash: the log is listed
    assert load_state(log, 100).checkpoint[0] == load_state(log, 100).version
    assert tombstones("interval 2 days") == 1
    assert tombstones("interval 0 seconds") == 0
