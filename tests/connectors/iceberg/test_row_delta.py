"""Row-delta snapshots (connectors/iceberg/commit.py + deletes.py): data files and position delete
files in one snapshot, read back by pyiceberg's own scan (which applies the deletes)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.protocol import PrepareContext

pyiceberg = pytest.importorskip("pyiceberg")


def make_table(tmp_path: Path, rows: list[int], partitioned: bool = False):
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    from flinkish_spark.connectors.iceberg import IcebergSink

    schema = StructType([StructField("split", IntegerType()), StructField("id", LongType())])
    sink = IcebergSink.at("db.t", uid="u", schema=schema, checkpoint=str(tmp_path),
                          partition_by=("split",) if partitioned else ())
    if rows:
        batch = pa.RecordBatch.from_pydict({"split": pa.array([r % 2 for r in rows], pa.int32()), "id": rows})
        assert sink.commit([sink.prepare(iter([batch]), PrepareContext("u", 0, 0, 0))], 0) == "COMMITTED"
    return sink


def data_files(table) -> list[str]:
    return sorted(t.file.file_path for t in table.scan().plan_files())


def ids(table) -> list[int]:
    """The live ids as pyiceberg's scan reads them -- and polars' own Iceberg reader, which applies
    the position deletes with its own Parquet reader (DuckDB's iceberg extension is not offline)."""
    import polars as pl

    got = sorted(table.scan().to_arrow()["id"].to_pylist())
    assert sorted(pl.scan_iceberg(table, reader_override="native").collect()["id"].to_list()) == got
    return got


def commit(sink, table, changes, epoch: int):
    from flinkish_spark.connectors.iceberg.commit import commit_snapshot

    return commit_snapshot(sink.catalog(), table, changes, table.metadata.default_spec_id,
                           {"flinkish.uid": "u", "flinkish.epoch": str(epoch)})


def deletes(sink, table, positions: dict[str, list[int]], partition=()):
    from flinkish_spark.connectors.iceberg.datafiles import to_data_file
    from flinkish_spark.connectors.iceberg.deletes import write_position_deletes

    rows = pa.table({"file_path": [p for p, ps in positions.items() for _ in ps],
                     "pos": [x for ps in positions.values() for x in ps]})
    f = write_position_deletes(FileIO.for_url(str(sink.io.strip(table.location()))), f"{table.location()}/data/del",
                               rows, partition)
    return to_data_file(f, table.metadata.default_spec_id)


def new_rows(sink, values: list[int], epoch: int):
    from flinkish_spark.connectors.iceberg.datafiles import to_data_file

    batch = pa.RecordBatch.from_pydict({"split": pa.array([v % 2 for v in values], pa.int32()), "id": values})
    c = sink.prepare(iter([batch]), PrepareContext("u", epoch, 0, 0))
    return [to_data_file(f, 0) for f in c.files]


def test_one_snapshot_adds_data_and_position_deletes_that_pyiceberg_applies(tmp_path: Path) -> None:
    from pyiceberg.manifest import DataFileContent, ManifestContent

    from flinkish_spark.connectors.iceberg.commit import Changes

    sink = make_table(tmp_path, [10, 11, 12, 13, 14])  # one data file, positions 0..4
    table = sink.table()
    (old,) = data_files(table)
    # an upsert of 11 and 13 (new versions 111, 113 in a new file) and a delete of 14
    table = commit(sink, table, Changes(data_files=new_rows(sink, [111, 113], 1),
                                        delete_files=[deletes(sink, table, {old: [3, 1, 4]})]), 1)
    table = sink.catalog().load_table("db.t")
    assert ids(table) == [10, 12, 111, 113]
    snap = table.current_snapshot()
    assert snap.summary.operation.value == "overwrite"
    props = snap.summary.additional_properties
    assert (props["flinkish.uid"], props["flinkish.epoch"]) == ("u", "1")
    assert (props["added-position-deletes"], props["added-delete-files"], props["added-data-files"]) == ("3", "1", "1")
    assert (props["total-position-deletes"], props["total-delete-files"], props["total-data-files"]) == ("3", "1", "2")
    manifests = snap.manifests(table.io)
    (dm,) = [m for m in manifests if m.content == ManifestContent.DELETES]
    (entry,) = dm.fetch_manifest_entry(table.io)
    assert entry.data_file.content == DataFileContent.POSITION_DELETES
    assert entry.sequence_number == snap.sequence_number == 2  # inherited: applies to data of seq <= 2
    # the delete file is sorted by (file_path, pos) and carries the spec's field ids
    import pyarrow.parquet as pq
    f = pq.read_table(entry.data_file.file_path.removeprefix("file://"))
    assert f["pos"].to_pylist() == [1, 3, 4]
    assert [fld.metadata[b"PARQUET:field_id"] for fld in f.schema] == [b"2147483546", b"2147483545"]
    # scan planning matches the delete file to the old data file only (exact file_path bounds)
    tasks = {t.file.file_path: len(t.delete_files) for t in table.scan().plan_files()}
    assert tasks[old] == 1 and sorted(tasks.values()) == [0, 1]


def test_delete_only_marker_and_same_snapshot_deletes(tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg.commit import Changes

    sink = make_table(tmp_path, [1, 2, 3])
    table = sink.table()
    (old,) = data_files(table)
    table = commit(sink, table, Changes(delete_files=[deletes(sink, table, {old: [0]})]), 1)
    assert table.current_snapshot().summary.operation.value == "delete" and ids(table) == [2, 3]
    before = table.current_snapshot().manifest_list
    table = commit(sink, table, Changes(), 2)  # an epoch that changed nothing: a marker snapshot
    snap = table.current_snapshot()
    assert snap.summary.operation.value == "append" and snap.summary.additional_properties["flinkish.epoch"] == "2"
    assert ids(table) == [2, 3] and snap.manifest_list != before
    # a delete can hit a row of a data file added in the same snapshot (a duplicate of two tasks)
    added = new_rows(sink, [7, 8], 3)
    table = commit(sink, table, Changes(data_files=added, delete_files=[deletes(sink, table, {added[0].file_path: [1]})]), 3)
    assert ids(table) == [2, 3, 7]
    # ... but never a row of a data file added after it
    later = new_rows(sink, [9, 10], 4)
    table = commit(sink, table, Changes(data_files=later), 4)
    assert ids(table) == [2, 3, 7, 9, 10]


def test_partitioned_deletes_and_a_rewrite_that_removes_files(tmp_path: Path) -> None:
    from pyiceberg.manifest import ManifestEntryStatus

    from flinkish_spark.connectors.iceberg.commit import Changes

    sink = make_table(tmp_path, [0, 1, 2, 3, 4, 5], partitioned=True)  # split 0: 0 2 4, split 1: 1 3 5
    table = sink.table()
    by_split = {t.file.partition[0]: t.file.file_path for t in table.scan().plan_files()}
    d0 = deletes(sink, table, {by_split[0]: [1]}, partition=(0,))  # id 2
    d1 = deletes(sink, table, {by_split[1]: [0, 2]}, partition=(1,))  # ids 1, 5
    table = commit(sink, table, Changes(delete_files=[d0, d1]), 1)
    assert ids(table) == [0, 3, 4]
    assert sorted(table.scan(row_filter="split = 1").to_arrow()["id"].to_pylist()) == [3]
    # compaction of split 1: its data file and delete file go, one file with the live rows comes
    manifests = table.current_snapshot().manifests(table.io)
    where = {e.data_file.file_path: m.manifest_path for m in manifests for e in m.fetch_manifest_entry(table.io)}
    compacted = new_rows(sink, [3], 2)
    removed = {}
    for path in (by_split[1], d1.file_path):
        removed.setdefault(where[path], set()).add(path)
    table = commit(sink, table, Changes(data_files=compacted, rewrite=True,
                                        removed={m: frozenset(p) for m, p in removed.items()}), 2)
    snap = table.current_snapshot()
    assert snap.summary.operation.value == "replace" and ids(table) == [0, 3, 4]
    props = snap.summary.additional_properties
    assert (props["deleted-data-files"], props["removed-delete-files"], props["removed-position-deletes"]) == ("1", "1", "2")
    assert (props["total-data-files"], props["total-delete-files"], props["total-records"]) == ("2", "1", "4")
    statuses = sorted((e.data_file.file_path, e.status) for m in snap.manifests(table.io)
                      for e in m.fetch_manifest_entry(table.io, discard_deleted=False))
    assert (by_split[1], ManifestEntryStatus.DELETED) in statuses and (d1.file_path, ManifestEntryStatus.DELETED) in statuses
    table = commit(sink, table, Changes(), 3)  # the next snapshot drops manifests with nothing live
    assert all((m.added_files_count or 0) + (m.existing_files_count or 0) > 0
               for m in table.current_snapshot().manifests(table.io))
    assert ids(table) == [0, 3, 4]
    with pytest.raises(ValueError, match="not live in snapshot"):
        commit(sink, table, Changes(removed={where[by_split[1]]: frozenset([by_split[1]])}, rewrite=True), 4)
