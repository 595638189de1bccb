"""A cleanup never deletes a file that a committed snapshot added, whatever decision it is given.

As for Delta (tests/connectors/delta/test_cleanup.py): the table can hold the epoch from
another decision than the one cleanup is handed; its files must survive. Read back with pyiceberg.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")


def schema():
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("seq", LongType())])


def prepare(sink, epoch: int, values: list[int]):
    from flinkish_spark.sink.protocol import PrepareContext

    batch = pa.RecordBatch.from_pydict({"seq": pa.array(values, pa.int64())})
    return sink.prepare(iter([batch]), PrepareContext(sink.uid, epoch, 0, 0))


def test_cleanup_spares_the_files_another_decision_committed(tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg import IcebergSink

    first = IcebergSink.at("db.events", uid="u", schema=schema(), checkpoint=str(tmp_path))
    committed = prepare(first, 0, [1, 2, 3])
    assert first.commit([committed], 0) == "COMMITTED"
    first.cleanup(0, [committed])

    other = IcebergSink.at("db.events", uid="u", schema=schema(), checkpoint=str(tmp_path))
    stray = prepare(other, 0, [7, 8])
    assert other.commit([stray], 0) == "ALREADY_COMMITTED"
    other.cleanup(0, [stray])
    other.cleanup(0, [])
    table = other.catalog().load_table("db.events")
    assert sorted(table.scan().to_arrow()["seq"].to_pylist()) == [1, 2, 3]
    assert all(Path(t.file.file_path.removeprefix("file://")).exists() for t in table.scan().plan_files())
    assert not Path(stray.files[0].path.removeprefix("file://")).exists()
