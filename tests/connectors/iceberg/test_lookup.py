"""Key lookup (connectors/iceberg/lookup.py): live rows of changed keys as (file, position),
candidates pruned by key bounds, rows already deleted by position deletes left out."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.sink.protocol import PrepareContext

pyiceberg = pytest.importorskip("pyiceberg")


def table_of(tmp_path: Path, columns: dict[str, pa.Array], files: int):
    """A table whose rows are split into ``files`` data files in order (rowsPerFile)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from flinkish_spark.connectors.iceberg import IcebergSink

    spark_types = {pa.int64(): LongType(), pa.string(): StringType()}
    schema = StructType([StructField(n, spark_types[a.type]) for n, a in columns.items()])
    n = len(next(iter(columns.values())))
    sink = IcebergSink.at("db.t", uid="u", schema=schema, checkpoint=str(tmp_path), rows_per_file=n // files)
    batch = pa.RecordBatch.from_pydict(columns)
    assert sink.commit([sink.prepare(iter([batch]), PrepareContext("u", 0, 0, 0))], 0) == "COMMITTED"
    return sink


def rows_at(table, found: pa.Table, column: str) -> list:
    """What the rows at the found (file, position) hold, read directly from the data files."""
    import pyarrow.parquet as pq

    out = []
    for path, pos in zip(found["file_path"].to_pylist(), found["pos"].to_pylist()):
        out.append(pq.read_table(path.removeprefix("file://"), columns=[column])[column][pos].as_py())
    return sorted(out)


def test_finds_live_rows_prunes_by_bounds_and_skips_deleted_positions(tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg.commit import Changes, commit_snapshot
    from flinkish_spark.connectors.iceberg.datafiles import to_data_file
    from flinkish_spark.connectors.iceberg.deletes import write_position_deletes
    from flinkish_spark.connectors.iceberg.lookup import LiveFiles, candidates, find

    ids = list(range(0, 1000, 2))  # 500 even ids in 5 files of 100, sorted: disjoint bounds
    sink = table_of(tmp_path, {"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids])}, files=5)
    table = sink.table()
    key = [table.schema().find_field("id")]
    live = LiveFiles(table)
    assert len(live.data) == 5
    keys = pa.table({"id": pa.array([4, 6, 7, 450, 2000], pa.int64())})  # 7 and 2000 are not in the table
    assert len(candidates(live, key, keys)) == 2  # 4, 6 in the first file, 450 in the fifth
    found = find(sink.io, live, key, keys)
    assert sorted(found["id"].to_pylist()) == [4, 6, 450] and rows_at(table, found, "id") == [4, 6, 450]
    # delete the row of 6 by position: the next lookup no longer finds it
    six = found.filter(pa.compute.equal(found["id"], 6))
    d = write_position_deletes(sink.io, f"{table.location()}/data/del", six, ())
    table = commit_snapshot(sink.catalog(), table, Changes(delete_files=[to_data_file(d, 0)]), 0, {})
    live = LiveFiles(table)
    applies = {f.path: live.deletes_for(f) for f in live.data}
    assert len(live.deletes) == 1 and applies.pop(six["file_path"][0].as_py()) == [d.path]
    assert list(applies.values()) == [[]] * 4  # exact file_path bounds: the other files are not matched
    assert sorted(find(sink.io, live, key, keys)["id"].to_pylist()) == [4, 450]
    assert sorted(find(sink.io, live, key, keys, threads=1)["id"].to_pylist()) == [4, 450]
    assert find(sink.io, live, key, keys.slice(0, 0)).num_rows == 0


def test_string_and_two_column_keys(tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg.lookup import LiveFiles, find

    sink = table_of(tmp_path, {"a": pa.array(["x", "x", "y", "y"]), "b": pa.array([1, 2, 1, 2], pa.int64()),
                               "v": pa.array(["x1", "x2", "y1", "y2"])}, files=2)
    table = sink.table()
    live = LiveFiles(table)
    one = [table.schema().find_field("a")]
    assert sorted(find(sink.io, live, one, pa.table({"a": ["y", "z"]}))["a"].to_pylist()) == ["y", "y"]
    two = [table.schema().find_field("a"), table.schema().find_field("b")]
    found = find(sink.io, live, two, pa.table({"a": ["x", "y", "y"], "b": pa.array([2, 2, 3], pa.int64())}))
    assert rows_at(table, found, "v") == ["x2", "y2"]
