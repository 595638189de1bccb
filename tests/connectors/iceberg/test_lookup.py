"""Key lookup on Iceberg tables: connectors/iceberg/lookup.py gives the shared KeyLookup
(connectors/lakehouse/key_lookup.py) the snapshot's live files with their key bounds and
deleted positions; live rows of changed keys come back as (file, position)."""

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


def rows_at(matches, column: str) -> list:
    """What the rows at the matched (file, position)s hold, read directly from the data files."""
    import pyarrow.parquet as pq

    out = []
    for path, (positions, _) in matches.by_file.items():
        values = pq.read_table(path.removeprefix("file://"), columns=[column])[column]
        out += [values[int(p)].as_py() for p in positions]
    return sorted(out)


def find(sink, table, key: tuple[str, ...], keys: pa.Table):
    from flinkish_spark.connectors.iceberg.lookup import LiveFiles
    from flinkish_spark.connectors.lakehouse.key_lookup import KeyLookup

    live = LiveFiles(table)
    lookup = KeyLookup(sink.io, key)
    candidates = live.candidates(sink.io, table.schema().find_field(key[0]))
    return lookup, lookup.find(keys.sort_by([(k, "ascending") for k in key]), candidates)


def test_finds_live_rows_prunes_by_bounds_and_skips_deleted_positions(tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg.commit import Changes, commit_snapshot
    from flinkish_spark.connectors.iceberg.datafiles import to_data_file
    from flinkish_spark.connectors.iceberg.deletes import write_position_deletes
    from flinkish_spark.connectors.iceberg.lookup import LiveFiles

    ids = list(range(0, 1000, 2))  # 500 even ids in 5 files of 100, sorted: disjoint bounds
    sink = table_of(tmp_path, {"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids])}, files=5)
    table = sink.table()
    assert len(LiveFiles(table).data) == 5
    keys = pa.table({"id": pa.array([4, 6, 7, 450, 2000], pa.int64())})  # 7 and 2000 are not in the table
    lookup, found = find(sink, table, ("id",), keys)
    assert lookup.files_read == 2  # 4, 6 in the first file, 450 in the fifth: the others are pruned by bounds
    assert rows_at(found, "id") == [4, 6, 450]
    # delete the row of 6 by position: the next lookup no longer finds it
    (six_file,) = [p for p, (pos, key_index) in found.by_file.items() if 1 in key_index]
    six_pos = found.by_file[six_file][0][list(found.by_file[six_file][1]).index(1)]
    d = write_position_deletes(sink.io, f"{table.location()}/data/del",
                               pa.table({"file_path": [six_file], "pos": pa.array([six_pos], pa.int64())}), ())
    table = commit_snapshot(sink.catalog(), table, Changes(delete_files=[to_data_file(d, 0)]), 0, {})
    live = LiveFiles(table)
    applies = {f.path: live.deletes_for(f) for f in live.data}
    assert len(live.deletes) == 1 and applies.pop(six_file) == [d.path]
    assert list(applies.values()) == [[]] * 4  # exact file_path bounds: the other files are not matched
    lookup, found = find(sink, table, ("id",), keys)
    assert rows_at(found, "id") == [4, 450] and lookup.files_read == 0  # the key indexes are cached


def test_string_and_two_column_keys(tmp_path: Path) -> None:
    sink = table_of(tmp_path, {"a": pa.array(["x", "x", "y", "y"]), "b": pa.array([1, 2, 1, 2], pa.int64()),
                               "v": pa.array(["x1", "x2", "y1", "y2"])}, files=2)
    table = sink.table()
    _, found = find(sink, table, ("a",), pa.table({"a": ["y", "z"]}))
    assert rows_at(found, "v") == ["y1", "y2"]
    _, found = find(sink, table, ("a", "b"), pa.table({"a": ["x", "y", "y"], "b": pa.array([2, 2, 3], pa.int64())}))
    assert rows_at(found, "v") == ["x2", "y2"]


def test_bounds_written_before_a_type_promotion_are_read_by_their_width(tmp_path: Path) -> None:
    """Iceberg's ``int -> long`` and ``float -> double`` keep the older files' 4-byte bounds (the spec reads
    them as the wider type): the lookup decodes each bound by its stored width, whichever pyiceberg reads
    them (0.11 decoded them as 8 bytes: struct.error on every commit after ALTER ... TYPE bigint of a key)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType, NestedField

    from flinkish_spark.connectors.iceberg.lookup import LiveFiles
    from flinkish_spark.io.fileio import FileIO

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", Schema(NestedField(1, "id", IntegerType(), required=False),
                                                NestedField(2, "f", FloatType(), required=False)))
    table.append(pa.table({"id": pa.array([-7, 3], pa.int32()), "f": pa.array([-1.5, 2.5], pa.float32())}))
    with table.update_schema() as update:  # what the routed sink does for a widened column
        update.update_column("id", field_type=LongType())
        update.update_column("f", field_type=DoubleType())
    table = catalog.load_table("db.t")
    table.append(pa.table({"id": pa.array([2**40], pa.int64()), "f": pa.array([1e300], pa.float64())}))
    io = FileIO.for_url(table.location())
    live = LiveFiles(table)
    bounds = {column: sorted((c.lower, c.upper) for c in live.candidates(io, table.schema().find_field(column)))
              for column in ("id", "f")}
    assert bounds == {"id": [(-7, 3), (2**40, 2**40)], "f": [(-1.5, 2.5), (1e300, 1e300)]}
