"""The ``flinkish.postgres`` enumerator (driver): plans the chunks once, then the change stream's WAL ranges.

The slot's side -- its loss, the end of the next WAL range, its advance -- is the dialect's
(:class:`.dialect.PostgresDialect`, :class:`flinkish_spark.connectors.cdc.dialect.ChangeLogDialect`).
"""

from __future__ import annotations

import json
from typing import Any, Collection

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.cdc.splits import changes_id, chunk_id, split_generation
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import connect
from flinkish_spark.connectors.postgres.source.changes import with_busy_slot
from flinkish_spark.connectors.postgres.source.dialect import PostgresDialect
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.signature import (
    Signature, fixed_schema_change, fixed_schema_error, signatures,
)
from flinkish_spark.connectors.postgres.source.snapshot import chunk_boundaries
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.split import Split, SplitExtent

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
        self.dialect = PostgresDialect(source)  # the database's side of the CDC core (slot, WAL ranges, catalog)
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
            lost = self.dialect.position_lost()
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

    def extent(self, split: Split, position: int) -> SplitExtent:
        gen = split_generation(split.split_id)
        if gen < self.generation:
            return SplitExtent(position, position)  # superseded by a new snapshot after a lost slot
        if split.split_id.startswith("snapshot-"):
            return SplitExtent(1, 1)  # a chunk is read whole, in one epoch
        return SplitExtent(max(position, self.dialect.change_target(position, self.source.max_rows_per_trigger)), None)

    def drain_position(self, split: Split, position: int) -> int:
        if split_generation(split.split_id) < self.generation:
            return position
        if split.split_id.startswith("snapshot-"):
            return 1  # the drain epoch reads the rest of the snapshot
        return self.dialect.change_target(position, None)

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
        if change is not None and change.position > 0:
            self.dialect.release(change.position)
        if checkpoint.finished and owned is not None:
            with connect(src.conn_info, autocommit=True) as conn:
                # The last epoch is committed: nothing will ever read the slot again.
                with_busy_slot(lambda: slots.drop(conn, owned))
