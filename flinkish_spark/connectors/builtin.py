"""The data sources :func:`flinkish_spark.register` registers with a session: every built-in format."""

from flinkish_spark.connectors.delta import DeltaSinkDataSource
from flinkish_spark.connectors.files import FilesDataSource
from flinkish_spark.connectors.iceberg import IcebergSinkDataSource
from flinkish_spark.connectors.mysql.source import MysqlSourceDataSource
from flinkish_spark.connectors.parquet_sink import ParquetSinkDataSource
from flinkish_spark.connectors.postgres import PostgresDataSource
from flinkish_spark.connectors.sequence import SequenceDataSource

# flinkish.postgres is one format for both directions: PostgresDataSource hands reads to the
# source class and writes to the sink class (Spark's registry keys data sources by name).
BUILTIN_SOURCES = (SequenceDataSource, FilesDataSource, PostgresDataSource, MysqlSourceDataSource)
BUILTIN_SINKS = (ParquetSinkDataSource, PostgresDataSource, DeltaSinkDataSource, IcebergSinkDataSource)
