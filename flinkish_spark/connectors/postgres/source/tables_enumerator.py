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
  **renamed** table is one that left and, if the new name matches, one that joins. A joining
  table's chunks are bracketed by ``B``/``E`` (a keyed sink replaces the target's rows).
* **Tables changed without row changes** (``ADD COLUMN ... DEFAULT``, a rewrite, ``RENAME
  COLUMN``, a partition detached, dropped or truncated: the catalog signature of :mod:`.signature`,
  compared at each poll) are snapshotted again -- :meth:`TablesEnumerator.resnapshot`: a new tid
  joining after the statement, the other tables flowing. Why exact: docs/postgres-source.md,
  "Re-snapshots of one table".

Scale: the enumerator's state is a few numbers and the name of the registry file
(:mod:`.registry`), which changes only when tables join, finish their snapshot or leave;
finished chunk splits are forgotten (``keep_finished_splits = False``), so a checkpoint holds
the live splits only. An epoch of changes costs the same with 10 tables as with 1,000.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import replace
from typing import Any, Collection

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.postgres import publication as publications
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import connect, qualified
from flinkish_spark.connectors.postgres.pgoutput import parse_lsn
from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc import resnapshot_request as requests
from flinkish_spark.connectors.postgres.source.catalog import primary_keys, psycopg_query, table_columns
from flinkish_spark.connectors.postgres.source.changes import peek_pieces
from flinkish_spark.connectors.postgres.source.enumerator import PostgresEnumerator
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns, split_followable, write_not_followed
from flinkish_spark.connectors.postgres.source.discovery import check_followable, find_tables, followable_tables
from flinkish_spark.connectors.cdc.registry import Registry, TableEntry
from flinkish_spark.connectors.postgres.source.signature import Signature, change, signatures
from flinkish_spark.connectors.postgres.source.snapshot import chunk_boundaries
from flinkish_spark.connectors.cdc.splits import changes_id, table_chunk_id, table_of_chunk
from flinkish_spark.connectors.postgres.source.tables import load_table_info
from flinkish_spark.errors import PostgresSourceError
from flinkish_spark.source.split import Split, SplitExtent

log = logging.getLogger(__name__)

#: The least a chunk counts for against an epoch's chunk budget: a table's read and commit cost as much as a few
#: thousand rows even when it has none (a transaction, catalog reads, a Delta version), so an epoch of the default
#: budget (2 chunks) takes at most 40 tiny tables.
MIN_CHUNK_SHARE = 0.05
#: How long a stop with drain waits for tables that are joining (see TablesEnumerator.drain_ready).
DRAIN_WAIT_S = 600.0


