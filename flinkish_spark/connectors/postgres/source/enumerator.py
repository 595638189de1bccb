"""The ``flinkish.postgres`` enumerator (driver): plans the chunks once, then the change stream's WAL ranges.

The change split -- the next WAL range, a lost slot, the slot's advance -- is the CDC core's
(:class:`flinkish_spark.connectors.cdc.change_split.ChangeSplitEnumerator`), asking the slot through
:class:`.dialect.PostgresDialect`; this class adds the slot's creation, the single table's schema check and
the slot's drop once the last epoch is committed.
"""

from __future__ import annotations

import json
from typing import Any, Collection

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.cdc.change_split import ChangeSplitEnumerator, change_split
from flinkish_spark.connectors.cdc.splits import chunk_id
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import connect
from flinkish_spark.connectors.postgres.source.changes import with_busy_slot
from flinkish_spark.connectors.postgres.source.dialect import PostgresDialect
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.signature import (
    Signature, fixed_schema_change, fixed_schema_error, signatures,
)
from flinkish_spark.connectors.postgres.source.snapshot import chunk_boundaries
from flinkish_spark.source.split import Split

class PostgresEnumerator(ChangeSplitEnumerator):
    """Plans chunks once, then the change stream's WAL ranges; advances the slot on completion."""

    source: PostgresSourceHost
    dialect: PostgresDialect
    #: One table with the columns it had at the start: a change of the table the stream cannot carry stops it.
    fixed_schema = True

    def __init__(self, source: PostgresSourceHost) -> None:
        super().__init__(source)
        self.dialect = PostgresDialect(source)  # the database's side of the CDC core (slot, WAL ranges, catalog)
        self.signature: Signature | None = None  # the table's catalog signature at the start (see _check_table)

    # state ----------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), **({"signature": self.signature.to_json()} if self.signature is not None else {})}

    def restore(self, state: bytes) -> None:
        super().restore(state)
        if state:
            sig = json.loads(state).get("signature")
            self.signature = None if sig is None else Signature.from_json(sig)  # None: a state from before signatures

    # planning ---------------------------------------------------------------------------------

    def _check_planning(self) -> None:
        if self.fixed_schema:
            self._check_table()

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
            out.append(change_split(self.generation))
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

    # notifications ------------------------------------------------------------------------------

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        super().on_checkpoint_complete(checkpoint)  # the snapshot's end; the slot advanced
        if not self.uses_slot or not checkpoint.finished:
            return
        src = self.source
        owned = slots.Ownership.read(src.io, src.checkpoint_store().directory)
        if owned is not None:
            with connect(src.conn_info, autocommit=True) as conn:
                # The last epoch is committed: nothing will ever read the slot again.
                with_busy_slot(lambda: slots.drop(conn, owned))
