"""PostgreSQL connectors: the ``flinkish.postgres`` source (snapshot splits, then a replication slot's changes).

Importing this package does not import psycopg or ADBC: they are imported when a
connection is opened (``pip install 'flinkish_spark[postgres]'``).
"""

from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource

__all__ = ["PostgresSourceDataSource"]
