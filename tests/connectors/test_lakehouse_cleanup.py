"""A lakehouse sink's cleanup never deletes a file that a committed table version names,
whatever decision it is handed.

The framework hands ``cleanup(epoch, keep)`` the decided committables. When the table holds
the epoch from *another* decision (the sink's metadata was reset, a second writer used the
uid), deleting every file of the epoch's folder that ``keep`` does not name would delete
committed data and leave the table unreadable. Read back with delta-rs and pyiceberg.
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
