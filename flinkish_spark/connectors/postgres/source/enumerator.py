"""The ``flinkish.postgres`` enumerator (driver): plans the chunks once, then the change stream's WAL ranges."""

from __future__ import annotations

import json
import time
from typing import Any, Collection

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import connect
from flinkish_spark.connectors.postgres.pgoutput import Begin, decode_message, format_lsn, parse_lsn
from flinkish_spark.connectors.postgres.source.changes import peek_pieces, with_busy_slot
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.signature import (
    Signature, fixed_schema_change, fixed_schema_error, signatures,
)
from flinkish_spark.connectors.postgres.source.snapshot import chunk_boundaries
from flinkish_spark.connectors.cdc.splits import changes_id, chunk_id, split_generation
from flinkish_spark.errors import PostgresSourceError
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.split import Split, SplitExtent

#: A heartbeat epoch is made only while the slot holds at least this much WAL: the default WAL
#: segment size -- a slot that holds less keeps no WAL file the server could otherwise remove.
HEARTBEAT_MIN_BYTES = 16 * 1024 * 1024


class PostgresEnumerator(SplitEnumerator):
    """Plans chunks once, then the change stream's WAL ranges; advances the slot on completion."""

    #: One table with the columns it had at the start: a change of the table the stream cannot carry stops it.
    fixed_schema = True

    def __init__(self, source: PostgresSourceHost) -> None:
        self.source = source
        self.generation = 0
        self.started = False
        self.snapshot_done = False
        self.changes_discovered = False
        self._heartbeat_at = time.monotonic()  # of the last heartbeat epoch (not state: a restart waits anew)
        self.signature: Signature | None = None  # the table's catalog signature at the start (see _check_table)

    # state ----------------------------------------------------------------------------------

    def snapshot_state(self) -> bytes:
        return json.dumps(
            {"generation": self.generation, "started": self.started, "snapshot_done": self.snapshot_done,
             "changes_discovered": self.changes_discovered,
             **({"signature": self.signature.to_json()} if self.signature is not None else {})}
        ).encode()

    def restore(self, state: bytes) -> None:
        if state:
            d = json.loads(state)
            self.generation = int(d.get("generation", 0))
            self.started = bool(d.get("started", False))
            self.snapshot_done = bool(d.get("snapshot_done", False))
            self.changes_discovered = bool(d.get("changes_discovered", False))
            sig = d.get("signature")
            self.signature = None if sig is None else Signature.from_json(sig)  # None: a state from before signatures

    # planning ---------------------------------------------------------------------------------

    @property
    def uses_slot(self) -> bool:
        return self.source.startup != "snapshot"

    def discover(self, known: Collection[str]) -> list[Split]:
        src = self.source
        if not self.started:
            return self._start(known)
        if self.uses_slot:
            lost = self._slot_lost()
            if lost is not None:
                if src.on_slot_lost == "fail":
                    raise lost
                self.generation += 1  # a new slot and a new snapshot; the old splits end where they are
                self.snapshot_done = self.changes_discovered = False
                return self._start(known)
            if self.fixed_schema:
                self._check_table()
        if src.startup != "snapshot" and self.snapshot_done and not self.changes_discovered:
            self.changes_discovered = True
            return [Split(changes_id(self.generation))]
        return []

    def _start(self, known: Collection[str]) -> list[Split]:
        src = self.source
        info = src.table_info()
        out: list[Split] = []
        with connect(src.conn_info, autocommit=True) as conn:
            if self.uses_slot:
                slots.check_logical_replication(conn, src.component)
                # The slot first: every change after its consistent point is kept for us.
                slots.ensure_slot_and_publication(
                    conn, src.io, src.checkpoint_store().directory, src.slot_name, src.publication,
                    {(info.schema, info.name): [c.name for c in info.columns]}, src.publication_given, src.component,
                )
            if self.fixed_schema:
                self.signature = self._table_signature(conn)  # before the chunks: a later change is seen
            # A re-snapshot (generation > 0) reads the table whatever the startup: the changes
            # in the gap are gone, and only the table itself can say what they did.
            resnapshot = self.generation > 0
            if src.startup != "changes" or resnapshot:
                chunks = chunk_boundaries(conn, info, src.split_size)
                out = [Split(chunk_id(self.generation, i), c.to_payload()) for i, c in enumerate(chunks)]
        if src.startup == "changes" and not resnapshot:
            self.snapshot_done = self.changes_discovered = True
            out.append(Split(changes_id(self.generation)))
        self.started = True
        return [s for s in out if s.split_id not in known]

    def _table_signature(self, conn: Any) -> Signature | None:
        info = self.source.table_info()
        row = conn.execute("SELECT to_regclass(%s)::oid", (info.qualified,)).fetchone()
        return None if row is None or row[0] is None else signatures(conn, [int(row[0])]).get(int(row[0]))

    def _check_table(self) -> None:
        """Stop with :func:`~.signature.fixed_schema_error` when the table changed in a way the stream cannot carry
        (rewritten, a column added, dropped or renamed, a partition detached...): never go on silently."""
        src = self.source
        with connect(src.conn_info, autocommit=True) as conn:
            now = self._table_signature(conn)
        if now is None or now == self.signature:
            return  # dropped: its changes end
        why = None if self.signature is None else fixed_schema_change(self.signature, now)
        if why is not None:
            raise fixed_schema_error(src.component, src.table_info().display, why, src.slot_name)
        self.signature = now  # a change the stream carries (an empty partition, a type without rewrite)

    def _slot_lost(self) -> PostgresSourceError | None:
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

    def extent(self, split: Split, position: int) -> SplitExtent:
        gen = split_generation(split.split_id)
        if gen < self.generation:
            return SplitExtent(position, position)  # superseded by a new snapshot after a lost slot
        if split.split_id.startswith("snapshot-"):
            return SplitExtent(1, 1)  # a chunk is read whole, in one epoch
        return SplitExtent(max(position, self._change_target(position, self.source.max_rows_per_trigger)), None)

    def drain_position(self, split: Split, position: int) -> int:
        if split_generation(split.split_id) < self.generation:
            return position
        if split.split_id.startswith("snapshot-"):
            return 1  # the drain epoch reads the rest of the snapshot
        return self._change_target(position, None)

    def _change_target(self, position: int, limit: int | None) -> int:
        """The end of the next WAL range: the flush position, if a transaction of ours lies before it.

        The flush position (not the insert or write position): the reader's peek decodes up
        to the flushed WAL at *its* time, which is never less than this, so the first read
        and every replay see the same transactions.

        With nothing of ours before it, no epoch -- unless a heartbeat is due
        (:meth:`_heartbeat_due`): then the range ends at the flush position all the same. It
        holds no rows (the peek just found none, and the reader sees what the peek saw), and
        its completion advances the slot past the other tables' WAL, as any epoch's does.
        """
        src = self.source
        want = limit or 1
        stale = 0  # messages of transactions before ``position`` that the slot still returns
        with connect(src.conn_info, autocommit=True) as conn:
            flush = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
            while True:
                # Piece by piece: a peek returns whole transactions, and one big transaction is millions of
                # messages, of which only the Begins are looked at here (docs/postgres-source.md, "Big transactions").
                finals, old, seen = [], 0, 0
                current: int | None = None
                for piece in peek_pieces(conn, src.slot_name, src.publication, flush, want + stale):
                    seen += len(piece)
                    for data in piece:
                        if data[:1] == b"B":
                            msg = decode_message(data)
                            assert isinstance(msg, Begin)
                            current = msg.final_lsn
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
                return flush if self._heartbeat_due(conn, position, flush) else position
        if limit is not None and seen - old >= limit:
            return finals[-1] + 1  # the peek stopped after a whole transaction: end just after it
        return flush

    def _heartbeat_due(self, conn: Any, position: int, flush: int) -> bool:
        """Whether an epoch without rows should carry the slot to ``flush``.

        While the followed tables are idle, other tables' WAL piles up behind the slot (its
        ``restart_lsn``), and only a completed epoch may advance it. So at most every
        ``heartbeatInterval`` seconds, and only while the slot holds a WAL segment or more
        (:data:`HEARTBEAT_MIN_BYTES`; an idle server, or one whose WAL is a trickle, never gets
        an empty batch for it), an epoch ends at the flush position though it holds no rows.
        """
        now = time.monotonic()
        if flush <= position or now - self._heartbeat_at < self.source.heartbeat_interval:
            return False
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
            (format_lsn(flush), self.source.slot_name)).fetchone()
        if row is None or row[0] is None or int(row[0]) < HEARTBEAT_MIN_BYTES:
            return False
        self._heartbeat_at = now
        return True

    def no_more_splits(self) -> bool:
        if not self.started:
            return False
        return self.source.startup == "snapshot" or self.changes_discovered

    # notifications ------------------------------------------------------------------------------

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        gen_chunks = [s for s in checkpoint.splits if s.split_id.startswith(f"snapshot-{self.generation}-")]
        if self.started and all(s.finished for s in gen_chunks):
            self.snapshot_done = True
        if not self.uses_slot:
            return
        change = next((s for s in checkpoint.splits if s.split_id == changes_id(self.generation)), None)
        src = self.source
        owned = slots.Ownership.read(src.io, src.checkpoint_store().directory)
        with connect(src.conn_info, autocommit=True) as conn:
            if change is not None and change.position > 0:
                with_busy_slot(lambda: slots.advance(conn, src.slot_name, change.position))
            if checkpoint.finished and owned is not None:
                # The last epoch is committed: nothing will ever read the slot again.
                with_busy_slot(lambda: slots.drop(conn, owned))
