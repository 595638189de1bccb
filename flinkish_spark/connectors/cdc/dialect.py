"""The dialect boundary of the CDC core: what one database provides so that the generic source can follow it.

The shape of Flink CDC's ``flink-cdc-base``: one incremental-source framework (here: the split
enumerator and reader of :mod:`flinkish_spark.source`, the registry, the catalog poll, the chunk
splits, the stream schema of :mod:`.stream`), and per database a ``DataSourceDialect`` with its
``ChunkSplitter`` (:meth:`CatalogDialect.plan_chunks`), its ``OffsetFactory`` (the position
methods of :class:`ChangeLogDialect`) and its log reader (:meth:`ReaderDialect.read_changes`).

**Positions.** The framework's split positions are integers (Spark's offsets, the checkpoint's
split positions, ``_lsn`` of the stream), so a dialect maps its log position onto a
non-decreasing integer, compared as integers: PostgreSQL's LSN is one already; a MySQL file
position is ``file sequence << 32 | offset`` (a binary log file is at most 1 GiB), its GTID set at
an epoch's end kept beside it in the enumerator's state (a GTID set is no single number). Only
the dialect turns one back into text (:meth:`ChangeLogDialect.format_position`).

**The guarantee a dialect must keep** (docs/cdc-core.md): the change log of every followed table
is kept from a position S taken before any chunk of the table is read (:meth:`CatalogDialect.join_mark`,
PostgreSQL: the slot's consistent point; MySQL: the binary log position, checked against purging by
:meth:`ChangeLogDialect.position_lost`); each chunk is read whole in one transaction of its own at
a moment T >= S; and :meth:`ReaderDialect.read_changes` of ``[start, end)`` returns the same rows
at every read (a replay). Keyed sinks then end equal to the table (the argument of
docs/postgres-source.md, "Consistency", which uses nothing else).

The dialect is implemented by PostgreSQL (:class:`flinkish_spark.connectors.postgres.source.dialect.PostgresDialect`;
tests/connectors/cdc/test_dialect.py runs it) and by MySQL/MariaDB
(:class:`flinkish_spark.connectors.mysql.dialect.MysqlDialect`; tests/connectors/mysql/test_dialect_changes.py);
mypy holds both to :class:`SourceDialect`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Mapping, Protocol, Sequence

import pyarrow as pa

from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns
from flinkish_spark.connectors.cdc.registry import TableEntry
from flinkish_spark.errors import TerminalError

#: A log position as the framework holds it (see the module docstring).
Position = int


@dataclass(frozen=True)
class JoinMark:
    """The moment a table joins (or is snapshotted again): its chunks are read only once every transaction
    numbered before ``after_xid`` has ended (one of them may have written it before its changes were kept)
    and -- when ``position`` matters, see :func:`..catalog_poll.join` -- no change before ``position`` is unread."""

    after_xid: int | None  # None: the dialect has no such horizon (its chunks never wait for transactions)
    position: Position


@dataclass(frozen=True)
class TableChunks:
    """A table's snapshot chunks (Flink CDC's ``ChunkSplitter`` output): ``lo <= key < hi`` ranges as JSON-able
    bounds (None: open), in key order, covering every key once; ``fields``: what the dialect's reader needs
    besides (PostgreSQL: the split column and its type); ``rows``: a table of one chunk, its rows now (so that a
    small table counts its share of the epoch's chunk budget)."""

    bounds: list[tuple[Any, Any]]
    fields: dict[str, Any] = field(default_factory=dict)
    rows: int | None = None


class CatalogDialect(Protocol):
    """The enumerator's catalog half (driver): tables, keys, signatures, chunk planning."""

    @property
    def component(self) -> str: ...
    def error(self, message: str) -> TerminalError:
        """The dialect's error for ``message`` (PostgreSQL: ``PostgresSourceError``)."""
    def connect(self) -> ContextManager[Any]:
        """A catalog connection, passed back to the methods below (opaque to the core)."""
    def find_tables(self, conn: Any, patterns: TablePatterns) -> list[FoundTable]:
        """The tables matching ``patterns``, in name order, with their ``key_problem`` (none when keyed)."""
    def check_followable(self, table: FoundTable) -> None:
        """Raise one clear error when this role may not follow ``table`` (e.g. not readable)."""
    def follow(self, conn: Any, tables: list[FoundTable]) -> None:
        """Have the change log carry ``tables`` from now on (PostgreSQL: the publication; MySQL: nothing)."""
    def unfollow(self, conn: Any, oid: int) -> None:
        """Stop decoding a table renamed out of the patterns (PostgreSQL: drop it from an owned publication)."""
    def primary_keys(self, conn: Any, oids: list[int]) -> dict[int, tuple[str, ...]]:
        """The key columns its changes carry, per table (absent: none)."""
    def signatures(self, conn: Any, oids: list[int]) -> dict[int, Any]:
        """Each existing table's catalog signature as JSON (what changes of it the log does not carry)."""
    def signature_change(self, conn: Any, old: Any, new: Any) -> str | None:
        """Why a table whose signature went from ``old`` to ``new`` must be snapshotted again (None: it need not)."""
    def join_mark(self, conn: Any) -> JoinMark:
        """The :class:`JoinMark` of now (after :meth:`follow`: every change from it on is in the log read)."""
    def current_position(self, conn: Any) -> Position:
        """The log's position now (where changes written from now on start)."""
    def transaction_horizon(self, conn: Any) -> int:
        """Every transaction numbered before this has ended (compared with :attr:`JoinMark.after_xid`)."""
    def unread_before(self, conn: Any, positions: list[Position]) -> Position:
        """The greatest of ``positions`` before which no change of ours is left unread (-1: none)."""
    def table_name(self, conn: Any, oid: int) -> str | None:
        """``schema.table`` of the table ``oid`` now (None: dropped)."""
    def plan_chunks(self, conn: Any, entry: TableEntry, split_size: int) -> TableChunks:
        """The table's chunks of about ``split_size`` rows (Flink CDC's ``ChunkSplitter``)."""


class ChangeLogDialect(Protocol):
    """The change split's half (driver): Flink CDC's ``OffsetFactory`` and the log's retention."""

    def change_target(self, position: Position, limit: int | None) -> Position:
        """The end of the next change range from ``position`` (``position``: nothing to read), at most about
        ``limit`` changes; every read of ``[position, end)`` returns the same rows."""
    def range_cuts(self, start: Position, end: Position) -> Sequence[Position]:
        """Interior transaction boundaries of the range ``[start, end)`` that :meth:`change_target` has just planned,
        at which it may be read by separate tasks at once (each piece gives the rows of its transactions, in log
        order, whatever was read before it); empty: one task (PostgreSQL: a slot has one reader).
        :mod:`.change_split` records them with the checkpoint that names the range."""
    def position_lost(self) -> TerminalError | None:
        """The error when changes the source still needs are gone from the server (a dropped or invalidated
        slot; purged binary logs), else None. Checked at every planning."""
    def release(self, position: Position) -> None:
        """Every change before ``position`` is committed downstream: the server may drop it (advance the slot)."""
    def format_position(self, position: Position) -> str: ...
    def parse_position(self, text: str) -> Position: ...


class ReaderDialect(Protocol):
    """The reader's half (executors): chunks and change ranges as rows of :data:`.stream.STREAM_ARROW`."""

    def chunk_connection(self) -> Any:
        """A connection for a task's chunks (closed by the reader), passed to :meth:`read_chunk`."""
    def read_chunk(self, chunk: dict[str, Any], conn: Any) -> Iterator[pa.RecordBatch]:
        """One chunk (its split's payload) in one transaction: an ``s`` row, then its ``r`` rows (with ``B``/``E``
        around the table's chunks when the payload says ``resnapshot``)."""
    def read_changes(self, start: Position, end: Position,
                     planned_keys: Callable[[], Mapping[int, tuple[str, ...]]] | None) -> Iterator[pa.RecordBatch]:
        """The changes of every followed table in ``[start, end)``, in log order, ``s`` rows before the rows of
        each schema; the same rows at every read."""


class SourceDialect(CatalogDialect, ChangeLogDialect, ReaderDialect, Protocol):
    """Everything a database provides to the CDC core (see the module docstring)."""
