"""The enumerator of a multi-table source (option ``tables``): many tables, one slot, tables joining and leaving.

It is the single-table enumerator (one slot, a ``changes-<g>`` split in WAL order, the slot
advanced on completion) with a set of tables instead of one:

* **Start**: every matching table goes into one publication, then the slot is created (its
  consistent point S), then each table's chunks are planned -- ``snapshot-<g>-t<tid>-<n>``,
  splits of the one source, read in parallel across tables. The change split is handed out
  once they are all read, and carries every table's changes in WAL order.
* **Tables that join while running** (found by polling the catalog every
  ``discoveryInterval`` seconds): added to the publication at a moment A, recorded as
  ``joining`` with ``after_xid`` = the next transaction id at A; their chunks are planned once
  every transaction older than that has ended (until then one of them might have written the
  table before A, where pgoutput did not publish it yet), and read while the change split keeps
  running. Why the result is exact: docs/postgres-source.md, "New tables".
* **Tables without a usable key** (no primary key, and no ``REPLICA IDENTITY USING INDEX``) are
  left out with a warning -- logged, and written to the source's folder
  (:data:`flinkish_spark.connectors.cdc.patterns.NOT_FOLLOWED_FILE`) for the progress view and ``flinkish inspect`` -- never an error; every poll looks again, so a table that gets a
  key joins like a new one (snapshot, then its changes) without a restart.
* **Dropped tables** leave the registry (and the publication drops them by itself); a
  **renamed** table is one that left and, if the new name matches, one that joins. A joining
  table's chunks are bracketed by ``B``/``E`` (a keyed sink replaces the target's rows).
* **Tables changed without row changes** (``ADD COLUMN ... DEFAULT``, a rewrite, ``RENAME
  COLUMN``, a partition detached, dropped or truncated: the catalog signature of :mod:`.signature`,
  compared at each poll) are snapshotted again -- :meth:`TablesEnumerator.resnapshot`: a new tid
  joining after the statement, the other tables flowing. Why exact: docs/postgres-source.md,
  "Re-snapshots of one table".

What is generic -- the registry, the catalog poll (what joins, leaves, waits, is renewed, the chunk
splits), re-snapshot requests, drains, completion -- is the CDC core's
(:class:`flinkish_spark.connectors.cdc.tables_enumerator.TablesEnumeratorCore`,
:mod:`flinkish_spark.connectors.cdc.catalog_poll`), asking PostgreSQL through :class:`.dialect.PostgresDialect`;
this class adds the start: the publication, then the slot, then the first planning.

Scale: the enumerator's state is a few numbers and the name of the registry file
(:mod:`flinkish_spark.connectors.cdc.registry`), which changes only when tables join, finish their snapshot or leave;
finished chunk splits are forgotten (``keep_finished_splits = False``), so a checkpoint holds
the live splits only. An epoch of changes costs the same with 10 tables as with 1,000.
"""

from __future__ import annotations

from typing import Collection

from flinkish_spark.connectors.cdc.patterns import split_followable
from flinkish_spark.connectors.cdc.tables_enumerator import TablesEnumeratorCore
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.source.catalog import table_columns
from flinkish_spark.connectors.postgres.source.dialect import PostgresDialect
from flinkish_spark.connectors.postgres.source.discovery import followable_tables
from flinkish_spark.connectors.postgres.source.enumerator import PostgresEnumerator
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.source.split import Split


class TablesEnumerator(TablesEnumeratorCore, PostgresEnumerator):
    """The multi-table ``flinkish.postgres`` enumerator: the CDC core's part, over the slot-owning one."""

    source: PostgresSourceHost
    dialect: PostgresDialect
    fixed_schema = False  # a table changed without row changes is snapshotted again instead (catalog_poll)

    def __init__(self, source: PostgresSourceHost) -> None:
        super().__init__(source)
        self._init_tables()

    def _start(self, known: Collection[str]) -> list[Split]:
        src = self.source
        with self.dialect.connect() as conn:
            found, left_out = split_followable(followable_tables(conn, self.patterns, src.component, self.uses_slot))
            self._leave_out(left_out)
            if self.uses_slot:
                slots.check_logical_replication(conn, src.component)
                # The publication, then the slot: every change after its consistent point is kept for us.
                columns = table_columns(conn, [t.oid for t in found])
                # The option 'transforms': the columns never read. The kept ones must be published; a column list of
                # its own publication is the source's to keep (its catalog poll): not checked.
                kept = self.dialect.kept_columns(conn, found)
                lists = self.dialect.column_lists(conn, found, kept)
                slots.ensure_slot_and_publication(
                    conn, src.io, self.directory, src.slot_name, src.publication,
                    {(t.schema, t.table): () if lists.get((t.schema, t.table))
                     else kept.get((t.schema, t.table)) or columns[t.oid] for t in found},
                    src.publication_given, src.component, lists)
            return self._first_planning(conn, found, known)

