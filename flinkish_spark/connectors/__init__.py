"""Built-in connectors: ``flinkish.sequence`` and ``flinkish.files`` sources, the ``flinkish.parquet`` and ``flinkish.postgres`` sinks."""

from flinkish_spark.connectors.files import FilesDataSource
from flinkish_spark.connectors.parquet_sink import ParquetSink, ParquetSinkDataSource
from flinkish_spark.connectors.postgres import PostgresSink, PostgresSinkDataSource
from flinkish_spark.connectors.sequence import SequenceDataSource

BUILTIN_SOURCES = (SequenceDataSource, FilesDataSource)
BUILTIN_SINKS = (ParquetSinkDataSource, PostgresSinkDataSource)

__all__ = ["BUILTIN_SINKS", "BUILTIN_SOURCES", "FilesDataSource", "ParquetSink", "ParquetSinkDataSource", "PostgresSink", "PostgresSinkDataSource", "SequenceDataSource"]
