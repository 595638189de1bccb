"""flinkish.iceberg routing options: what is refused at start(), with nothing written (the sink's DataSource, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from flinkish_spark.connectors.lakehouse.routing import STREAM_COLUMNS
from flinkish_spark.errors import ConfigError

pytest.importorskip("pyiceberg")

STREAM = StructType([StructField(n, LongType() if n == "_lsn" else StringType()) for n in STREAM_COLUMNS])


def source(tmp_path: Path, **options: str):
    from flinkish_spark.connectors.iceberg.sink import IcebergSinkDataSource

    return IcebergSinkDataSource({"uid": "m", "checkpoint": str(tmp_path / "meta"), "table": "mirror.{schema}_{table}",
                                  **options})


@pytest.mark.parametrize("options, message", [
    ({"mode": "history", "deletes": "soft"}, r"deletes 'soft' is for mode 'upsert'"),
    ({"tableModes": '{"tables": "public.x"}'}, r"option 'tableModes' is a JSON dict"),
    ({"key": "id", "deletes": "true"}, r"option 'key' cannot be combined with routing"),
    ({"partitionBy": "v"}, r"option 'partitionBy' cannot be combined with routing"),
    ({"table": "mirror.{db}_{table}"}, r"a placeholder other than \{schema\} and \{table\}"),
    ({"table": "{table}"}, r"'table' must be namespace\.name"),
])
def test_options_routing_refuses(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        source(tmp_path, **options)
    assert not list((tmp_path / "meta").rglob("*.json"))


def test_routing_takes_only_the_multi_table_stream(tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg.routed import RoutedIcebergSink

    ds = source(tmp_path, mergeMode="copyOnWrite", compactEvery="4", mode="history",
                tableModes='[{"tables": "public.s*", "mode": "upsert", "deletes": "soft"}]')
    sink = ds.sink(STREAM)
    assert isinstance(sink, RoutedIcebergSink) and sink.merge_mode == "copyOnWrite" and sink.compact_every == 4
    assert sink.modes.of("public.orders").mode == "history" and sink.modes.of("public.s1").deletes == "soft"
    plain = StructType([StructField("id", LongType()), StructField("v", StringType())])
    with pytest.raises(ConfigError, match=r"multi-table stream.*writes id, v"):
        ds.sink(plain)


def test_a_source_table_name_with_a_dot_is_refused_naming_it(tmp_path: Path) -> None:
    from flinkish_spark.connectors.lakehouse.routing import Route

    with pytest.raises(ConfigError, match=r"source table 'public\.a\.b' cannot be routed.*'a\.b' holds a '\.'.*!public\.a\.b"):
        Route("mirror.{schema}_{table}", "iceberg").target("public.a.b")