class TablesEnumerator(PostgresEnumerator):
    keep_finished_splits = False
    fixed_schema = False  # a table changed without row changes is snapshotted again instead (_compare_signatures)

    def __init__(self, source: PostgresSourceHost) -> None:
        super().__init__(source)
        self.registry = Registry()
        self.registry_name: str | None = None
        # The registry at the start of the latest planning: it still holds the tables that planning ended,
        # whose last changes its WAL range carries (the reader takes their keys from it: registry.planned_keys).
        self.previous_name: str | None = None
        self.requests_handled: frozenset[str] = frozenset()  # re-snapshot requests taken (see resnapshot_request)
        self._discovered_at = -math.inf  # monotonic time of the last catalog poll (not state: a restart polls at once)
        self._retained_at = -1
        self._tids: tuple[Registry | None, frozenset[int]] = (None, frozenset())  # (a registry, its tids)
        self._drain_asked: float | None = None  # monotonic time of the first drain_ready() that said no
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
        return json.dumps({**d, "registry": self.registry_name, "previous_registry": self.previous_name,
                           **requests.state_entry(self.requests_handled)}).encode()

    def restore(self, state: bytes) -> None:
        super().restore(state)
        d = json.loads(state) if state else {}
        self.registry_name, self.previous_name = d.get("registry"), d.get("previous_registry")
        self.registry = registry.of_state(self.source.io, self.directory, state) or Registry()
        self.requests_handled = requests.handled_of_state(state)

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
            # Before the chunks are read: a statement after this is seen at a poll (see :mod:`.signature`).
            sigs = signatures(conn, [t.oid for t in found])
            tid = self.registry.next_tid
            entries = []
            keys = primary_keys(psycopg_query(conn), [t.oid for t in found])
            for table in found:
                entries.append(TableEntry(tid, table.oid, table.schema, table.table,
                                          "snapshot" if src.startup != "changes" else "streaming",
                                          key=keys.get(table.oid, ()), signature=_json(sigs.get(table.oid))))
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
        if self.started and self.uses_slot:
            self._take_requests()  # before the poll: the tables it renews join in this planning
        if self.started and self.uses_slot and (
            time.monotonic() - self._discovered_at >= self.source.discovery_interval
            or any(e.state == "joining" for e in self.registry.entries)
        ):
            out += self._refresh()
        return out

    def _take_requests(self) -> None:
        """Re-snapshot requests (``flinkish mirror resnapshot``) not taken yet: their tables are renewed in this
        planning, and the requests recorded as taken in its checkpoint (exactly once: :mod:`.resnapshot_request`)."""
        taken = requests.take(self.source.io, self.directory, self.requests_handled)
        oids = requests.oids(taken.requests, self.registry)
        if oids:
            with connect(self.source.conn_info, autocommit=True) as conn:
                self.resnapshot(conn, oids, requests.reason(taken.requests))
        self.requests_handled = taken.handled  # after: a failing re-snapshot takes them again next time

    def _refresh(self) -> list[Split]:
        """Poll the catalog: tables that joined, left, were renamed or changed without row changes; chunks of
        joined tables whose time has come."""
        src = self.source
        polled = time.monotonic() - self._discovered_at >= src.discovery_interval
        with connect(src.conn_info, autocommit=True) as conn:
            entries = list(self.registry.entries)
            next_tid = self.registry.next_tid
            names_ended = self.registry.ended
            changed = False
            if polled:
                self._discovered_at = time.monotonic()
                found = {t.oid: t for t in find_tables(conn, self.patterns)}
                # An entry ends when its table was dropped or renamed (a new name that matches joins anew).
                ended = [e for e in entries if e.oid not in found or found[e.oid].name != e.name]
                for e in ended:
                    if e.oid not in found and self._owns_publication():
                        publications.drop(conn, src.publication, e.oid)  # renamed out of the patterns: stop decoding it
                if ended:
                    lsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
                    gone = {e.name for e in ended}
                    names_ended = tuple(x for x in names_ended if x[0] not in gone) + tuple((n, lsn) for n in sorted(gone))
                entries = [e for e in entries if e not in ended]
                known_oids = {e.oid for e in entries}
                joined, left_out = split_followable([t for oid, t in found.items() if oid not in known_oids])
                self._leave_out(left_out)
                if joined:
                    entries += self._join(conn, joined, next_tid, {n for n, _ in names_ended})
                    next_tid += len(joined)
                entries, next_tid, altered = self._compare_signatures(conn, entries, next_tid)
                changed = bool(ended or joined or altered)
            out: list[Split] = []
            waiting = [e for e in entries if e.state == "joining"]
            if waiting:
                xmin = int(conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()[0])
                older_ended = [e for e in waiting if e.after_xid is not None and xmin >= e.after_xid]
                read_up_to = self._read_up_to(conn, [e.after_lsn for e in older_ended if e.after_lsn is not None])
                ready = [e for e in older_ended if e.after_lsn is None or e.after_lsn <= read_up_to]
                if ready:
                    out, planned = self._chunks(conn, ready)
                    entries = [e.with_state("snapshot") if e.tid in planned else e for e in entries]
                    changed = changed or bool(planned)
        if changed:
            self._save(self.registry.with_entries(entries, next_tid, names_ended))
        return out

    # re-snapshots -----------------------------------------------------------------------------

    def resnapshot(self, conn: Any, oids: Collection[int], reason: str) -> list[TableEntry]:
        """Snapshot the followed tables ``oids`` again while every other table keeps flowing; returns their new entries.

        Each one's entry ends and a new one (a new tid, the same oid and name) joins: its chunks are planned
        once every transaction open now has ended (``after_xid``) and no change before now is left unread
        (``after_lsn``), and are bracketed by ``_op`` 'B' / 'E', at which a keyed sink deletes the keys the
        new snapshot lacks -- in the epoch holding 'E', so a reader never sees the target empty or partial.
        Chunks of the old entry not read yet end unread. Exact for the reason given in docs/postgres-source.md,
        "Re-snapshots of one table". A table not followed (or dropped) is ignored.
        """
        entries, next_tid, new = self._renewed(conn, list(self.registry.entries), self.registry.next_tid,
                                               {int(o): reason for o in oids})
        if new:
            self._save(self.registry.with_entries(entries, next_tid))
        return new

    def _renewed(self, conn: Any, entries: list[TableEntry], next_tid: int,
                 reasons: dict[int, str]) -> tuple[list[TableEntry], int, list[TableEntry]]:
        """``entries`` with those of ``reasons`` replaced by joining ones (see :meth:`resnapshot`)."""
        doomed = [e for e in entries if e.oid in reasons]
        if not doomed:
            return entries, next_tid, []
        # The signature first, then the positions: every statement the signature shows lies before after_lsn.
        sigs = signatures(conn, [e.oid for e in doomed])
        after_xid, after_lsn = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text, pg_current_wal_lsn()::text").fetchone()
        new = []
        for e in doomed:
            if e.oid not in sigs:
                continue  # dropped meanwhile: the next poll ends it
            new.append(replace(e, tid=next_tid, state="joining", after_xid=int(after_xid), after_lsn=parse_lsn(after_lsn),
                               signature=sigs[e.oid].to_json(), reason=reasons[e.oid]))
            log.warning("%s: snapshotting %s again (tid %d -> %d): %s", self.source.component, e.name, e.tid, next_tid,
                        reasons[e.oid])
            next_tid += 1
        renewed = {e.oid for e in new}
        return [e for e in entries if e.oid not in renewed] + new, next_tid, new

    def _compare_signatures(self, conn: Any, entries: list[TableEntry],
                            next_tid: int) -> tuple[list[TableEntry], int, bool]:
        """Re-snapshot the tables whose catalog shows a change the WAL does not carry (:mod:`.signature`);
        record the signature where it changed otherwise, or where an older registry file has none."""
        now = signatures(conn, [e.oid for e in entries])

        def empty(oid: int) -> bool:
            name = conn.execute("SELECT oid::regclass::text FROM pg_class WHERE oid = %s", (oid,)).fetchone()
            return name is None or conn.execute(f"SELECT NOT EXISTS (SELECT 1 FROM ONLY {name[0]})").fetchone()[0]

        reasons: dict[int, str] = {}
        out, altered = [], False
        for e in entries:
            sig = now.get(e.oid)
            if sig is not None and sig.to_json() != e.signature:
                why = None if e.signature is None else change(Signature.from_json(e.signature), sig, empty)
                if why is not None:
                    reasons[e.oid] = why
                else:
                    e, altered = replace(e, signature=sig.to_json()), True
            out.append(e)
        if reasons:
            out, next_tid, _ = self._renewed(conn, out, next_tid, reasons)
            altered = True
        return out, next_tid, altered

    def _read_up_to(self, conn: Any, lsns: list[int]) -> int:
        """The greatest of ``lsns`` before which the slot holds no transaction of ours any more (-1: none):
        every change before it is in a committed epoch (the slot is advanced only then)."""
        best = -1
        for lsn in sorted(set(lsns)):
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

    def _owns_publication(self) -> bool:
        owned = slots.Ownership.read(self.source.io, self.directory)
        return owned is not None and owned.publication == self.source.publication and owned.publication_created

    def _join(self, conn: Any, tables: list[FoundTable], first_tid: int, reused: set[str]) -> list[TableEntry]:
        """Tables that joined while running: into the publication (A), then the next xid after A; and the WAL position
        after A for one that takes a name in ``reused`` (an ended entry's changes may still be unread)."""
        src = self.source
        for t in tables:
            check_followable(t, src.component, True)
        if self._owns_publication():
            publications.add(conn, src.publication, [(t.schema, t.table) for t in tables])
        else:  # a publication the user gave must publish it already (FOR ALL TABLES, IN SCHEMA, or by hand)
            columns = table_columns(conn, [t.oid for t in tables])
            for t in tables:
                publications.check(conn, src.publication, (t.schema, t.table), columns[t.oid], src.component)
        sigs = signatures(conn, [t.oid for t in tables])
        keys = primary_keys(psycopg_query(conn), [t.oid for t in tables])
        # after_lsn for a table that takes the name of one followed before (dropped and created again, swapped in by
        # RENAME): the old table's last changes -- under the same name -- must not come after the new one's chunk rows.
        after_xid, after_lsn = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text, pg_current_wal_lsn()::text").fetchone()
        return [TableEntry(first_tid + i, t.oid, t.schema, t.table, "joining", int(after_xid), keys.get(t.oid, ()),
                           after_lsn=parse_lsn(after_lsn) if t.name in reused else None, signature=_json(sigs.get(t.oid)))
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
            chunks = chunk_boundaries(conn, info, src.split_size)
            # A table of one chunk: its rows now (at most splitSize), so that an epoch takes as many small tables
            # as its maxRowsPerTrigger holds rows, not two tables of ten rows (see extent()).
            rows = None if len(chunks) > 1 else int(conn.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM {info.qualified} LIMIT %s) s", (src.split_size,)).fetchone()[0])
            for n, chunk in enumerate(chunks):
                payload = {"tid": e.tid, "oid": e.oid, "table": e.name, "lo": chunk.lo, "hi": chunk.hi,
                           **({} if rows is None else {"rows": rows}),
                           "column": info.split_column, "type": cast, "after_xid": e.after_xid,
                           # Bracketed (B ... E: the sink deletes the keys it lacks) after a lost slot, and
                           # always for a table that joins: a table dropped and created again under the same
                           # name, or swapped in by RENAME, replaces the old target's rows, never merges into them.
                           "resnapshot": self.generation > 0 or e.state == "joining"}
                out.append(Split(table_chunk_id(self.generation, e.tid, n), json.dumps(payload)))
            planned.add(e.tid)
        return out, planned

    def drain_ready(self) -> bool:
        """A drain ends the input once the catalog was polled after it was asked for and no table is joining
        (waiting for the moment its snapshot can be read exactly, e.g. a re-snapshot): otherwise that table's
        target would stay wrong for ever. Normal epochs run meanwhile; after ``DRAIN_WAIT_S`` the query stops
        with an error naming the tables."""
        now = time.monotonic()
        if self._drain_asked is None:
            self._drain_asked = now
            self._discovered_at = float("-inf")  # the next planning polls: a statement just before the drain counts
            return False
        waiting = [e.name for e in self.registry.entries if e.state == "joining"]
        if not waiting:
            return True
        if now - self._drain_asked > DRAIN_WAIT_S:
            raise PostgresSourceError(
                f"{self.source.component}: a stop with drain waited {DRAIN_WAIT_S:.0f}s for the snapshot of "
                f"{', '.join(waiting)}, which can be read only once every transaction open when it joined has ended "
                "and the changes before it are read; without it the target would stay incomplete. End those "
                "transactions and drain again, or stop without drain (a restart continues)")
        return False

    def _ended(self, split: Split) -> bool:
        """A chunk whose entry ended (its table was dropped, renamed, or is snapshotted again under a new tid):
        it ends unread -- a renamed table's rows would come under its new name, and a superseded snapshot's
        rows are the new one's business."""
        if not split.split_id.startswith("snapshot-"):
            return False
        if self._tids[0] is not self.registry:
            self._tids = (self.registry, frozenset(e.tid for e in self.registry.entries))
        return table_of_chunk(split.split_id) not in self._tids[1]

    def extent(self, split: Split, position: int) -> SplitExtent:
        if self._ended(split):
            return SplitExtent(position, position)
        ext = super().extent(split, position)
        if split.split_id.startswith("snapshot-") and split.payload and '"rows"' in split.payload:
            # Against the epoch's chunk budget (maxRowsPerTrigger // splitSize) a small table's chunk counts its
            # share of a full chunk: an epoch of 100-row tables takes ~maxRowsPerTrigger rows of them, not two.
            rows = int(json.loads(split.payload).get("rows", self.source.split_size))
            ext = SplitExtent(ext.available, ext.end, min(1.0, max(MIN_CHUNK_SHARE, rows / self.source.split_size)))
        return ext

    def drain_position(self, split: Split, position: int) -> int:
        return position if self._ended(split) else super().drain_position(split, position)

    # notifications ------------------------------------------------------------------------------

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        super().on_checkpoint_complete(checkpoint)
        requests.delete_handled(self.source.io, self.directory, checkpoint)  # the requests it took are done
        reading = {table_of_chunk(s.split_id) for s in checkpoint.splits
                   if s.split_id.startswith(f"snapshot-{self.generation}-") and not s.finished}
        done = [e for e in self.registry.entries if e.state == "snapshot" and e.tid not in reading]
        change = next((s for s in checkpoint.splits if s.split_id == changes_id(self.generation)), None)
        # Names whose last changes are all committed now: a table joining under one needs no wait.
        ended = tuple(x for x in self.registry.ended if change is None or x[1] > change.position)
        if done or ended != self.registry.ended:
            ids = {e.tid for e in done}
            self._save(self.registry.with_entries(
                [e.with_state("streaming") if e.tid in ids else e for e in self.registry.entries], ended=ended))
        if self.registry.version != self._retained_at:
            # A planning writes at most four versions (completion, a poll's re-snapshots, a request's, the
            # poll itself), so a retained checkpoint (one of the newest `retain`) names none older than this
            # (its previous registry at most one version before its own).
            registry.retain(self.source.io, self.directory, self.registry.version - 4 * (self.source.retain + 1) - 1)
            self._retained_at = self.registry.version


def _json(sig: Signature | None) -> Any:
    return None if sig is None else sig.to_json()
