"""Built-in connectors: ``flinkish.sequence``, ``flinkish.files``, ``flinkish.postgres`` and ``flinkish.mysql`` sources; ``flinkish.parquet``,
``flinkish.postgres``, ``flinkish.delta`` and ``flinkish.iceberg`` sinks (each imports its client library
-- psycopg/ADBC, deltalake, pyiceberg -- only when used).

The names below are imported on first access (:mod:`flinkish_spark.lazy_exports`): a Spark worker
that unpickles one connector's data source imports that connector, not all of them.
"""

from typing import TYPE_CHECKING

from flinkish_spark.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from flinkish_spark.connectors.builtin import BUILTIN_SINKS, BUILTIN_SOURCES
    from flinkish_spark.connectors.delta import DeltaSink, DeltaSinkDataSource
    from flinkish_spark.connectors.files import FilesDataSource
    from flinkish_spark.connectors.iceberg import IcebergSink, IcebergSinkDataSource
    from flinkish_spark.connectors.mysql.source import MysqlSourceDataSource
    from flinkish_spark.connectors.parquet_sink import ParquetSink, ParquetSinkDataSource
    from flinkish_spark.connectors.postgres import (PostgresDataSource, PostgresSink, PostgresSinkDataSource,
                                                    PostgresSourceDataSource)
    from flinkish_spark.connectors.sequence import SequenceDataSource
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "BUILTIN_SINKS": "flinkish_spark.connectors.builtin",
        "BUILTIN_SOURCES": "flinkish_spark.connectors.builtin",
        "DeltaSink": "flinkish_spark.connectors.delta",
        "DeltaSinkDataSource": "flinkish_spark.connectors.delta",
        "FilesDataSource": "flinkish_spark.connectors.files",
        "IcebergSink": "flinkish_spark.connectors.iceberg",
        "IcebergSinkDataSource": "flinkish_spark.connectors.iceberg",
        "MysqlSourceDataSource": "flinkish_spark.connectors.mysql.source",
        "ParquetSink": "flinkish_spark.connectors.parquet_sink",
        "ParquetSinkDataSource": "flinkish_spark.connectors.parquet_sink",
        "PostgresDataSource": "flinkish_spark.connectors.postgres",
        "PostgresSink": "flinkish_spark.connectors.postgres",
        "PostgresSinkDataSource": "flinkish_spark.connectors.postgres",
        "PostgresSourceDataSource": "flinkish_spark.connectors.postgres",
        "SequenceDataSource": "flinkish_spark.connectors.sequence",
    })

__all__ = ["BUILTIN_SINKS", "BUILTIN_SOURCES", "DeltaSink", "DeltaSinkDataSource", "FilesDataSource", "IcebergSink",
           "IcebergSinkDataSource", "MysqlSourceDataSource", "ParquetSink", "ParquetSinkDataSource", "PostgresDataSource", "PostgresSink",
           "PostgresSinkDataSource", "PostgresSourceDataSource", "SequenceDataSource"]
