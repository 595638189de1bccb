"""A lakehouse sink's cleanup never deletes a file that a committed table version names,
whatever decision it is handed -- in append and keyed modes alike.

The framework hands ``cleanup(epoch, keep)`` the decided committables. When the table holds
the epoch from *another* decision (the sink's metadata was reset, a second writer used the
uid), deleting every file of the epoch's folder that ``keep`` does not name would delete
committed data and leave the table unreadable. In the keyed modes the epoch's commit also
names files the driver wrote (deletion vectors, position deletes, copies), and a compaction
right after it may remove the epoch's files from the newest version -- a reader of the
epoch's version (time travel, a reader that loaded it) still reads them. Read back with
delta-rs and pyiceberg, every version and snapshot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest


def schema():
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("seq", LongType())])


def prepare(sink, epoch: int, values: list[int]):
    from flinkish_spark.sink.protocol import PrepareContext

    batch = pa.RecordBatch.from_pydict({"seq": pa.array(values, pa.int64())})
    return sink.prepare(iter([batch]), PrepareContext(sink.uid, epoch, 0, 0))


def delta(tmp_path: Path) -> tuple[Callable[[], Any], Callable[[], tuple[list[int], list[str]]]]:
    deltalake = pytest.importorskip("deltalake")
    from flinkish_spark.connectors.delta import DeltaSink

    path = str(tmp_path / "t")

    def table() -> tuple[list[int], list[str]]:
        t = deltalake.DeltaTable(path)
        return sorted(t.to_pyarrow_table()["seq"].to_pylist()), t.file_uris()

    return lambda: DeltaSink.at(path, uid="u", schema=schema()), table


def iceberg(tmp_path: Path) -> tuple[Callable[[], Any], Callable[[], tuple[list[int], list[str]]]]:
    pytest.importorskip("pyiceberg")
    from flinkish_spark.connectors.iceberg import IcebergSink

    def sink() -> Any:
        return IcebergSink.at("db.events", uid="u", schema=schema(), checkpoint=str(tmp_path))

    def table() -> tuple[list[int], list[str]]:
        t = sink().catalog().load_table("db.events")
        files = [f.file.file_path.removeprefix("file://") for f in t.scan().plan_files()]
        return sorted(t.scan().to_arrow()["seq"].to_pylist()), files

    return sink, table


def local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


@pytest.mark.parametrize("fmt", [delta, iceberg], ids=["delta", "iceberg"])
def test_cleanup_spares_the_files_another_decision_committed(tmp_path: Path, fmt: Any) -> None:
    make, table = fmt(tmp_path)
    first = make()
    committed = prepare(first, 0, [1, 2, 3])
    assert first.commit([committed], 0) == "COMMITTED"
    first.cleanup(0, [committed])

    # Another object (another process) is handed another decision for the same epoch.
    other = make()
    stray = prepare(other, 0, [7, 8])
    assert other.commit([stray], 0) == "ALREADY_COMMITTED"
    other.cleanup(0, [stray])
    other.cleanup(0, [])  # and the abort path, which knows no decision
    rows, files = table()
    assert rows == [1, 2, 3]  # readable, and only the commit's rows
    assert files and all(local(f).exists() for f in files)
    stray_path = stray.files[0].path
    assert not (local(stray_path) if stray_path.startswith(("/", "file:")) else tmp_path / "t" / stray_path).exists()


@pytest.mark.parametrize("fmt", [delta, iceberg], ids=["delta", "iceberg"])
def test_cleanup_of_an_epoch_the_table_does_not_hold_removes_its_files(tmp_path: Path, fmt: Any) -> None:
    make, table = fmt(tmp_path)
    sink = make()
    assert sink.commit([prepare(sink, 0, [1])], 0) == "COMMITTED"
    orphan = prepare(make(), 1, [5])  # a crashed run's prepare of epoch 1
    make().cleanup(1, [])
    orphan_path = orphan.files[0].path
    assert not (local(orphan_path) if orphan_path.startswith(("/", "file:")) else tmp_path / "t" / orphan_path).exists()
    assert table()[0] == [1]


def keyed_delta(tmp_path: Path) -> tuple[Callable[[], Any], Callable[[], None]]:
    """A keyed Delta sink compacting after every epoch; the check reads every version of the log."""
    deltalake = pytest.importorskip("deltalake")
    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.testing.changes import SCHEMA
    from flinkish_spark.testing.delta_log import referenced

    path = tmp_path / "t"

    def every_version_reads() -> None:
        named = referenced(FileIO.for_url(str(path)), str(path))
        assert sorted(n for n in named if not (path / n).exists()) == []
        for version in range(deltalake.DeltaTable(str(path)).version() + 1):
            pa.table(deltalake.DeltaTable(str(path), version=version).scan())

    return (lambda: DeltaSink.at(str(path), uid="u", schema=SCHEMA, mode="upsert", key="id", deletes="true",
                                 compact_every=1)), every_version_reads


def keyed_iceberg(tmp_path: Path) -> tuple[Callable[[], Any], Callable[[], None]]:
    """A keyed Iceberg sink compacting after every epoch; the check reads every snapshot."""
    pytest.importorskip("pyiceberg")
    from flinkish_spark.connectors.iceberg import IcebergSink
    from flinkish_spark.testing.changes import SCHEMA

    def sink() -> Any:
        return IcebergSink.at("db.events", uid="u", schema=SCHEMA, checkpoint=str(tmp_path), mode="upsert", key="id",
                              deletes="true", compact_every=1)

    def every_snapshot_reads() -> None:
        t = sink().catalog().load_table("db.events")
        for snapshot in t.snapshots():
            for task in t.scan(snapshot_id=snapshot.snapshot_id).plan_files():
                for f in [task.file, *task.delete_files]:
                    assert local(f.file_path).exists(), f.file_path
            t.scan(snapshot_id=snapshot.snapshot_id).to_arrow()

    return sink, every_snapshot_reads


@pytest.mark.parametrize("fmt", [keyed_delta, keyed_iceberg], ids=["delta", "iceberg"])
def test_keyed_cleanup_spares_every_file_a_committed_version_names(tmp_path: Path, fmt: Any) -> None:
    """Two tasks per epoch replace the keys of the epoch before (vectors or position deletes), a
    compaction follows every epoch; then another object is handed another decision for the epoch,
    and the abort path none: every version/snapshot stays readable, only the latest rows are seen."""
    from flinkish_spark.testing.changes import Change, prepare as prepare_changes, run_epoch

    make, every_version_reads = fmt(tmp_path)
    sink = make()
    for epoch in range(4):
        changes = [Change(k, "u", f"e{epoch}", epoch * 100 + k, part=k % 2) for k in range(6)]
        assert run_epoch(sink, epoch, changes) == "COMMITTED"
        other = make()  # another process, another decision for the same epoch
        stray = [c for c in prepare_changes(other, epoch, [Change(99, "c", "stray", 1)]) if c is not None]
        assert other.commit(stray, epoch) == "ALREADY_COMMITTED"
        other.cleanup(epoch, stray)
        other.cleanup(epoch, [])
        assert all(not local(p).exists() for c in stray for p in stray_paths(c, tmp_path / "t"))
        every_version_reads()
    assert sink.commit([], 4) == "COMMITTED"  # an epoch that changed nothing still marks the table
    sink.cleanup(4, [])
    every_version_reads()
    assert make().last_committed_epoch() == 4  # what a reset checkpointLocation is checked against


def stray_paths(committable: Any, table_root: Path) -> list[str]:
    paths = [f.path for f in committable.files]
    return [p if p.startswith(("/", "file:")) else str(table_root / p) for p in paths]
