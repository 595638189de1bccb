"""What the enumerator (driver) and the reader (executors) need from the ``flinkish.postgres`` source.

A protocol, so that they do not import the data source that creates them (no import cycle): the
CDC core's options (:class:`flinkish_spark.connectors.cdc.host.CdcSourceHost`) and PostgreSQL's own.
"""

from __future__ import annotations

from typing import Protocol

from flinkish_spark.connectors.cdc.host import ChangeSourceHost, OnSlotLost
from flinkish_spark.connectors.postgres.connection import ConnectionInfo
from flinkish_spark.connectors.postgres.source.columns import SourceColumns
from flinkish_spark.connectors.postgres.source.tables import TableInfo

__all__ = ["OnSlotLost", "PostgresSourceHost"]


class PostgresSourceHost(ChangeSourceHost, Protocol):
    conn_info: ConnectionInfo
    on_slot_lost: OnSlotLost
    slot_name: str
    publication: str
    publication_given: bool
    source_columns: SourceColumns  # the option 'transforms': the columns never read (empty: every column)
    heartbeat_interval: float  # seconds: at most one epoch without rows this often, to advance the slot

    def table_info(self) -> TableInfo: ...
