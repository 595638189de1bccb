"""The generic part of a multi-table CDC enumerator (driver): registry, catalog polls, re-snapshots, drains.

A mixin over a database's own enumerator (PostgreSQL:
:class:`flinkish_spark.connectors.postgres.source.tables_enumerator.TablesEnumerator`, over the
single-table one that owns the change split): put first among the bases, its methods run first and
hand the rest on with ``super()``. What it keeps:

* the enumerator's state: a few numbers and the name of the registry file (:mod:`.registry`),
  which changes only when tables join, finish their snapshot or leave, and the re-snapshot
  requests taken (:mod:`.resnapshot_request`, exactly once);
* each planning: the requests, then a catalog poll every ``discoveryInterval`` seconds or while a
  table is joining (:mod:`.catalog_poll`, through the dialect);
* a chunk of an entry that ended (dropped, renamed, snapshotted again) ends unread; a small table's
  chunk counts its share against the epoch's chunk budget;
* a drain waits for joining tables (their snapshot could not be read exactly later);
* on completion: tables whose chunks are all committed become ``streaming``; old registry files go.

The database's enumerator provides ``dialect`` (:class:`.dialect.CatalogDialect`), ``generation``,
``started``, ``snapshot_done``/``changes_discovered`` and the first planning's setup, then calls
:meth:`TablesEnumeratorCore._first_planning` with the tables found.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Collection

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.cdc import catalog_poll as poll
from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc import resnapshot_request as requests
from flinkish_spark.connectors.cdc.dialect import CatalogDialect
from flinkish_spark.connectors.cdc.host import CdcSourceHost
from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns, write_not_followed
from flinkish_spark.connectors.cdc.registry import Registry, TableEntry
from flinkish_spark.connectors.cdc.splits import changes_id, table_of_chunk
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.split import Split, SplitExtent

log = logging.getLogger(__name__)

#: The least a chunk counts for against an epoch's chunk budget: a table's read and commit cost as much as a few
#: thousand rows even when it has none (a transaction, catalog reads, a Delta version), so an epoch of the default
#: budget (2 chunks) takes at most 40 tiny tables.
MIN_CHUNK_SHARE = 0.05
#: How long a stop with drain waits for tables that are joining (see TablesEnumerator.drain_ready).
DRAIN_WAIT_S = 600.0


class TablesEnumeratorCore(SplitEnumerator):
    """The generic part of a multi-table enumerator (see the module docstring); a mixin, first among the bases."""

    keep_finished_splits = False
    source: CdcSourceHost
    dialect: CatalogDialect
    generation: int
    started: bool
    snapshot_done: bool
    changes_discovered: bool

    @property
    def follows_changes(self) -> bool:
        """Whether the source reads changes (tables may join at any time), not a snapshot only."""
        return self.source.startup != "snapshot"

    def _init_tables(self) -> None:
        """The state of the core (call once from the database enumerator's ``__init__``)."""
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
        # Following changes, a table may join at any time; only a drain ends the source.
        return self.started and not self.follows_changes

    def _first_planning(self, conn: Any, found: list[FoundTable], known: Collection[str]) -> list[Split]:
        """The first planning, once the log carries the tables ``found`` (PostgreSQL: after the slot's consistent
        point): their entries, their chunks (unless startup=changes), the first registry."""
        src = self.source
        # A new generation (onSlotLost=resnapshot) reads the tables whatever the startup: the changes in the gap are
        # gone, and only the table can say what they did (as the single-table PostgreSQL source does).
        changes_only = src.startup == "changes" and self.generation == 0
        entries, tid = poll.first_entries(self.dialect, conn, found, self.registry.next_tid, changes_only)
        out: list[Split] = []
        if not changes_only:
            out, planned = poll.plan_chunks(self.dialect, conn, entries, self.generation, src.split_size)
            entries = [e for e in entries if e.tid in planned]  # gone since they were found
        self._save(self.registry.with_entries(entries, tid))
        self._discovered_at = time.monotonic()
        if changes_only:
            self.snapshot_done = self.changes_discovered = True
            out.append(self._change_split())
        self.started = True
        return [s for s in out if s.split_id not in known]

    def _change_split(self) -> Split:
        """The change split (:class:`.change_split.ChangeSplitEnumerator`'s, which may carry its start)."""
        return super()._change_split()  # type: ignore[misc]  # the database's enumerator (a mixin)

    def discover(self, known: Collection[str]) -> list[Split]:
        self.previous_name = self.registry_name
        out = super().discover(known)  # type: ignore[safe-super]  # the database's enumerator (a mixin)
        if self.started and self.follows_changes:
            self._take_requests()  # before the poll: the tables it renews join in this planning
        if self.started and self.follows_changes and (
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
            with self.dialect.connect() as conn:
                self.resnapshot(conn, oids, requests.reason(taken.requests))
        self.requests_handled = taken.handled  # after: a failing re-snapshot takes them again next time

    def _refresh(self) -> list[Split]:
        """Poll the catalog (:mod:`flinkish_spark.connectors.cdc.catalog_poll`): tables that joined, left, were
        renamed or changed without row changes; chunks of joined tables whose time has come."""
        src = self.source
        polled = time.monotonic() - self._discovered_at >= src.discovery_interval
        p = poll.Poll.of(self.registry)
        with self.dialect.connect() as conn:
            if polled:
                self._discovered_at = time.monotonic()
                poll.poll(self.dialect, conn, self.patterns, p, self._leave_out)
            out = poll.plan_ready(self.dialect, conn, p, self.generation, src.split_size)
        if p.changed:
            self._save(self.registry.with_entries(p.entries, p.next_tid, p.ended))
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
        entries, next_tid, new = poll.renew(self.dialect, conn, list(self.registry.entries), self.registry.next_tid,
                                            {int(o): reason for o in oids})
        if new:
            self._save(self.registry.with_entries(entries, next_tid))
        return new

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
            raise self.dialect.error(
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
        ext = super().extent(split, position)  # type: ignore[safe-super]
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
            # A planning writes at most five versions (completion, a poll's re-snapshots, a request's, MySQL's
            # statements' (after a request's: mysql/source/enumerator.py), the poll itself), so a retained
            # checkpoint (one of the newest `retain`) names none older than this (its previous registry at most
            # one version before its own).
            registry.retain(self.source.io, self.directory, self.registry.version - 5 * (self.source.retain + 1) - 1)
            self._retained_at = self.registry.version

