"""flinkish.delta keyed modes: every bad input is one clear error, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from flinkish_spark.errors import ChangeDataError, ConfigError, TableMismatchError
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.changes import SCHEMA, Change, batch, run_epoch

deltalake = pytest.importorskip("deltalake")


def sink_at(path: Path, schema: StructType = SCHEMA, **options):
    from flinkish_spark.connectors.delta import DeltaSink

    return DeltaSink.at(str(path), uid="u", schema=schema, **{"mode": "upsert", "key": "id", "deletes": "true", **options})


@pytest.mark.parametrize("options, message", [
    ({"key": ""}, r"mode 'upsert' needs a key, and the query's columns carry no primary key .*option\('key'"),
    ({"key": "id,nope"}, r"option 'key' names \['nope'\], which the query does not have"),
    ({"key": "_lsn"}, r"option 'key' names \['_lsn'\], which steer the change application"),
    ({"mode": "history", "deletes": "soft"}, r"deletes 'soft' is for mode 'upsert'"),
    ({"mode": "append", "key": "id", "deletes": "false", "merge_mode": "mergeOnRead"}, r"option 'key' applies to mode 'upsert' or 'history'"),
    ({"partition_by": ("v",)}, r"option 'partitionBy' is not supported with mode 'upsert'"),
])
def test_bad_options_fail_before_the_table_exists(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sink_at(tmp_path / "t", **options)
    assert not (tmp_path / "t").exists()


def test_columns_the_mode_needs(tmp_path: Path) -> None:
    plain = StructType([StructField("id", LongType()), StructField("v", StringType())])
    with pytest.raises(ConfigError, match=r"deletes='true' needs a column '_op'"):
        sink_at(tmp_path / "t", schema=plain)
    with pytest.raises(ConfigError, match=r"mode 'history' needs a column '_commit_ts'"):
        sink_at(tmp_path / "t", schema=plain, mode="history", deletes="false")
    with_deleted = StructType(plain.fields + [StructField("_deleted", StringType()), StructField("_op", StringType())])
    with pytest.raises(ConfigError, match=r"the query has the column\(s\) \['_deleted'\], which mode 'upsert' with deletes='soft'"):
        sink_at(tmp_path / "t", schema=with_deleted, deletes="soft")
    assert not (tmp_path / "t").exists()
    sink_at(tmp_path / "t", schema=plain, deletes="false")  # plain upserts need no change columns


@pytest.mark.parametrize("changes, message", [
    ([Change(1, "c", "a", 1), Change(None, "u", "b", 2)], r"1 row\(s\) have a null in the key column 'id'"),  # type: ignore[arg-type]
    ([Change(1, "c", "a", 1), Change(2, "x", "b", 2), Change(3, "I", "c", 3)], r"the column '_op' holds I, x; a change is one of r"),
])
def test_bad_rows_fail_the_epoch_and_nothing_is_visible(tmp_path: Path, changes: list, message: str) -> None:
    path = tmp_path / "t"
    sink = sink_at(path)
    run_epoch(sink, 0, [Change(1, "r", "kept", None)])
    version = deltalake.DeltaTable(str(path)).version()
    good = sink.prepare(iter([batch([Change(5, "c", "fine", 1)])]), PrepareContext("u", 1, 0, 0))
    with pytest.raises(ChangeDataError, match=message):
        sink.prepare(iter([batch(changes)]), PrepareContext("u", 1, 1, 0))
    sink.abort([good], 1)  # what Spark's abort of the failed epoch does
    sink.cleanup(1, [])
    assert deltalake.DeltaTable(str(path)).version() == version
    assert not list((path / "flinkish" / "u").glob("e000000000001/*"))
    assert pa.table(deltalake.DeltaTable(str(path)).scan()).to_pylist() == [{"id": 1, "v": "kept", "n": 4}]


def test_a_key_type_change_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t"
    deltalake.DeltaTable.create(str(path), pa.schema([("id", pa.int32()), ("v", pa.string()), ("n", pa.int32())]),
                                configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(TableMismatchError, match=r"the key's type changed: 'id' is int32 in the table but int64 in the query"):
        sink_at(path)
    assert deltalake.DeltaTable(str(path)).version() == 0


@pytest.mark.parametrize("configuration, message", [
    ({"delta.enableDeletionVectors": "true", "delta.appendOnly": "true"}, r"delta.appendOnly=true \(append-only\)"),
    ({"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"}, r"delta.enableChangeDataFeed=true"),
])
def test_tables_whose_rules_a_keyed_writer_would_break(tmp_path: Path, configuration: dict, message: str) -> None:
    path = tmp_path / "t"
    deltalake.DeltaTable.create(str(path), pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int32())]),
                                configuration=configuration)
    with pytest.raises(TableMismatchError, match=message):
        sink_at(path)
    assert deltalake.DeltaTable(str(path)).version() == 0


def test_a_table_the_sink_creates_has_deletion_vectors(tmp_path: Path) -> None:
    sink_at(tmp_path / "t")
    protocol = deltalake.DeltaTable(str(tmp_path / "t")).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "deletionVectors" in protocol.reader_features and "deletionVectors" in protocol.writer_features
    assert deltalake.DeltaTable(str(tmp_path / "t")).metadata().configuration["delta.enableDeletionVectors"] == "true"
    key_int = StructType([StructField("id", IntegerType()), StructField("v", StringType())])
    sink_at(tmp_path / "c", schema=key_int, deletes="false", merge_mode="copyOnWrite")
    assert deltalake.DeltaTable(str(tmp_path / "c")).protocol().min_reader_version == 1  # copyOnWrite: plain
