"""A cleanup never deletes a file that a committed table version names, whatever decision it is given.

The framework hands ``cleanup(epoch, keep)`` the decided committables. When the table holds
the epoch from *another* decision (the sink's metadata was reset, a second writer used the
uid), deleting every file of the epoch's folder that ``keep`` does not name would delete
committed data and leave the table unreadable. Read back with delta-rs.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")


def schema():
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("seq", LongType())])


def prepare(sink, epoch: int, values: list[int]):
    from flinkish_spark.sink.protocol import PrepareContext

    batch = pa.RecordBatch.from_pydict({"seq": pa.array(values, pa.int64())})
    return sink.prepare(iter([batch]), PrepareContext(sink.uid, epoch, 0, 0))


def test_cleanup_spares_the_files_another_decision_committed(tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta import DeltaSink

    path = str(tmp_path / "t")
    first = DeltaSink.at(path, uid="u", schema=schema())
    committed = prepare(first, 0, [1, 2, 3])
    assert first.commit([committed], 0) == "COMMITTED"
    first.cleanup(0, [committed])

    # Another object (another process) is handed another decision for the same epoch.
    other = DeltaSink.at(path, uid="u", schema=schema())
    stray = prepare(other, 0, [7, 8])
    assert other.commit([stray], 0) == "ALREADY_COMMITTED"
    other.cleanup(0, [stray])
    other.cleanup(0, [])  # and the abort path, which knows no decision
    table = deltalake.DeltaTable(path)
    assert sorted(table.to_pyarrow_table()["seq"].to_pylist()) == [1, 2, 3]  # readable, and only the commit's rows
    assert all(Path(u).exists() for u in table.file_uris())
    assert not (tmp_path / "t" / stray.files[0].path).exists()  # what no commit named is gone


def test_cleanup_of_an_epoch_the_table_does_not_hold_removes_its_files(tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta import DeltaSink

    path = str(tmp_path / "t")
    sink = DeltaSink.at(path, uid="u", schema=schema())
    assert sink.commit([prepare(sink, 0, [1])], 0) == "COMMITTED"
    orphan = prepare(DeltaSink.at(path, uid="u", schema=schema()), 1, [5])  # a crashed run's prepare of epoch 1
    DeltaSink.at(path, uid="u", schema=schema()).cleanup(1, [])
    assert not (tmp_path / "t" / orphan.files[0].path).exists()
    assert deltalake.DeltaTable(path).to_pyarrow_table()["seq"].to_pylist() == [1]
