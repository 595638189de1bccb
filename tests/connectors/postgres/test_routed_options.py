"""flinkish.postgres routing options: what is refused at start(), before anything is created (the sink's DataSource, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from flinkish_spark.connectors.lakehouse.routing import STREAM_COLUMNS
from flinkish_spark.connectors.postgres.routed import RoutedPostgresSink, bookkeeping_schema
from flinkish_spark.connectors.postgres.sink import PostgresSinkDataSource
from flinkish_spark.errors import ConfigError

psycopg = pytest.importorskip("psycopg")

STREAM = StructType([StructField(n, LongType() if n == "_lsn" else StringType()) for n in STREAM_COLUMNS])


def source(tmp_path: Path, url: str, **options: str) -> PostgresSinkDataSource:
    return PostgresSinkDataSource({"uid": "m", "checkpoint": str(tmp_path / "meta"), "url": url,
                                   "table": "mirror.{schema}_{table}", **options})


def schemas(url: str) -> list[str]:
    with psycopg.connect(url) as c:
        return [r[0] for r in c.execute("SELECT nspname FROM pg_namespace WHERE nspname = 'mirror'").fetchall()]


@pytest.mark.parametrize("options, message", [
    ({"key": "id", "deletes": "true"}, r"option 'key' cannot be combined with routing"),
    ({"mode": "append"}, r"mode 'append' is not one of upsert, history"),
    ({"mode": "history", "deletes": "soft"}, r"deletes 'soft' is for mode 'upsert'"),
    ({"tableModes": '[{"tables": "public.*", "mode": "scd2"}]'}, r"tableModes rule 1 \('public.\*'\): mode 'scd2'"),
    ({"commitMode": "prepared"}, r"commitMode 'prepared' cannot be used with routing"),
    ({"tableModes": '[{"tables": "public.e", "partitionBy": "day"}]'},
     r"give partitionBy, which this sink's routed targets do not take \(a partitioned PostgreSQL table needs"),
    ({"table": "mirror.{db}_{table}"}, r"a placeholder other than \{schema\} and \{table\}"),
    ({"table": "a.b.{table}"}, r"must be 'schema.table'"),
])
def test_options_routing_refuses(pg_url, tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        source(tmp_path, pg_url, **options)
    assert schemas(pg_url) == []


def test_mode_deletes_and_table_modes_give_each_table_its_shape(pg_url, tmp_path: Path) -> None:
    ds = source(tmp_path, pg_url, mode="history", deletes="false",
                tableModes='[{"tables": "sales.*", "mode": "upsert", "deletes": "soft"}]')
    assert ds.modes.of("public.orders").describe() == "history, deletes false"
    assert ds.modes.of("sales.orders").describe() == "upsert, deletes soft"


def test_routing_takes_only_the_multi_table_stream_and_creates_its_tables_in_the_templates_schema(pg_url, tmp_path: Path) -> None:
    ds = source(tmp_path, pg_url)
    plain = StructType([StructField("id", LongType()), StructField("v", StringType())])
    with pytest.raises(ConfigError, match=r"multi-table stream.*writes id, v"):
        ds.sink(plain)
    assert schemas(pg_url) == []
    assert isinstance(ds.sink(STREAM), RoutedPostgresSink) and ds.create_table  # createTable defaults to true here
    assert ds.modes.of("public.x").describe() == "upsert"  # every table upsert, deletes applied, unless asked
    assert schemas(pg_url) == ["mirror"]
    assert bookkeeping_schema("{schema}.{table}") == "public" and bookkeeping_schema("{table}") == "public"
