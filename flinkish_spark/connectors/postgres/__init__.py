"""PostgreSQL connectors under one format name, ``flinkish.postgres``: the exactly-once sink
(two-phase commit) and the source (snapshot splits that finish, then a replication slot's changes).

:mod:`.connection` (URIs, masked passwords, connecting, type mapping) serves both
directions. psycopg and the ADBC driver are optional dependencies
(``pip install 'flinkish_spark[postgres]'``), imported only when a connection is opened.
"""

from flinkish_spark.connectors.postgres.datasource import PostgresDataSource
from flinkish_spark.connectors.postgres.sink import PostgresSink, PostgresSinkDataSource
from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource

__all__ = ["PostgresDataSource", "PostgresSink", "PostgresSinkDataSource", "PostgresSourceDataSource"]
