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
  (:data:`.patterns.NOT_FOLLOWED_FILE`) for the progress view and ``flinkish inspect`` -- never an error; every poll looks again, so a table that gets a
  key joins like a new one (snapshot, then its changes) without a restart.
* **Dropped tables** leave the registry (and the publication drops them by itself); a
  **renamed** table is one that left and, if the new name matches, one that joins.

Scale: the enumerator's state is a few numbers and the name of the registry file
(:mod:`.registry`), which changes only when tables join, finish their snapshot or leave;
finished chunk splits are forgotten (``keep_finished_splits = False``), so a checkpoint holds
the live splits only. An epoch of changes costs the same with 10 tables as with 1,000.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Collection

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.postgres import publication as publications
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import connect, qualified
from flinkish_spark.connectors.postgres.source import registry
from flinkish_spark.connectors.postgres.source.catalog import primary_keys, psycopg_query, table_columns
from flinkish_spark.connectors.postgres.source.enumerator import PostgresEnumerator
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.patterns import (
    FoundTable, TablePatterns, check_followable, find_tables, followable_tables, split_followable, write_not_followed,
)
from flinkish_spark.connectors.postgres.source.registry import Registry, TableEntry
from flinkish_spark.connectors.postgres.source.snapshot import chunk_boundaries
from flinkish_spark.connectors.postgres.source.splits import changes_id, table_chunk_id, table_of_chunk
from flinkish_spark.connectors.postgres.source.tables import load_table_info
from flinkish_spark.source.split import Split

log = logging.getLogger(__name__)


