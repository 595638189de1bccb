"""The reader of a multi-table CDC source (executors): a task's chunks and change ranges, through the dialect.

A chunk of a table the patterns no longer match (excluded after it was planned, e.g. as a sink's
error about its name says) reads nothing, as its changes in a change range are not read either.
The chunks of one task share one connection of the dialect's (a table of a few rows costs a
connection otherwise: most of a snapshot of 1,000 small tables); a failed chunk closes it, as it
may be mid-transaction. A change range is read with the tables' keys as the epoch was planned
(the registries its checkpoint names: :func:`.registry.planned_keys`), so that every read of it
gives the same schemas. PostgreSQL's reads: :mod:`flinkish_spark.connectors.postgres.source.tables_reader`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa

from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc.dialect import ReaderDialect
from flinkish_spark.connectors.cdc.host import CdcSourceHost
from flinkish_spark.connectors.cdc.change_split import change_start
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split


class TablesReaderCore(SplitReader):
    """Reads a task's ranges; the chunks of one task share one ADBC connection (a table of a few
    rows costs a connection otherwise: most of a snapshot of 1,000 small tables)."""

    def __init__(self, source: CdcSourceHost, dialect: ReaderDialect,
                 pack: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] | None = None) -> None:
        self.source = source
        self.dialect = dialect
        #: ``rowFormat=arrow``: turns a read's stream rows into packed rows, one Arrow IPC stream per run of a
        #: table's rows (PostgreSQL: :class:`flinkish_spark.connectors.postgres.rows.packed.Packer`).
        self.pack = pack
        self._conn: Any = None
        self._ckpt_id: int | None = None

    def begin_epoch(self, ckpt_id: int) -> None:
        self._ckpt_id = ckpt_id

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        rows = self._read(split, start, end)
        return rows if self.pack is None else self.pack(rows)

    def _read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        if start >= end:
            return
        if split.split_id.startswith("snapshot-"):
            chunk = json.loads(split.payload or "{}")
            assert self.source.patterns is not None
            if not self.source.patterns.matches(str(chunk["table"])):
                # Excluded since it was planned (how a user drops a table a sink cannot take, as the
                # sink's error says): not read, like its changes in a WAL range.
                return
            if self._conn is None:
                self._conn = self.dialect.chunk_connection()
            try:
                yield from self.dialect.read_chunk(chunk, self._conn)
            except BaseException:
                self.close()  # the connection may be mid-transaction: the next chunk opens a new one
                raise
        else:
            # 0: where the change split starts (a log position in its payload for MySQL; the slot's own for PostgreSQL).
            yield from self.dialect.read_changes(change_start(split, start), end,
                                                 None if self._ckpt_id is None else self._planned_keys)

    def _planned_keys(self) -> Mapping[int, tuple[str, ...]]:
        """The tables' keys as the epoch was planned (its checkpoint names the registries)."""
        assert self._ckpt_id is not None
        store = self.source.checkpoint_store()
        return registry.planned_keys(self.source.io, store.directory, store.read(self._ckpt_id).enumerator_state)

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
