"""foreachBatch functions that flinkish returns pickle, as Spark Connect needs: it ships them to a
Python process on the server (STREAMING_CONNECT_SERIALIZATION_ERROR otherwise), where they build
what they need on first use."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql.types import LongType, StringType, StructField, StructType

import flinkish_spark
from flinkish_spark.connectors.parquet_sink import ParquetSink

SCHEMA = StructType([StructField("id", LongType())])
KEYED = StructType([StructField("id", LongType()), StructField("_op", StringType())])


def _delta(tmp_path: Path):  # type: ignore[no-untyped-def]
    from flinkish_spark.connectors.delta.sink import DeltaSink

    return flinkish_spark.transactional(DeltaSink.at(str(tmp_path / "delta"), uid="d", schema=SCHEMA), uid="d",
                                        checkpoint=str(tmp_path / "meta"))


def _iceberg(tmp_path: Path):  # type: ignore[no-untyped-def]
    from flinkish_spark.connectors.iceberg.sink import IcebergSink

    sink = IcebergSink.at("db.t", uid="i", schema=SCHEMA, checkpoint=str(tmp_path / "meta"),
                          warehouse=str(tmp_path / "warehouse"))
    return flinkish_spark.transactional(sink, uid="i", checkpoint=str(tmp_path / "meta"))


def _delta_keyed(tmp_path: Path):  # type: ignore[no-untyped-def]
    from flinkish_spark.connectors.delta.sink import DeltaSink

    sink = DeltaSink.at(str(tmp_path / "delta"), uid="d", schema=KEYED, mode="upsert", key="id", deletes="true")
    return flinkish_spark.transactional(sink, uid="d", checkpoint=str(tmp_path / "meta"))


def _iceberg_keyed(tmp_path: Path):  # type: ignore[no-untyped-def]
    from flinkish_spark.connectors.iceberg.sink import IcebergSink

    sink = IcebergSink.at("db.t", uid="i", schema=KEYED, checkpoint=str(tmp_path / "meta"),
                          warehouse=str(tmp_path / "warehouse"), mode="upsert", key="id", deletes="true")
    return flinkish_spark.transactional(sink, uid="i", checkpoint=str(tmp_path / "meta"))


MAKERS = {
    "files_sink": lambda tmp: flinkish_spark.files_sink(str(tmp / "out"), uid="f", checkpoint=str(tmp / "meta")),
    "transactional(ParquetSink)": lambda tmp: flinkish_spark.transactional(
        ParquetSink.at(str(tmp / "out"), uid="p", schema=SCHEMA), uid="p", checkpoint=str(tmp / "meta")),
    "transactional(DeltaSink)": _delta,
    "transactional(IcebergSink)": _iceberg,
    "transactional(DeltaSink keyed)": _delta_keyed,
    "transactional(IcebergSink keyed)": _iceberg_keyed,
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_foreach_batch_function_pickles(kind: str, tmp_path: Path) -> None:
    fn = MAKERS[kind](tmp_path)
    assert callable(cloudpickle.loads(cloudpickle.dumps(fn)))
