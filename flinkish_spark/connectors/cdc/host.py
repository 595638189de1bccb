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
#: What a source does when the log position it needs is gone (a dropped slot, a purged binary log).
OnSlotLost = Literal["fail", "resnapshot"]

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


class ChangeSourceHost(CdcSourceHost, Protocol):
    """A source that reads changes: what :class:`.change_split.ChangeSplitEnumerator` needs besides the core's."""

    on_slot_lost: OnSlotLost
