"""Built-in connectors: ``flinkish.sequence``, ``flinkish.files`` and ``flinkish.postgres`` sources; ``flinkish.parquet``,
``flinkish.postgres``, ``flinkish.delta`` and ``flinkish.iceberg`` sinks (each imports its client library
-- psycopg/ADBC, deltalake, pyiceberg -- only when used)."""

from flinkish_spark.connectors.delta import DeltaSink, DeltaSinkDataSource
from flinkish_spark.connectors.files import FilesDataSource
from flinkish_spark.connectors.iceberg import IcebergSink, IcebergSinkDataSource
from flinkish_spark.connectors.parquet_sink import ParquetSink, ParquetSinkDataSource
from flinkish_spark.connectors.postgres import PostgresDataSource, PostgresSink, PostgresSinkDataSource, PostgresSourceDataSource
from flinkish_spark.connectors.sequence import SequenceDataSource

# flinkish.postgres is one format for both directions: PostgresDataSource hands reads to the
# source class and writes to the sink class (Spark's registry keys data sources by name).
BUILTIN_SOURCES = (SequenceDataSource, FilesDataSource, PostgresDataSource)
BUILTIN_SINKS = (ParquetSinkDataSource, PostgresDataSource, DeltaSinkDataSource, IcebergSinkDataSource)

__all__ = ["BUILTIN_SINKS", "BUILTIN_SOURCES", "DeltaSink", "DeltaSinkDataSource", "FilesDataSource", "IcebergSink",
           "IcebergSinkDataSource", "ParquetSink", "ParquetSinkDataSource", "PostgresDataSource", "PostgresSink",
           "PostgresSinkDataSource", "PostgresSourceDataSource", "SequenceDataSource"]
