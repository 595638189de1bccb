"""PostgreSQL connectors: the exactly-once sink ``flinkish.postgres`` (two-phase commit).

:mod:`.connection` (URIs, masked passwords, connecting, type mapping) is shared with
other PostgreSQL connectors. psycopg and the ADBC driver are optional dependencies
(``pip install 'flinkish_spark[postgres]'``), imported only when a connection is opened.
"""

from flinkish_spark.connectors.postgres.sink import PostgresSink, PostgresSinkDataSource

__all__ = ["PostgresSink", "PostgresSinkDataSource"]
