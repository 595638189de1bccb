"""What the CDC core's enumerator and reader need of a source's options, whatever the database.

A protocol, so that they do not import the data source that creates them (no import cycle).
Each database's host extends it (:class:`flinkish_spark.connectors.postgres.source.host.PostgresSourceHost`).
"""

from __future__ import annotations

from typing import Literal, Protocol

from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.io.fileio import FileIO

Startup = Literal["snapshot", "snapshotThenChanges", "changes"]

DEFAULT_SPLIT_SIZE = 100_000


class CdcSourceHost(Protocol):
    io: FileIO
    startup: Startup
    split_size: int
    max_rows_per_trigger: int | None
    patterns: TablePatterns | None  # the option 'tables' (None: a single-table option)
    discovery_interval: float
    retain: int

    @property
    def component(self) -> str: ...
    def checkpoint_store(self) -> SourceCheckpointStore: ...
