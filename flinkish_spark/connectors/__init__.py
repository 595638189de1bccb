"""Built-in connectors: ``flinkish.sequence`` and ``flinkish.files`` sources; ``flinkish.parquet``,
``flinkish.postgres``, ``flinkish.delta`` and ``flinkish.iceberg`` sinks (each imports its client library
-- psycopg/ADBC, deltalake, pyiceberg -- only when used)."""

from flinkish_spark.connectors.delta import DeltaSink, DeltaSinkDataSource
from flinkish_spark.connectors.files import FilesDataSource
from flinkish_spark.connectors.iceberg import IcebergSink, IcebergSinkDataSource
from flinkish_spark.connectors.parquet_sink import ParquetSink, ParquetSinkDataSource
from flinkish_spark.connectors.postgres import PostgresSink, PostgresSinkDataSource
from flinkish_spark.connectors.sequence import SequenceDataSource

BUILTIN_SOURCES = (SequenceDataSource, FilesDataSource)
BUILTIN_SINKS = (ParquetSinkDataSource, PostgresSinkDataSource, DeltaSinkDataSource, IcebergSinkDataSource)

__all__ = ["BUILTIN_SINKS", "BUILTIN_SOURCES", "DeltaSink", "DeltaSinkDataSource", "FilesDataSource", "IcebergSink",
           "IcebergSinkDataSource", "ParquetSink", "ParquetSinkDataSource", "PostgresSink", "PostgresSinkDataSource",
           "SequenceDataSource"]
