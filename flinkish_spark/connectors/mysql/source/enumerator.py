"""The ``flinkish.mysql`` enumerator (driver): the CDC core's multi-table enumerator over the binary log.

Everything but the start is shared: the registry, catalog polls, re-snapshots and drains are
:class:`flinkish_spark.connectors.cdc.tables_enumerator.TablesEnumeratorCore`'s; the change split (its
ranges, a purged position, the release on completion) is
:class:`flinkish_spark.connectors.cdc.change_split.ChangeSplitEnumerator`'s, asking
:class:`flinkish_spark.connectors.mysql.dialect.MysqlDialect`.

**The start** (of each generation): the matching tables (those without a primary key left out with a
warning, one of an engine without transactions refused), then the log's position now (``join_mark``:
the change split starts there, recorded in its payload since there is no slot), then the core's first
planning (the chunks). Every change after that position is in the change split, and each chunk reads
a snapshot taken after it, so a key's last row in the stream is its row at the end (the sink applies
rows by key; docs/mysql-source.md).

**A purged replay** (``onSlotLost=resnapshot``): a run that ends (a failure, a kill -9) with an epoch planned in
Spark's offset log and not committed replays that epoch's change range ``[a, b)`` at the restart. When the server
purged the log ``a`` is in meanwhile, nothing can read that range again: the reader gives no rows for it
(:attr:`..dialect.MysqlDialect.skip_purged`; under ``fail`` it is the clear error, never a silent skip), the epoch
commits whatever else it held, and the planning after it checks ``a`` -- not ``b``, which may have survived -- so
that ``position_lost`` sees the purge and starts a new generation (:meth:`on_checkpoint_complete`; a drain waits
for it). Exactly once cannot mean here that the replay yields what the first attempt yielded (that log is gone);
what holds instead is that every target ends equal to its table: the new generation snapshots every table again
after a log position later than anything the lost range held, between ``B`` and ``E``, and at ``E`` a keyed
target deletes every key the new snapshot did not deliver. Each key's last row in the stream is then its row in
the table, whether the first attempt's commit of the lost epoch reached that target or not (a sink that committed
its part of the epoch before the kill skips the replay by its transaction id; one that did not gets the replay
without those changes) -- the rows the target held before ``B`` do not matter after ``E``. A check of ``a`` that
finds it purged after a read that succeeded (the purge fell just after the read) only costs a needless new
generation, which is correct by the same argument; purges are monotonic (the oldest files first), so a read that
found the log purged is always followed by a check that does.

**The range record**: the state written with each checkpoint carries the newest change range planned
(:class:`..dialect.RangeRecord`: its start and end, its changes, the server's GTID state at its end), beside the
change split's file+offset integer, for ``flinkish inspect`` and a failover (docs/mysql-source.md); and the
range's pieces (``changeReaders``: the transaction boundaries it is cut at, :mod:`..range_cuts`), which the
CDC core reads back -- from that checkpoint only -- when Spark asks for the epoch's partitions
(:mod:`flinkish_spark.connectors.cdc.change_split`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Collection, Protocol

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.cdc import catalog_poll as poll
from flinkish_spark.connectors.cdc.change_split import ChangeSplitEnumerator, change_split, change_start
from flinkish_spark.connectors.cdc.host import ChangeSourceHost
from flinkish_spark.connectors.cdc.patterns import split_followable
from flinkish_spark.connectors.cdc.splits import changes_id
from flinkish_spark.connectors.cdc.tables_enumerator import TablesEnumeratorCore
from flinkish_spark.connectors.mysql.connection import ConnectionInfo
from flinkish_spark.connectors.mysql.dialect import MysqlDialect
from flinkish_spark.connectors.mysql.planning import DdlSeen
from flinkish_spark.source.split import Split, SplitExtent


class MysqlSourceHost(ChangeSourceHost, Protocol):
    """What the enumerator and the reader need of the ``flinkish.mysql`` data source."""

    conn_info: ConnectionInfo
    server_id: int  # the first replica id the log readers take (each read its own above it)
    change_readers: int  # the most tasks an epoch's change range is read by (its pieces)
    change_reader_min_changes: int  # the least changes of a piece


def mysql_dialect(source: MysqlSourceHost) -> MysqlDialect:
    dialect = MysqlDialect(source.conn_info, source.component, source.patterns, source.server_id)
    dialect.readers = source.change_readers
    dialect.min_changes_per_reader = source.change_reader_min_changes
    return dialect


class MysqlEnumerator(TablesEnumeratorCore, ChangeSplitEnumerator):
    """The CDC core's part, over the change split; the start is MySQL's (see the module docstring)."""

    source: MysqlSourceHost
    dialect: MysqlDialect

    def __init__(self, source: MysqlSourceHost) -> None:
        super().__init__(source)
        self.dialect = mysql_dialect(source)
        self.start_position: int | None = None  # where this generation's change split starts (the log's key)
        #: statements found in planned ranges, acted on at the next planning (table name, "" for an unreadable one)
        self.ddl_pending: dict[str, DdlSeen] = {}
        self._next_start: int | None = None  # where the change split's next range starts, as last planned
        self._init_tables()

    def _state(self) -> dict[str, Any]:
        # "range": the newest change range planned (start, end, changes, the GTID state at its end), written with
        # the checkpoint that names it; informational (flinkish inspect), never read back to plan
        planned = self.dialect.planned
        return {**super()._state(), "start_position": self.start_position,
                **({"range": planned.to_json()} if planned is not None else {}),
                **({"ddl_pending": [d.to_json() for d in self.ddl_pending.values()]} if self.ddl_pending else {})}

    def restore(self, state: bytes) -> None:
        super().restore(state)
        if state:
            d = json.loads(state)
            start = d.get("start_position")
            self.start_position = None if start is None else int(start)
            pending = [DdlSeen.from_json(x) for x in d.get("ddl_pending", ())]
            self.ddl_pending = {x.table or "": x for x in pending}

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        super().on_checkpoint_complete(checkpoint)
        # A restart plans its first range after this (the restored checkpoint): the dialect learns where the change
        # split continues, so that the planning's position_lost check sees a purged log (onSlotLost) before the
        # range is read -- without it, the range's read met the purged start first and failed whatever onSlotLost.
        change = next((s for s in checkpoint.splits if s.split_id == changes_id(self.generation)), None)
        if change is not None and not change.finished:
            # onSlotLost=resnapshot: the check is of where the epoch's range *started*. Its read (a replay, most
            # likely) found that log purged and gave no rows (MysqlDialect.skip_purged): going on from the range's
            # end -- which may well survive -- would skip its changes. See the module docstring, "A purged replay".
            at = change.start if self.source.on_slot_lost == "resnapshot" else change.position
            self.dialect.continues_from(change_start(Split(change.split_id, change.payload), at))

    def _change_split(self) -> Split:
        return change_split(self.generation, self.start_position)

    def _start(self, known: Collection[str]) -> list[Split]:
        self.dialect.continues_from(0)  # a new generation: the old split's (perhaps purged) position is not needed
        with self.dialect.connect() as conn:
            found, left_out = split_followable(self.dialect.find_tables(conn, self.patterns))
            self._leave_out(left_out)
            for table in found:
                self.dialect.check_followable(table)  # MyISAM & co: one clear error, not a wrong target
            if self.uses_slot:
                # Before the chunks: each chunk's snapshot is taken after this position, so the changes from
                # here cover everything a chunk missed.
                self.start_position = self.dialect.join_mark(conn).position
            return self._first_planning(conn, found, known)

    # statements that change rows without row events, or the key ------------------------------------------

    def extent(self, split: Split, position: int) -> SplitExtent:
        ext = super().extent(split, position)
        if split.split_id.startswith("changes-"):
            self._next_start = change_start(split, ext.available)
        self._take_ddl()
        return ext

    def drain_position(self, split: Split, position: int) -> int:
        end = super().drain_position(split, position)
        if split.split_id.startswith("changes-") and self.dialect.ddl_seen:
            # Written between drain_ready's look and this planning (a narrow window): the drain cannot re-snapshot.
            d = self.dialect.ddl_seen[0]
            self.dialect.ddl_seen.clear()
            raise self.dialect.error(
                f"{self.source.component}: a stop with drain found, in the last changes, a statement on "
                f"{d.table or 'a table it cannot name'}: {d.reason}; the target needs a new snapshot of it, which a "
                "drain cannot take. Nothing is lost: run the same command again (it snapshots the table again), "
                "then stop with drain again")
        return end

    def _take_ddl(self) -> None:
        for d in self.dialect.ddl_seen:
            self.ddl_pending.setdefault(d.table or "", d)
        self.dialect.ddl_seen.clear()

    def drain_ready(self) -> bool:
        """Not before the statements found are acted on -- nor those in the log up to now, looked at here: the
        drain's own range must hold none (a drain ends the source; no later planning could re-snapshot)."""
        if self.ddl_pending:
            return False
        if self.source.on_slot_lost == "resnapshot" and self.dialect.position_lost() is not None:
            return False  # the next planning starts a new generation first ("A purged replay")
        ready = super().drain_ready()
        if ready and self._next_start is not None:
            self.dialect.change_target(self._next_start, None)
            self._take_ddl()
            ready = not self.ddl_pending
        return ready

    def _take_requests(self) -> None:
        super()._take_requests()
        if self.ddl_pending:
            self._act_on_ddl()

    def _act_on_ddl(self) -> None:
        """The statements a planned range held (:class:`..planning.DdlSeen`), at the next planning (the checkpoint
        of that range recorded them: a restart acts on them too). Each followed table they name is snapshotted
        again (the core's re-snapshot: a new entry, chunks after now, bracketed by B/E, so the target loses the
        rows the table lost) with its key as it is now; one whose key is gone leaves, with the warning of a table
        without a key (its target stays as it was; an ADD PRIMARY KEY brings it back with a snapshot). A statement
        whose table could not be read re-snapshots every followed table."""
        entries = {e.name: e for e in self.registry.entries}
        with self.dialect.connect() as conn:
            found = {t.oid: t for t in self.dialect.find_tables(conn, self.patterns)}
            reasons: dict[int, str] = {}
            keyless = []
            for d in self.ddl_pending.values():
                named = list(entries.values()) if d.table is None else [entries[d.table]] if d.table in entries else []
                for e in named:
                    t = found.get(e.oid)
                    if t is None or t.name != e.name:
                        continue  # dropped or renamed since: the next catalog poll ends it
                    if t.key_problem is not None:
                        keyless.append(e)
                    else:
                        reasons.setdefault(e.oid, d.reason)
            listed, next_tid, new = poll.renew(self.dialect, conn, list(self.registry.entries), self.registry.next_tid,
                                               {o: r for o, r in reasons.items() if o not in {e.oid for e in keyless}})
            keys = self.dialect.primary_keys(conn, [e.oid for e in new])
            listed = [replace(e, key=keys.get(e.oid, e.key)) if e in new else e for e in listed]
            ended = self.registry.ended
            if keyless:
                position = self.dialect.current_position(conn)
                gone = {e.name for e in keyless}
                listed = [e for e in listed if e.name not in gone]
                ended = tuple(x for x in ended if x[0] not in gone) + tuple((n, position) for n in sorted(gone))
                self._leave_out([t for t in found.values() if t.key_problem is not None])
        if new or keyless:
            self._save(self.registry.with_entries(listed, next_tid, ended))
        self.ddl_pending = {}
