"""Built-in connectors: the ``flinkish.sequence`` generator and the ``flinkish.files`` source."""

from flinkish_spark.connectors.files import FilesDataSource
from flinkish_spark.connectors.sequence import SequenceDataSource

BUILTIN_SOURCES = (SequenceDataSource, FilesDataSource)

__all__ = ["BUILTIN_SOURCES", "FilesDataSource", "SequenceDataSource"]
