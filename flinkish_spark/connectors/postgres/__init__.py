"""PostgreSQL connectors under one format name, ``flinkish.postgres``: the exactly-once sink
(two-phase commit) and the source (snapshot splits that finish, then a replication slot's changes).

:mod:`.connection` (URIs, masked passwords, connecting, type mapping) serves both
directions. psycopg and the ADBC driver are optional dependencies
(``pip install 'flinkish_spark[postgres]'``), imported only when a connection is opened.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flinkish_spark.connectors.postgres.datasource import PostgresDataSource
    from flinkish_spark.connectors.postgres.sink import PostgresSink, PostgresSinkDataSource
    from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource

# Imported on first use: the stream's row contract (.rows) is imported by the routing code that
# the sink itself uses (connectors/lakehouse/routing.py), so importing the sink here would be a cycle.
_LAZY = {"PostgresDataSource": "datasource", "PostgresSink": "sink", "PostgresSinkDataSource": "sink",
         "PostgresSourceDataSource": "source"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PostgresDataSource", "PostgresSink", "PostgresSinkDataSource", "PostgresSourceDataSource"]
