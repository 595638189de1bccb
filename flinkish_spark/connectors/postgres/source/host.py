"""What the enumerator (driver) and the reader (executors) need from the ``flinkish.postgres`` source.

A protocol, so that they do not import the data source that creates them (no import cycle).
"""

from __future__ import annotations

from typing import Literal, Protocol

from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.connectors.postgres.connection import ConnectionInfo
from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.postgres.source.tables import TableInfo
from flinkish_spark.io.fileio import FileIO

Startup = Literal["snapshot", "snapshotThenChanges", "changes"]
OnSlotLost = Literal["fail", "resnapshot"]

DEFAULT_SPLIT_SIZE = 100_000


class PostgresSourceHost(Protocol):
    io: FileIO
    conn_info: ConnectionInfo
    startup: Startup
    split_size: int
    max_rows_per_trigger: int | None
    on_slot_lost: OnSlotLost
    slot_name: str
    publication: str
    publication_given: bool
    patterns: TablePatterns | None  # the option 'tables' (None: the single-table option 'table')
    discovery_interval: float
    heartbeat_interval: float  # seconds: at most one epoch without rows this often, to advance the slot
    retain: int

    @property
    def component(self) -> str: ...
    def table_info(self) -> TableInfo: ...
    def checkpoint_store(self) -> SourceCheckpointStore: ...
