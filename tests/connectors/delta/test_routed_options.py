"""flinkish.delta routing options: what is refused at start(), with nothing written (the sink's DataSource, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
from flinkish_spark.connectors.delta.sink import DeltaSinkDataSource
from flinkish_spark.connectors.lakehouse.routing import STREAM_COLUMNS
from flinkish_spark.errors import ConfigError
from flinkish_spark.testing.stream_rows import table_schema

pytest.importorskip("deltalake")

STREAM = StructType([StructField(n, LongType() if n == "_lsn" else StringType()) for n in STREAM_COLUMNS])


def source(tmp_path: Path, **options: str) -> DeltaSinkDataSource:
    return DeltaSinkDataSource({"uid": "m", "checkpoint": str(tmp_path / "meta"),
                                "path": str(tmp_path / "lake" / "{schema}" / "{table}"), **options})


@pytest.mark.parametrize("options, message", [
    ({"key": "id", "deletes": "true"}, r"option 'key' cannot be combined with routing"),
    ({"mode": "append"}, r"mode 'append' is not one of upsert, history"),
    ({"mode": "history", "deletes": "soft"}, r"deletes 'soft' is for mode 'upsert'"),
    ({"tableModes": '[{"tables": "public.x", "mode": "scd2"}]'}, r"tableModes rule 1 \('public.x'\): mode 'scd2'"),
    ({"partitionBy": "v"}, r"option 'partitionBy' cannot be combined with routing"),
    ({"trackHistoryColumns": "v"}, r"option trackHistoryColumns is for mode 'history'"),
    ({"path": "{schema}/{table}"}, r"needs a folder before its first placeholder"),
    ({"path": "/lake/{db}/{table}"}, r"a placeholder other than \{schema\} and \{table\}"),
    ({"commitProcesses": "65"}, r"'commitProcesses' must be a whole number from 0 .* to 64, got '65'"),
    ({"commitProcesses": "-1"}, r"'commitProcesses' must be a whole number from 0 .* to 64, got '-1'"),
    ({"commitProcesses": "two"}, r"'commitProcesses' must be a whole number from 0 .* to 64, got 'two'"),
])
def test_options_routing_refuses(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        source(tmp_path, **options)
    assert not (tmp_path / "lake").exists()


def test_routing_takes_only_the_multi_table_stream(tmp_path: Path) -> None:
    ds = source(tmp_path, mergeMode="copyOnWrite", compactEvery="4", commitProcesses="3")
    sink = ds.sink(STREAM)
    assert isinstance(sink, RoutedDeltaSink) and sink.merge_mode == "copyOnWrite" and sink.commit_processes == 3
    assert source(tmp_path).sink(STREAM).commit_processes == 0  # default: the commit worker's threads
    assert sink.target("public.t", table_schema("public.t", [("id", "int")], ("id",))).compact_every == 4  # each table compacts
    plain = StructType([StructField("id", LongType()), StructField("v", StringType())])
    with pytest.raises(ConfigError, match=r"multi-table stream.*writes id, v"):
        ds.sink(plain)
    assert not (tmp_path / "lake").exists()


def test_mode_deletes_and_table_modes_give_each_routed_table_its_shape(tmp_path: Path) -> None:
    ds = source(tmp_path, deletes="soft", tableModes='[{"tables": "public.h_*", "mode": "history", "deletes": "true"}]')
    sink = ds.sink(STREAM)
    t = table_schema("public.t", [("id", "int")], ("id",))
    assert sink.target("public.t", t).plan.table_schema.names == ["id", "_deleted"]
    h = table_schema("public.h_1", [("id", "int")], ("id",))
    assert sink.target("public.h_1", h).plan.table_schema.names == ["id", "_valid_from", "_valid_to", "_current"]
    with pytest.raises(ConfigError, match=r"'tableModes' gives the tables of a routing sink their modes"):
        DeltaSinkDataSource({"uid": "m", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "one"),
                             "mode": "upsert", "tableModes": "[]"})
    with pytest.raises(ConfigError, match=r"'commitProcesses' spreads the commits of a routing sink's tables"):
        DeltaSinkDataSource({"uid": "m", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "one"),
                             "commitProcesses": "2"})


def test_a_one_table_sink_refuses_the_tracked_columns_of_a_routing_sink(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"option 'trackHistoryColumns' gives the tables of a routing sink"):
        DeltaSinkDataSource({"uid": "m", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "t"),
                             "mode": "history", "trackHistoryColumns": "v"})
