"""A Delta table deleted and created again at the same path in one driver process (a notebook).

The sink keeps, per process, the head of the log it appends to (version and the uid's txn).
A table folder deleted and created anew is another table: the sink must notice, or it takes
the new table's epochs for committed ones and writes versions after the old table's last one
(a log without the versions in between). Read back with delta-rs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

deltalake = pytest.importorskip("deltalake")


def schema():
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("seq", LongType())])


def commit(sink, epoch: int, values: list[int]) -> str:
    from flinkish_spark.sink.protocol import PrepareContext

    batch = pa.RecordBatch.from_pydict({"seq": pa.array(values, pa.int64())})
    prepared = sink.prepare(iter([batch]), PrepareContext(sink.uid, epoch, 0, 0))
    outcome = sink.commit([prepared], epoch)
    sink.cleanup(epoch, [prepared])
    return outcome


def log_versions(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


@pytest.mark.parametrize("others", [0, 5])
def test_a_recreated_table_is_a_new_table(tmp_path: Path, others: int) -> None:
    """``others``: commits another writer adds to the new table before the sink's first."""
    from flinkish_spark.connectors.delta import DeltaSink

    path = tmp_path / "t"
    old = DeltaSink.at(str(path), uid="u", schema=schema())
    for epoch in range(3):
        assert commit(old, epoch, [epoch]) == "COMMITTED"
    assert log_versions(path) == [0, 1, 2, 3]

    shutil.rmtree(path)  # the notebook deletes the table and starts over
    new = DeltaSink.at(str(path), uid="u", schema=schema())
    for i in range(others):
        deltalake.write_deltalake(str(path), pa.table({"seq": pa.array([100 + i], pa.int64())}), mode="append")
    assert commit(new, 0, [10]) == "COMMITTED"
    assert commit(new, 1, [11]) == "COMMITTED"
    table = deltalake.DeltaTable(str(path))
    assert sorted(table.to_pyarrow_table()["seq"].to_pylist()) == [10, 11] + [100 + i for i in range(others)]
    assert log_versions(path) == list(range(others + 3))  # no gap: every version a reader needs is there
    assert table.transaction_version("u") == 1


@pytest.mark.parametrize("others", [0, 5])
def test_a_recreated_keyed_table_is_a_new_table(tmp_path: Path, others: int) -> None:
    """The keyed modes keep more per process than the head: the table's live files and txns, the
    deletion vectors and the files' key indexes. A table created again is another table for all of them."""
    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.testing.changes import SCHEMA, Change, run_epoch

    path = tmp_path / "t"

    def sink():
        return DeltaSink.at(str(path), uid="u", schema=SCHEMA, mode="upsert", key="id", deletes="true")

    old = sink()
    for epoch in range(3):  # key 1 replaced in every epoch: deletion vectors in epochs 1 and 2
        assert run_epoch(old, epoch, [Change(1, "u", f"old{epoch}", epoch), Change(2 + epoch, "c", "x", epoch)]) == "COMMITTED"
    shutil.rmtree(path)  # the notebook deletes the table and starts over
    new = sink()
    for i in range(others):
        deltalake.write_deltalake(str(path), pa.table({"id": pa.array([100 + i], pa.int64()), "v": ["o"],
                                                       "n": pa.array([1], pa.int32())}), mode="append")
    assert run_epoch(new, 0, [Change(1, "c", "new0", 10)]) == "COMMITTED"
    assert run_epoch(new, 1, [Change(1, "u", "new1", 11), Change(2, "c", "y", 12)]) == "COMMITTED"
    table = deltalake.DeltaTable(str(path))
    got = sorted((r["id"], r["v"]) for r in pa.table(table.scan()).to_pylist())
    assert got == [(1, "new1"), (2, "y")] + [(100 + i, "o") for i in range(others)]
    assert log_versions(path) == list(range(others + 3))
    assert table.transaction_version("u") == 1
