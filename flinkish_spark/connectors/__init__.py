"""Built-in connectors: ``flinkish.sequence`` and ``flinkish.files`` sources, the ``flinkish.parquet`` sink, the ``flinkish.postgres`` source."""

from flinkish_spark.connectors.files import FilesDataSource
from flinkish_spark.connectors.parquet_sink import ParquetSink, ParquetSinkDataSource
from flinkish_spark.connectors.postgres import PostgresSourceDataSource
from flinkish_spark.connectors.sequence import SequenceDataSource

BUILTIN_SOURCES = (SequenceDataSource, FilesDataSource, PostgresSourceDataSource)
BUILTIN_SINKS = (ParquetSinkDataSource,)

__all__ = ["BUILTIN_SINKS", "BUILTIN_SOURCES", "FilesDataSource", "ParquetSink", "ParquetSinkDataSource", "PostgresSourceDataSource", "SequenceDataSource"]
