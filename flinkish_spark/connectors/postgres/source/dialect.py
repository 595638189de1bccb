"""PostgreSQL as a dialect of the CDC core (:class:`flinkish_spark.connectors.cdc.dialect.SourceDialect`).

What is PostgreSQL's own, behind the protocol: the catalog (:mod:`.discovery`, :mod:`.catalog`,
:mod:`.signature`), the publication that makes pgoutput carry a table, chunk planning on the
split column (:mod:`.snapshot`), the replication slot -- its consistent point, its loss, its
advance once an epoch is committed -- and the WAL ranges peeked from it (:mod:`.tables_reader`).
Positions are LSNs (already integers). The join mark's ``after_xid`` is the next transaction id
(``pg_snapshot_xmax``), the horizon the oldest running one (``pg_snapshot_xmin``).
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import pyarrow as pa

from flinkish_spark.connectors.cdc.dialect import JoinMark, SourceDialect, TableChunks
from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns
from flinkish_spark.connectors.cdc.registry import TableEntry
from flinkish_spark.connectors.postgres import publication as publications
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import connect, qualified
from flinkish_spark.connectors.postgres.pgoutput import begin_final_lsn, format_lsn, parse_lsn
from flinkish_spark.connectors.postgres.source.catalog import primary_keys, psycopg_query, table_columns
from flinkish_spark.connectors.postgres.source.columns import identity_full, lists_unsupported
from flinkish_spark.connectors.postgres.source.changes import (
    KEEP_PEEKED_BYTES, PeekedRange, keep_peeked, peek_pieces, take_peeked, with_busy_slot,
)
from flinkish_spark.connectors.postgres.source.discovery import check_followable, find_tables
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.signature import Signature, change, signatures
from flinkish_spark.connectors.postgres.source.snapshot import chunk_boundaries
from flinkish_spark.connectors.postgres.source.tables import load_table_info
from flinkish_spark.connectors.postgres.source.tables_reader import chunk_connection, read_changes, read_chunk
from flinkish_spark.errors import PostgresSourceError

_log = logging.getLogger(__name__)

#: A heartbeat epoch is made only while the slot holds at least this much WAL: the default WAL
#: segment size -- a slot that holds less keeps no WAL file the server could otherwise remove.
HEARTBEAT_MIN_BYTES = 16 * 1024 * 1024


class PostgresDialect:
    """The dialect of one ``flinkish.postgres`` source (its options: :class:`.host.PostgresSourceHost`)."""

    def __init__(self, source: PostgresSourceHost) -> None:
        self.source = source
        self.heartbeat_at = time.monotonic()  # of the last heartbeat epoch (not state: a restart waits anew)
        # A signature (as JSON text) -> why its table is snapshotted again: a kept column the publication's column
        # list lacked until this poll (its changes since ADD COLUMN came without its values).
        self._unlisted: dict[str, str] = {}
        self._warned: set[str] = set()
        self.warned_unspread = False  # spreadChanges: a range too big to keep was said once
        self._owns = False  # the source's own publication (cached once true)
        # Without rules, once the own publication has no column list none comes back in this process (only rules
        # make lists): the polls stop asking (two round trips each).
        self._no_lists_left = False

    @property
    def component(self) -> str:
        return self.source.component

    def error(self, message: str) -> PostgresSourceError:
        return PostgresSourceError(message)

    def connect(self) -> AbstractContextManager[Any]:
        return connect(self.source.conn_info, autocommit=True)

    # catalog (driver) -----------------------------------------------------------------------------

    def find_tables(self, conn: Any, patterns: TablePatterns) -> list[FoundTable]:
        return find_tables(conn, patterns)

    def check_followable(self, table: FoundTable) -> None:
        check_followable(table, self.component, True)

    def owns_publication(self) -> bool:
        src = self.source
        owned = slots.Ownership.read(src.io, src.checkpoint_store().directory)
        return owned is not None and owned.publication == src.publication and owned.publication_created

    def follow(self, conn: Any, tables: list[FoundTable]) -> None:
        src = self.source
        if self.owns_publication():
            publications.add(conn, src.publication, [(t.schema, t.table) for t in tables], self.column_lists(conn, tables))
        else:  # a publication the user gave must publish it already (FOR ALL TABLES, IN SCHEMA, or by hand)
            columns = table_columns(conn, [t.oid for t in tables])
            for t in tables:
                publications.check(conn, src.publication, (t.schema, t.table), columns[t.oid], src.component)

    def kept_columns(self, conn: Any, tables: list[FoundTable]) -> dict[tuple[str, str], list[str] | None]:
        """The columns the source reads of each of ``tables`` (the option ``transforms``: :mod:`.columns`; None or
        absent: every column). Refuses a rule leaving out a key column."""
        cols = self.source.source_columns
        if not cols or not tables:
            return {}
        oids = [t.oid for t in tables]
        names, keys = table_columns(conn, oids), primary_keys(psycopg_query(conn), oids)
        return {(t.schema, t.table): cols.kept(t.name, names[t.oid], keys.get(t.oid, ()), self.component)
                for t in tables}

    def column_lists(self, conn: Any, tables: list[FoundTable],
                     kept: dict[tuple[str, str], list[str] | None] | None = None) -> dict[tuple[str, str], list[str] | None]:
        """The column list of each of ``tables`` in the source's own publication: its kept columns where a list can
        keep the others out -- PostgreSQL 15+, a publication the source owns, a table whose replica identity is its
        key (PostgreSQL refuses a FULL one's updates and deletes under a list lacking a column). Elsewhere the reader
        drops them at decode (:func:`.tables_reader.read_changes`), and this says so once."""
        src = self.source
        kept = self.kept_columns(conn, tables) if kept is None else kept  # (computed by the caller already)
        if not any(v is not None for v in kept.values()) or src.startup == "snapshot":
            return {}
        if src.publication_given or lists_unsupported(conn):
            self._warn_decode_drop("PostgreSQL before 15" if not src.publication_given else
                                   f"the publication {src.publication!r} is yours")
            return {}
        full = identity_full(conn, [t.oid for t in tables if kept.get((t.schema, t.table)) is not None])
        if full:
            names = [t.name for t in tables if t.oid in full]
            self._warn_decode_drop(f"REPLICA IDENTITY FULL of {', '.join(names)}")
        return {(t.schema, t.table): None if t.oid in full else kept.get((t.schema, t.table)) for t in tables}

    def _warn_decode_drop(self, why: str) -> None:
        if why not in self._warned:
            self._warned.add(why)
            _log.warning("%s: option 'transforms': %s, so no publication column list keeps the columns left out "
                         "from the change stream; the source drops them as it decodes (they never leave the source "
                         "task, but leave PostgreSQL)", self.component, why)

    def unfollow(self, conn: Any, oid: int) -> None:
        if self.owns_publication():
            publications.drop(conn, self.source.publication, oid)

    def primary_keys(self, conn: Any, oids: list[int]) -> dict[int, tuple[str, ...]]:
        return primary_keys(psycopg_query(conn), oids)

    def signatures(self, conn: Any, oids: list[int]) -> dict[int, Any]:
        sigs = signatures(conn, oids)
        cols = self.source.source_columns
        if not sigs or (not cols and not self._lists_left(conn)):
            return {oid: sig.to_json() for oid, sig in sigs.items()}
        # Only the kept columns: a DDL on a left-out column is none of the target's business. And the poll keeps the
        # publication's column lists up to date (a column added since is in none).
        rows = conn.execute("SELECT c.oid::int8, n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n "
                            "ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::oid[])", (list(sigs),)).fetchall()
        tables = [FoundTable(int(o), f"{s}.{t}", str(s), str(t), True) for o, s, t in rows]
        kept_columns = self.kept_columns(conn, tables)
        own = self._owns_lists()
        wanted = self.column_lists(conn, tables, kept_columns) if own else {}
        listed = publications.column_lists(conn, self.source.publication) if own and not lists_unsupported(conn) else {}
        out = {}
        for t in tables:
            sig, kept = sigs[t.oid], kept_columns.get((t.schema, t.table))
            if kept is not None:
                sig = replace(sig, columns=tuple(c for c in sig.columns if c[1] in kept))
            out[t.oid] = sig.to_json()
            want = wanted.get((t.schema, t.table))
            if (t.schema, t.table) in listed and listed[(t.schema, t.table)] != want:
                before = listed[(t.schema, t.table)]
                publications.set_columns(conn, self.source.publication, (t.schema, t.table), want)
                # Kept now, in no list before (added since, or kept by a rule changed since): snapshotted again.
                new = [] if before is None else [n for _, n, _ in sigs[t.oid].columns
                                                 if (want is None or n in want) and n not in before]
                if new:
                    self._unlisted[json.dumps(out[t.oid])] = (
                        f"column(s) {', '.join(map(repr, new))} joined the publication's column list only now (its "
                        "changes since it was added came without their values)")
        return out

    def _owns_lists(self) -> bool:
        """Whether the source keeps its publication's column lists (its own; cached once true: it stays so)."""
        if not self._owns:
            src = self.source
            self._owns = src.startup != "snapshot" and not src.publication_given and self.owns_publication()
        return self._owns

    def _lists_left(self, conn: Any) -> bool:
        """Without rules: whether the own publication still has a column list (the rules were dropped on a restart:
        the poll takes it away)."""
        if self._no_lists_left or not self._owns_lists() or lists_unsupported(conn):
            return False
        left = bool(conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid "
            "WHERE p.pubname = %s AND pr.prattrs IS NOT NULL)", (self.source.publication,)).fetchone()[0])
        self._no_lists_left = not left
        return left

    def signature_change(self, conn: Any, old: Any, new: Any) -> str | None:
        unlisted = self._unlisted.pop(json.dumps(new), None)
        if unlisted is not None:
            return unlisted
        def empty(oid: int) -> bool:
            name = conn.execute("SELECT oid::regclass::text FROM pg_class WHERE oid = %s", (oid,)).fetchone()
            return name is None or conn.execute(f"SELECT NOT EXISTS (SELECT 1 FROM ONLY {name[0]})").fetchone()[0]

        return change(Signature.from_json(old), Signature.from_json(new), empty)

    def join_mark(self, conn: Any) -> JoinMark:
        after_xid, lsn = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text, pg_current_wal_lsn()::text").fetchone()
        return JoinMark(int(after_xid), parse_lsn(lsn))

    def current_position(self, conn: Any) -> int:
        return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])

    def transaction_horizon(self, conn: Any) -> int:
        return int(conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()[0])

    def unread_before(self, conn: Any, positions: list[int]) -> int:
        """The greatest of ``positions`` before which the slot holds no transaction of ours any more (-1: none):
        every change before it is in a committed epoch (the slot is advanced only then)."""
        best = -1
        for lsn in sorted(set(positions)):
            # One message says it (a peek returns a whole transaction: one message of it, not millions)
            pieces = peek_pieces(conn, self.source.slot_name, self.source.publication, lsn, 1, piece=1)
            try:
                held = next(pieces, None) is not None
            finally:
                pieces.close()
            if held:
                break
            best = lsn
        return best

    def table_name(self, conn: Any, oid: int) -> str | None:
        row = conn.execute("SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n "
                           "ON n.oid = c.relnamespace WHERE c.oid = %s", (oid,)).fetchone()
        return None if row is None else str(row[0])

    def plan_chunks(self, conn: Any, entry: TableEntry, split_size: int) -> TableChunks:
        info = load_table_info(conn, qualified(entry.schema, entry.table), None, self.component)
        chunks = chunk_boundaries(conn, info, split_size)
        # A table of one chunk: its rows now (at most splitSize), so that an epoch takes as many small tables
        # as its maxRowsPerTrigger holds rows, not two tables of ten rows (see TablesEnumerator.extent()).
        rows = None if len(chunks) > 1 else int(conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {info.qualified} LIMIT %s) s", (split_size,)).fetchone()[0])
        return TableChunks([(c.lo, c.hi) for c in chunks],
                           {"column": info.split_column, "type": info.column(info.split_column).pg_type}, rows)

    # the change log (driver) ------------------------------------------------------------------------

    def position_lost(self) -> PostgresSourceError | None:
        """The error when the slot is gone (dropped) or invalidated (``max_slot_wal_keep_size``)."""
        src = self.source
        with connect(src.conn_info, autocommit=True) as conn:
            state, _, _ = slots.slot_info(conn, src.slot_name)
        if state == "ok":
            return None
        return PostgresSourceError(
            f"{src.component}: the replication slot {src.slot_name!r} is {state} "
            f"({'dropped' if state == 'missing' else 'invalidated by the server, e.g. max_slot_wal_keep_size'}) "
            "while this source still needs it: the changes since the last committed epoch are gone from the WAL "
            "and the target would silently miss them. Start again with a new snapshot: set the option "
            "onSlotLost=resnapshot -- the source makes a new slot and reads the table again between two marker rows "
            "(_op 'B' and 'E'), at which the flinkish.postgres sink (mode=upsert, deletes=true) also deletes the "
            "target's keys that the table no longer holds; any other target must drop those keys itself "
            "(docs/postgres-source.md, 'A lost slot')"
        )

    def readable(self, start: int, end: int) -> bool:
        """Whether the slot can still give the WAL range ``[start, end)``. A lost slot -- a replay of an epoch planned
        before the slot was dropped or invalidated -- cannot give it again: under ``onSlotLost=fail`` that is
        :meth:`position_lost`'s clear error; under ``resnapshot`` False (with a warning), the range reads nothing and
        the planning after its commit starts a new generation (every table read again between ``B``/``E``), which
        makes each target equal its table whatever the lost range held or an earlier attempt of the epoch committed
        (docs/postgres-source.md, 'A lost slot'). The one check of both readers (``tables`` and ``table``)."""
        lost = self.position_lost()
        if lost is None:
            return True
        if self.source.on_slot_lost != "resnapshot":
            raise lost
        _log.warning("%s: the WAL range %s..%s cannot be read again (the slot %r is lost); with onSlotLost=resnapshot "
                     "the next planning reads the tables again", self.source.component, format_lsn(start),
                     format_lsn(end), self.source.slot_name)
        return False

    def release(self, position: int) -> None:
        """Advance the slot to ``position`` (an epoch up to it is committed)."""
        src = self.source
        with connect(src.conn_info, autocommit=True) as conn:
            with_busy_slot(lambda: slots.advance(conn, src.slot_name, position))

    def format_position(self, position: int) -> str:
        return format_lsn(position)

    def parse_position(self, text: str) -> int:
        return parse_lsn(text)

    def range_cuts(self, start: int, end: int) -> tuple[int, ...]:
        return ()  # one reader: a slot decodes for one connection at a time

    def change_target(self, position: int, limit: int | None) -> int:
        """The end of the next WAL range: the flush position, if a transaction of ours lies before it.

        The flush position (not the insert or write position): the reader's peek decodes up
        to the flushed WAL at *its* time, which is never less than this, so the first read
        and every replay see the same transactions.

        With nothing of ours before it, no epoch -- unless a heartbeat is due
        (:meth:`heartbeat_due`): then the range ends at the flush position all the same. It
        holds no rows (the peek just found none, and the reader sees what the peek saw), and
        its completion advances the slot past the other tables' WAL, as any epoch's does.
        """
        src = self.source
        want = limit or 1
        stale = 0  # messages of transactions before ``position`` that the slot still returns
        # With spreadChanges the epoch's planning reads the range in this process: the messages fetched here are
        # kept for it (up to KEEP_PEEKED_BYTES), so that the server decodes the range once, not twice.
        keep = getattr(src, "spread_changes", 1) > 1
        keep_peeked(None)
        with connect(src.conn_info, autocommit=True) as conn:
            flush = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
            while True:
                # Piece by piece: a peek returns whole transactions, and one big transaction is millions of
                # messages, of which only the Begins are looked at here (docs/postgres-source.md, "Big transactions").
                finals, old, seen = [], 0, 0
                current: int | None = None
                kept: list[list[bytes]] | None = [] if keep else None
                size = 0
                for piece in peek_pieces(conn, src.slot_name, src.publication, flush, want + stale):
                    seen += len(piece)
                    if kept is not None:
                        size += sum(map(len, piece))
                        if size <= KEEP_PEEKED_BYTES:
                            kept.append(piece)
                        else:
                            kept = None
                            if not self.warned_unspread:  # once per driver: wide rows make every epoch so
                                self.warned_unspread = True
                                _log.warning("%s: a change range holds more than %d MiB of messages: such an epoch is "
                                             "read by one task, not spread (spreadChanges; a lower maxRowsPerTrigger "
                                             "keeps epochs spread)", src.component, KEEP_PEEKED_BYTES >> 20)
                    for data in piece:
                        if data[:1] == b"B":
                            current = begin_final_lsn(data)
                            if current >= position:
                                finals.append(current)
                        if current is None or current < position:
                            old += 1
                # The slot lags behind ``position`` only until the completed epoch's advance
                # (normally done just before): peek again past the transactions already read.
                if old <= stale or seen < want + stale:
                    break
                stale = old
            if not finals:
                # Nothing new: no epoch (and no empty batch), unless the slot must move.
                end = flush if self.heartbeat_due(conn, position, flush) else position
            elif limit is not None and seen - old >= limit:
                end = finals[-1] + 1  # the peek stopped after a whole transaction: end just after it
            else:
                end = flush
        # Kept only if the peek fetched the whole range: it ran out before the flush position, or stopped at the limit.
        if end != position and kept is not None and (seen < want + stale or (limit is not None and seen - old >= limit)):
            keep_peeked(PeekedRange(src.slot_name, end, tuple(kept)))
        return end

    def heartbeat_due(self, conn: Any, position: int, flush: int) -> bool:
        """Whether an epoch without rows should carry the slot to ``flush``.

        While the followed tables are idle, other tables' WAL piles up behind the slot (its
        ``restart_lsn``), and only a completed epoch may advance it. So at most every
        ``heartbeatInterval`` seconds, and only while the slot holds a WAL segment or more
        (:data:`HEARTBEAT_MIN_BYTES`; an idle server, or one whose WAL is a trickle, never gets
        an empty batch for it), an epoch ends at the flush position though it holds no rows.
        """
        now = time.monotonic()
        if flush <= position or now - self.heartbeat_at < self.source.heartbeat_interval:
            return False
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
            (format_lsn(flush), self.source.slot_name)).fetchone()
        if row is None or row[0] is None or int(row[0]) < HEARTBEAT_MIN_BYTES:
            return False
        self.heartbeat_at = now
        return True

    # the reader (executors) -------------------------------------------------------------------------

    def chunk_connection(self) -> Any:
        return chunk_connection(self.source)

    def read_chunk(self, chunk: dict[str, Any], conn: Any) -> Iterator[pa.RecordBatch]:
        return read_chunk(self.source, chunk, conn)

    def read_changes(self, start: int, end: int,
                     planned_keys: Callable[[], Mapping[int, tuple[str, ...]]] | None) -> Iterator[pa.RecordBatch]:
        """The range's stream rows; none for a lost slot's range under ``onSlotLost=resnapshot`` (:meth:`readable`)."""
        if not self.readable(start, end):
            return iter(())
        # The bounding peek's messages where this process just fetched them (spreadChanges: the driver's read).
        return read_changes(self.source, start, end, planned_keys, take_peeked(self.source.slot_name, end))


if TYPE_CHECKING:
    def _conforms(dialect: PostgresDialect) -> SourceDialect:
        return dialect  # mypy (tests/test_typing.py) holds PostgresDialect to the core's protocol
