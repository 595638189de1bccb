"""``spark.readStream.format("flinkish.mysql")``: MySQL/MariaDB tables as the CDC core's multi-table stream.

:mod:`.datasource` (options, the server check, the wiring), :mod:`.enumerator` (the driver: the CDC core's
enumerator over the change split the binary log feeds). The reader is the core's
(:class:`flinkish_spark.connectors.cdc.tables_reader.TablesReaderCore`) over
:class:`flinkish_spark.connectors.mysql.dialect.MysqlDialect`. docs/mysql-source.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flinkish_spark.connectors.mysql.source.datasource import MysqlSourceDataSource


def __getattr__(name: str) -> Any:
    if name == "MysqlSourceDataSource":
        from flinkish_spark.connectors.mysql.source.datasource import MysqlSourceDataSource

        return MysqlSourceDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MysqlSourceDataSource"]