class TablesEnumerator(PostgresEnumerator):
    keep_finished_splits = False

    def __init__(self, source: PostgresSourceHost) -> None:
        super().__init__(source)
        self.registry = Registry()
        self.registry_name: str | None = None
        # The registry at the start of the latest planning: it still holds the tables that planning ended,
        # whose last changes its WAL range carries (the reader takes their keys from it: registry.planned_keys).
        self.previous_name: str | None = None
        self._discovered_at = 0.0  # monotonic time of the last catalog poll (not state: a restart polls at once)
        self._retained_at = -1
        self.not_followed: dict[str, str] = {}  # matching tables left out (no usable key) -> the warning
        self._reported = False  # written to the source's folder in this process (a restart writes it anew)

    @property
    def patterns(self) -> TablePatterns:
        assert self.source.patterns is not None
        return self.source.patterns

    @property
    def directory(self) -> str:
        return self.source.checkpoint_store().directory

    # state ------------------------------------------------------------------------------------

    def snapshot_state(self) -> bytes:
        d = json.loads(super().snapshot_state())
        return json.dumps({**d, "registry": self.registry_name, "previous_registry": self.previous_name}).encode()

    def restore(self, state: bytes) -> None:
        super().restore(state)
        d = json.loads(state) if state else {}
        self.registry_name, self.previous_name = d.get("registry"), d.get("previous_registry")
        self.registry = registry.of_state(self.source.io, self.directory, state) or Registry()

    def _leave_out(self, tables: list[FoundTable]) -> None:
        """The matching tables without a usable key, now: warn about each one newly left out."""
        now = {t.name: t.not_followed() for t in tables}
        for name, text in sorted(now.items()):
            if self.not_followed.get(name) != text:
                log.warning("%s: %s", self.source.component, text)
        if now != self.not_followed or not self._reported:
            write_not_followed(self.source.io, self.directory, now)
            self._reported = True
        self.not_followed = now

    def _save(self, new: Registry) -> None:
        self.registry = new
        self.registry_name = registry.write(self.source.io, self.directory, new)

    # planning ---------------------------------------------------------------------------------

    def no_more_splits(self) -> bool:
        # With a slot, a table may join at any time; only a drain ends the source.
        return self.started and not self.uses_slot

    def _start(self, known: Collection[str]) -> list[Split]:
        src = self.source
        with connect(src.conn_info, autocommit=True) as conn:
            found, left_out = split_followable(followable_tables(conn, self.patterns, src.component, self.uses_slot))
            self._leave_out(left_out)
            if self.uses_slot:
                slots.check_logical_replication(conn, src.component)
                # The publication, then the slot: every change after its consistent point is kept for us.
                columns = table_columns(conn, [t.oid for t in found])
                slots.ensure_slot_and_publication(
                    conn, src.io, self.directory, src.slot_name, src.publication,
                    {(t.schema, t.table): columns[t.oid] for t in found}, src.publication_given, src.component)
            tid = self.registry.next_tid
            entries = []
            keys = primary_keys(psycopg_query(conn), [t.oid for t in found])
            for table in found:
                entries.append(TableEntry(tid, table.oid, table.schema, table.table,
                                          "snapshot" if src.startup != "changes" else "streaming",
                                          key=keys.get(table.oid, ())))
                tid += 1
            out: list[Split] = []
            if src.startup != "changes":
                out, planned = self._chunks(conn, entries)
                entries = [e for e in entries if e.tid in planned]  # gone since they were found
        self._save(self.registry.with_entries(entries, tid))
        self._discovered_at = time.monotonic()
        if src.startup == "changes":
            self.snapshot_done = self.changes_discovered = True
            out.append(Split(changes_id(self.generation)))
        self.started = True
        return [s for s in out if s.split_id not in known]

    def discover(self, known: Collection[str]) -> list[Split]:
        self.previous_name = self.registry_name
        out = super().discover(known)
        if self.started and self.uses_slot and (
            time.monotonic() - self._discovered_at >= self.source.discovery_interval
            or any(e.state == "joining" for e in self.registry.entries)
        ):
            out += self._refresh()
        return out

    def _refresh(self) -> list[Split]:
        """Poll the catalog: tables that joined, left or were renamed; chunks of joined tables whose time has come."""
        src = self.source
        polled = time.monotonic() - self._discovered_at >= src.discovery_interval
        with connect(src.conn_info, autocommit=True) as conn:
            entries = list(self.registry.entries)
            next_tid = self.registry.next_tid
            changed = False
            if polled:
                self._discovered_at = time.monotonic()
                found = {t.oid: t for t in find_tables(conn, self.patterns)}
                # An entry ends when its table was dropped or renamed (a new name that matches joins anew).
                ended = [e for e in entries if e.oid not in found or found[e.oid].name != e.name]
                for e in ended:
                    if e.oid not in found and self._owns_publication():
                        publications.drop(conn, src.publication, e.oid)  # renamed out of the patterns: stop decoding it
                entries = [e for e in entries if e not in ended]
                known_oids = {e.oid for e in entries}
                joined, left_out = split_followable([t for oid, t in found.items() if oid not in known_oids])
                self._leave_out(left_out)
                if joined:
                    entries += self._join(conn, joined, next_tid)
                    next_tid += len(joined)
                changed = bool(ended or joined)
            out: list[Split] = []
            waiting = [e for e in entries if e.state == "joining"]
            if waiting:
                xmin = int(conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()[0])
                ready = [e for e in waiting if e.after_xid is not None and xmin >= e.after_xid]
                if ready:
                    out, planned = self._chunks(conn, ready)
                    entries = [e.with_state("snapshot") if e.tid in planned else e for e in entries]
                    changed = changed or bool(planned)
        if changed:
            self._save(self.registry.with_entries(entries, next_tid))
        return out

    def _owns_publication(self) -> bool:
        owned = slots.Ownership.read(self.source.io, self.directory)
        return owned is not None and owned.publication == self.source.publication and owned.publication_created

    def _join(self, conn: Any, tables: list[FoundTable], first_tid: int) -> list[TableEntry]:
        """Tables that joined while running: into the publication (A), then the next xid after A."""
        src = self.source
        for t in tables:
            check_followable(t, src.component, True)
        if self._owns_publication():
            publications.add(conn, src.publication, [(t.schema, t.table) for t in tables])
        else:  # a publication the user gave must publish it already (FOR ALL TABLES, IN SCHEMA, or by hand)
            columns = table_columns(conn, [t.oid for t in tables])
            for t in tables:
                publications.check(conn, src.publication, (t.schema, t.table), columns[t.oid], src.component)
        after = int(conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()[0])
        keys = primary_keys(psycopg_query(conn), [t.oid for t in tables])
        return [TableEntry(first_tid + i, t.oid, t.schema, t.table, "joining", after, keys.get(t.oid, ()))
                for i, t in enumerate(tables)]

    def _chunks(self, conn: Any, entries: list[TableEntry]) -> tuple[list[Split], set[int]]:
        """The chunk splits of ``entries``, and the tids that got them (a table dropped or renamed since it
        was found gets none: the next poll ends its entry)."""
        src = self.source
        out: list[Split] = []
        planned: set[int] = set()
        for e in entries:
            row = conn.execute("SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n "
                               "ON n.oid = c.relnamespace WHERE c.oid = %s", (e.oid,)).fetchone()
            if row is None or row[0] != e.name:
                continue
            info = load_table_info(conn, qualified(e.schema, e.table), None, src.component)
            cast = info.column(info.split_column).pg_type
            for n, chunk in enumerate(chunk_boundaries(conn, info, src.split_size)):
                payload = {"tid": e.tid, "oid": e.oid, "table": e.name, "lo": chunk.lo, "hi": chunk.hi,
                           "column": info.split_column, "type": cast, "after_xid": e.after_xid,
                           "resnapshot": self.generation > 0}
                out.append(Split(table_chunk_id(self.generation, e.tid, n), json.dumps(payload)))
            planned.add(e.tid)
        return out, planned

    # notifications ------------------------------------------------------------------------------

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        super().on_checkpoint_complete(checkpoint)
        reading = {table_of_chunk(s.split_id) for s in checkpoint.splits
                   if s.split_id.startswith(f"snapshot-{self.generation}-") and not s.finished}
        done = [e for e in self.registry.entries if e.state == "snapshot" and e.tid not in reading]
        if done:
            ids = {e.tid for e in done}
            self._save(self.registry.with_entries(
                [e.with_state("streaming") if e.tid in ids else e for e in self.registry.entries]))
        if self.registry.version != self._retained_at:
            # A planning writes at most three versions (completion, a re-snapshot's start, a poll), so a
            # retained checkpoint (one of the newest `retain`) names none older than this (its previous
            # registry at most one version before its own).
            registry.retain(self.source.io, self.directory, self.registry.version - 3 * (self.source.retain + 1) - 1)
            self._retained_at = self.registry.version
