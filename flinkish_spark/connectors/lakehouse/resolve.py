"""Resolving an epoch's changes by key: in each task (:func:`.resolve_task.resolve_task`), then across tasks
(:func:`resolve_epoch`, here).

Format-independent. The guarantee: after an epoch is applied the table holds, per key,
what the epoch's *ordered* change sequence leaves -- order ``_lsn`` (null first: a snapshot
read precedes the changes), then Spark partition, then row -- on top of what the table held:

* ``upsert``: the key's last change; a delete (``deletes=true``) removes the key, a
  delete and a later insert in one epoch leave the insert. ``deletes=soft``: a delete
  leaves the key's last known row with ``_deleted = true`` -- the epoch's own earlier
  version of the key, else the table's row (live or soft-deleted); a key with neither was
  never live and gets no row (as a hard delete of an absent key changes nothing).
* **Unchanged columns** (``_unchanged``: an update that left a TOASTed value unchanged does not
  carry it): the row keeps the key's value from its latest earlier version in the epoch -- the
  task's own (filled in the task), else another task's (a snapshot row), else the table's row the
  key lookup found (the driver copies the task's row with those columns from there:
  :class:`Fill`); when none exists (a joining table's change before its snapshot row, which then
  replaces it) the column stays null. Deterministic in the epoch's rows and the table's state
  before it, so a replay after a crash gives the same row. Every mode: in ``history`` each version
  (not only the key's last) is filled so -- the table's row is the key's current version, which the
  lookup finds -- and a soft-deleted key's row holds the filled values of its last version (a routed
  mirror gets such rows in every mode: a new version never holds a null where the source has a value).
* ``history`` (SCD type 2): one row per version: ``_valid_from`` = its ``_commit_ts``,
  ``_valid_to`` = the next change's ``_commit_ts`` (null while current), ``_current``.
  The table's current row of a changed key is closed (``_valid_to`` = the epoch's first
  change of the key, ``_current = false``); a delete closes without a new version. With tracked columns
  (``trackHistoryColumns``, :mod:`.tracked`) a version equal to its predecessor in them absorbs it
  (:meth:`EpochChanges.absorb`: the predecessor's row dropped, its ``_valid_from`` taken; a table row
  absorbed is deleted instead of closed).

**Task** (executor, :mod:`.resolve_task`): the task's rows are sorted by key and order; it writes
the rows the table will hold (its winners, or all versions) sorted by key -- so data files are key-
clustered and their min/max statistics prune lookups -- and describes them in an *entries*
table (one row per change that matters; see ``E_*``), which travels in the committable.

**Epoch** (driver): :func:`resolve_epoch` orders all tasks' entries; :meth:`EpochChanges.keys`
is what the key lookup searches in the table; :meth:`EpochChanges.apply` turns the lookup's
matches into an :class:`Apply`: positions to delete in table files and in this epoch's new
files (a key written by two tasks keeps one), and rows to copy into a new file with some
columns replaced (soft deletes of table rows, closed history versions, chains fixed across
tasks). A format sink only carries that out: deletion vectors or position delete files,
one more data file, one commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.changes import CURRENT, DELETED, TIMESTAMP, VALID_FROM, VALID_TO, ChangePlan
from flinkish_spark.connectors.lakehouse.resolve_task import (
    E_CURRENT, E_DELETED, E_FROM_DELETE, E_KIND, E_LSN, E_PART, E_POS, E_ROW, E_TASK, E_TS, E_UNFILLED, E_VALID_TO,
    E_VLSN, E_VROW, KIND_DELETE, KIND_VERSION, NO_LSN, key_changes, change_order,
)


# -- the epoch (driver) ------------------------------------------------------------------------


@dataclass(frozen=True)
class RowCopy:
    """Rows to write again with some columns replaced: from a table file, or from this epoch's rows."""

    file: str | None  # a table file's identity (Delta add path, Iceberg file path), or None
    task: int  # the committable whose rows they are, when file is None
    positions: np.ndarray
    overrides: dict[str, pa.Array]  # column -> values, aligned with positions
    fill: "Fill | None" = None  # columns taken from other rows, after the overrides


@dataclass(frozen=True)
class Fill:
    """Columns of a :class:`RowCopy`'s rows taken from other rows (an unchanged value): a table file's, or this
    epoch's rows of a committable; ``positions`` aligned with the copy's."""

    file: str | None
    task: int
    positions: np.ndarray
    columns: tuple[str, ...]


def fill_rows(rows: pa.Table, fill: Fill | None, read: Callable[[str | None, int, np.ndarray], pa.Table]) -> pa.Table:
    """``rows`` (a copy's) with ``fill``'s columns from the rows ``read(file, task, positions)`` returns."""
    if fill is None or not len(fill.positions):
        return rows
    source = read(fill.file, fill.task, fill.positions)
    for name in fill.columns:
        if name in rows.column_names and name in source.column_names:
            i = rows.schema.get_field_index(name)
            rows = rows.set_column(i, rows.schema.field(i), source.column(name).cast(rows.schema.field(i).type))
    return rows


@dataclass
class Apply:
    """What the epoch does to the table, beyond adding the tasks' rows."""

    table_deletes: dict[str, np.ndarray] = field(default_factory=dict)  # table file -> positions
    new_deletes: dict[int, np.ndarray] = field(default_factory=dict)  # committable -> positions among its rows
    copies: list[RowCopy] = field(default_factory=list)


@dataclass(frozen=True)
class Matches:
    """Live table rows of the epoch's keys: per table file, positions and the key each one has."""

    by_file: dict[str, tuple[np.ndarray, np.ndarray]]  # file -> (positions, index into keys), positions sorted

    @property
    def rows(self) -> int:
        return sum(len(p) for p, _ in self.by_file.values())


class EpochChanges:
    """All tasks' entries of one epoch, ordered by key and change order."""

    def __init__(self, plan: ChangePlan, tasks: list[tuple[int, pa.Table | None]]) -> None:
        self.plan = plan
        parts = []
        for index, (partition, entries) in enumerate(tasks):
            if entries is None or entries.num_rows == 0:
                continue
            m = entries.num_rows
            parts.append(entries.append_column(E_TASK, pa.array(np.full(m, index, dtype=np.int32)))
                         .append_column(E_PART, pa.array(np.full(m, partition, dtype=np.int32))))
        # Tasks of one epoch can hold a key column in two widths (a chunk read after ``ALTER ... TYPE
        # bigint`` beside changes from before it): the wider one holds both.
        self.entries = pa.concat_tables(parts, promote_options="permissive") if parts else None
        if self.entries is None:
            self.group = np.zeros(0, dtype=np.int64)
            self.starts = np.zeros(0, dtype=np.int64)
            return
        self._index(self.entries.take(change_order(self.entries, plan.key, [E_LSN, E_PART, E_ROW])))

    def _index(self, entries: pa.Table) -> None:
        self.entries = entries
        diff = key_changes([self.entries.column(k) for k in self.plan.key])
        first = np.insert(diff, 0, True)
        self.starts = np.flatnonzero(first)
        self.group = np.cumsum(first) - 1  # entry -> key index
        self.ends = np.append(self.starts[1:], len(first))  # exclusive
        self.task = np.asarray(self.entries.column(E_TASK).to_numpy(), dtype=np.int64)
        self.kind = np.asarray(self.entries.column(E_KIND).to_numpy(), dtype=np.int8)
        self.pos = np.asarray(self.entries.column(E_POS).to_numpy(), dtype=np.int64)

    #: history with tracked columns (:mod:`.tracked`): rows of absorbed versions (task, position), the versions
    #: whose ``_valid_from`` is an absorbed one's, and the keys whose table row a version absorbed
    absorbed: tuple[np.ndarray, np.ndarray] | None = None
    moved_from: np.ndarray | None = None
    table_absorbed: np.ndarray | None = None

    def absorb(self, removed: np.ndarray, ts: pa.Array, moved_from: np.ndarray, table_absorbed: np.ndarray) -> None:
        """Take the ``removed`` entries out (versions a later one of their key absorbed: their rows are dropped),
        give the entries the times ``ts`` (``moved_from``: changed ones, copied with it as ``_valid_from``) and
        mark the keys whose table row is replaced instead of closed (``table_absorbed``). Keys stay as they are."""
        assert self.entries is not None
        self.absorbed = (self.task[removed], self.pos[removed])
        keep = ~removed
        entries = self.entries.set_column(self.entries.schema.get_field_index(E_TS), E_TS, ts).filter(pa.array(keep))
        self._index(entries)
        self.moved_from = moved_from[keep]
        self.table_absorbed = table_absorbed

    def keys(self) -> pa.Table:
        """The epoch's changed keys, unique and sorted: what the lookup searches in the table."""
        if self.entries is None:
            return pa.table({k: pa.array([], self.plan.input_schema.field(k).type) for k in self.plan.key})
        return self.entries.select(list(self.plan.key)).take(pa.array(self.starts))

    def written_keys(self, task: int, rows: int) -> pa.Table | None:
        """The key columns of the ``rows`` rows committable ``task`` wrote, in row order -- when its entries name
        each of those rows exactly once (a version entry per row written), else None."""
        if self.entries is None:
            return None
        mine = np.flatnonzero((self.task == task) & (self.kind == KIND_VERSION))
        order = mine[np.argsort(self.pos[mine], kind="stable")]
        if len(order) != rows or not np.array_equal(self.pos[order], np.arange(rows, dtype=np.int64)):
            return None
        return self.entries.select(list(self.plan.key)).take(pa.array(order))

    def apply(self, matches: Matches, close_by: pa.Scalar | pa.Array | None = None,
              snapshot_from: pa.Scalar | None = None) -> Apply:
        """``close_by`` (history): a table version closes at the key's first change of the epoch or at this time,
        whichever is earlier (a truncate's: the changes after it replace rows it took already); an array: a time per
        key (null: none) -- a merged target's truncated shard. ``snapshot_from``
        (history, epoch µs): the time a snapshot row replacing a version the table holds (a re-snapshot's, the key's
        only change of the epoch) starts at, and the replaced version ends at (None: both stay null)."""
        out = Apply()
        if self.entries is None:
            return out
        if self.absorbed is not None:
            for task in np.unique(self.absorbed[0]):
                pos = self.absorbed[1][self.absorbed[0] == task]
                prev = out.new_deletes.get(int(task))
                out.new_deletes[int(task)] = np.unique(pos if prev is None else np.concatenate([prev, pos]))
        if self.plan.mode == "history":
            self._history(matches, out, close_by, snapshot_from)
        else:
            self._upsert(matches, out)
        return out

    def drop_written(self, out: Apply, entries: np.ndarray) -> None:
        """Delete the rows these entries (of kind VERSION) wrote: a version the commit found to be no change."""
        self._drop(out, entries)

    def _drop(self, out: Apply, entries: np.ndarray) -> None:
        """Delete the rows these entries wrote (entries of kind VERSION)."""
        for task in np.unique(self.task[entries]):
            sel = entries[self.task[entries] == task]
            prev = out.new_deletes.get(int(task))
            pos = self.pos[sel] if prev is None else np.concatenate([prev, self.pos[sel]])
            out.new_deletes[int(task)] = np.unique(pos)

    def _copy_entries(self, out: Apply, entries: np.ndarray, overrides: dict[str, pa.Array]) -> None:
        for task in np.unique(self.task[entries]):
            sel = np.flatnonzero(self.task[entries] == task)
            out.copies.append(RowCopy(None, int(task), self.pos[entries[sel]],
                                      {c: v.take(pa.array(sel)) for c, v in overrides.items()}))

    def _upsert(self, matches: Matches, out: Apply) -> None:
        assert self.entries is not None
        winners = self.ends - 1
        # Every entry but its key's last (a mask: np.setdiff1d sorts both sides, ~0.15 s for 300k entries).
        loses = np.ones(len(self.group), dtype=np.bool_)
        loses[winners] = False
        losers = np.flatnonzero(loses)
        losers = losers[self.kind[losers] == KIND_VERSION]
        soft_copy = np.zeros(len(self.starts), dtype=np.bool_)  # key -> its soft row is copied from elsewhere
        needs_table_row = np.zeros(len(self.starts), dtype=np.bool_)
        if self.plan.deletes == "soft":
            self._soft_sources(out, winners, soft_copy, needs_table_row)
        # A key deleted with no version of it in the epoch (needs_table_row): its row is the delete's own values,
        # never kept -- the table's row is copied with _deleted = true below (live or soft-deleted already), and
        # when the lookup found none (matches: live and soft-deleted rows alike) the key was never live -- an
        # update of a row the filter never kept, a delete of a key never seen -- and gets no row, as a hard delete
        # of an absent key changes nothing (issue 30). No table read beyond the lookup's; one drop with the losers.
        self._drop(out, np.concatenate([losers, winners[needs_table_row]]))
        # A soft-deleted key whose row is copied from another task's version is left out (that row is complete:
        # a snapshot row in a routed mirror, whose changes of a table are one task), as is one that needs the table.
        self._fill(matches, out, winners[~(soft_copy | needs_table_row)[self.group[winners]]])
        for path, (positions, key_index) in matches.by_file.items():
            out.table_deletes[path] = positions
            if self.plan.deletes == "soft":
                take = needs_table_row[key_index] & ~soft_copy[key_index]
                if take.any():
                    soft_copy[key_index[take]] = True
                    out.copies.append(RowCopy(path, -1, positions[take],
                                              {DELETED: pa.array(np.ones(int(take.sum()), dtype=np.bool_))}))

    def _fill(self, matches: Matches, out: Apply, winners: np.ndarray) -> None:
        """Winners whose row lacks unchanged columns (no earlier version in their task): copied with those columns
        from the key's latest earlier version in another task (a snapshot row), else from the table's row."""
        fills = self._fill_sources(matches, winners)
        if fills:
            at = np.asarray(sorted(fills), dtype=np.int64)
            self._drop(out, at)
            self._copy_filled(out, at, fills, {})

    def _fill_sources(self, matches: Matches, candidates: np.ndarray) -> dict[int, tuple[str | None, int, int, tuple[str, ...]]]:
        """Of the ``candidates`` (entries of kind VERSION) whose row lacks unchanged columns: entry -> where those
        columns' values are (a table file or None, the committable, the position, the columns). Not found (a
        joining table's change before its snapshot row, the key deleted before): left out, the columns stay null."""
        assert self.entries is not None
        if E_UNFILLED not in self.entries.column_names:
            return {}
        unfilled = self.entries.column(E_UNFILLED).to_pylist()
        need = [int(w) for w in candidates if self.kind[w] == KIND_VERSION and unfilled[w]]
        if not need:
            return {}
        in_table = {int(k): (path, int(p)) for path, (positions, key_index) in matches.by_file.items()
                    for p, k in zip(positions, key_index)}
        out: dict[int, tuple[str | None, int, int, tuple[str, ...]]] = {}
        for w in need:
            key = int(self.group[w])
            source: tuple[str | None, int, int] | None = None
            deleted = False
            for j in range(w - 1, int(self.starts[key]) - 1, -1):
                if self.kind[j] == KIND_DELETE:
                    deleted = True  # the key was deleted before: no earlier value is its
                    break
                if self.task[j] != self.task[w]:
                    source = (None, int(self.task[j]), int(self.pos[j]))
                    break
            if source is None and not deleted and key in in_table:
                source = (in_table[key][0], -1, in_table[key][1])
            if source is not None:
                out[w] = (source[0], source[1], source[2], tuple(unfilled[w]))
        return out

    def _copy_filled(self, out: Apply, entries: np.ndarray, fills: dict[int, tuple[str | None, int, int, tuple[str, ...]]],
                     overrides: dict[str, pa.Array]) -> None:
        """Copy the rows these entries wrote, each with ``overrides`` (aligned with all entries) and its fill."""
        groups: dict[tuple[int, str | None, int, tuple[str, ...]], tuple[list[int], list[int]]] = {}
        for w in entries:
            f = fills.get(int(w))
            at, positions = groups.setdefault((int(self.task[w]), *(f[:2] if f else (None, -2)), f[3] if f else ()),
                                              ([], []))
            at.append(int(w))
            positions.append(f[2] if f else -1)
        for (task, file, from_task, columns), (at, positions) in groups.items():
            idx = np.asarray(at, dtype=np.int64)
            fill = Fill(file, from_task, np.asarray(positions, dtype=np.int64), columns) if columns else None
            out.copies.append(RowCopy(None, task, self.pos[idx], {c: v.take(pa.array(idx)) for c, v in overrides.items()},
                                      fill))

    def _soft_sources(self, out: Apply, winners: np.ndarray, soft_copy: np.ndarray, needs_table_row: np.ndarray) -> None:
        """Where a soft-deleted key's values come from: the epoch's last *version* of the key before
        the delete, whichever task wrote it -- a task's soft row holds the task's own last version,
        but another task may hold a later one (every entry says which version its values are:
        ``E_VLSN``/``E_PART``/``E_VROW``) -- else the table's row (found by the lookup; ``needs_table_row``),
        else none (the key was never live: :meth:`_upsert` drops the delete's own row either way)."""
        assert self.entries is not None
        col = self.entries.column
        n = len(self.group)
        from_delete = np.asarray(col(E_FROM_DELETE).to_numpy(zero_copy_only=False), dtype=np.bool_)
        is_deleted = np.asarray(col(E_DELETED).to_numpy(zero_copy_only=False), dtype=np.bool_)
        # Rank every entry by the order of the version its values are (-1: no version, the delete's own values).
        by_values = np.lexsort((np.asarray(col(E_VROW).to_numpy(), dtype=np.int64),
                                np.asarray(col(E_PART).to_numpy(), dtype=np.int64),
                                np.asarray(col(E_VLSN).to_numpy(), dtype=np.int64)))
        rank = np.empty(n, dtype=np.int64)
        rank[by_values] = np.arange(n)
        rank[from_delete] = -1
        # Running maximum of the rank within each key's entries (the key's base keeps groups apart).
        base = self.group.astype(np.int64) * (n + 1)
        running = np.maximum.accumulate(base + rank + 1)
        soft = winners[is_deleted[winners]]
        if not len(soft):
            return
        before = soft - 1
        has_before = before >= self.starts[self.group[soft]]
        best = np.where(has_before, running[np.maximum(before, 0)] - base[soft] - 1, -1)
        use_other = best > rank[soft]  # a later version than the winner's own (none: -1)
        if use_other.any():
            sources = by_values[best[use_other]]
            self._copy_entries(out, sources, {DELETED: pa.array(np.ones(len(sources), dtype=np.bool_))})
            self._drop(out, soft[use_other])
            soft_copy[self.group[soft[use_other]]] = True
        needs_table_row[self.group[soft[~use_other & from_delete[soft]]]] = True

    def _history(self, matches: Matches, out: Apply, close_by: pa.Scalar | pa.Array | None = None,
                 snapshot_from: pa.Scalar | None = None) -> None:
        assert self.entries is not None
        ts = self.entries.column(E_TS).combine_chunks()
        n = len(self.group)
        is_last = np.zeros(n, dtype=np.bool_)
        is_last[self.ends - 1] = True
        next_ts = pa.concat_arrays([ts.slice(1), pa.nulls(1, TIMESTAMP)])
        want_to = pc.if_else(pa.array(is_last), pa.nulls(n, TIMESTAMP), next_ts)
        want_current = is_last & (self.kind == KIND_VERSION)
        have_to = self.entries.column(E_VALID_TO).combine_chunks()
        have_current = np.asarray(self.entries.column(E_CURRENT).to_numpy(zero_copy_only=False), dtype=np.bool_)
        same_to = pc.fill_null(pc.equal(want_to, have_to), False)
        same_to = pc.or_(same_to, pc.and_(pc.is_null(want_to), pc.is_null(have_to)))
        wrong = (self.kind == KIND_VERSION) & ~(np.asarray(same_to.to_numpy(zero_copy_only=False), dtype=np.bool_)
                                                & (want_current == have_current))
        fix = np.flatnonzero(wrong)  # versions whose chain continues in another task's rows
        fills = self._fill_sources(matches, np.flatnonzero(self.kind == KIND_VERSION))
        copy = np.union1d(fix, np.asarray(sorted(fills), dtype=np.int64)) if fills else fix
        overrides = {VALID_TO: want_to, CURRENT: pa.array(want_current)}
        if self.moved_from is not None:  # versions that took an absorbed one's _valid_from
            copy = np.union1d(copy, np.flatnonzero(self.moved_from))
            overrides[VALID_FROM] = ts
        absorbed = self.table_absorbed if self.table_absorbed is not None else np.zeros(len(self.starts), np.bool_)
        first_ts = ts.take(pa.array(self.starts))
        if snapshot_from is not None and matches.by_file:
            # A key's only change a snapshot row (no commit time) replacing a version the table holds: a re-snapshot's
            # row that differs -- the change happened while nothing was read, at an unknown time: ``snapshot_from``.
            matched = np.zeros(len(self.starts), dtype=np.bool_)
            for _, key_index in matches.by_file.values():
                matched[key_index] = True
            lsn = np.asarray(self.entries.column(E_LSN).to_numpy(), dtype=np.int64)
            alone = (self.ends - self.starts == 1) & matched & ~absorbed
            snap = self.starts[alone & (lsn[self.starts] == NO_LSN) & (self.kind[self.starts] == KIND_VERSION)]
            if len(snap):
                is_snap = np.zeros(n, dtype=np.bool_)
                is_snap[snap] = True
                at = snapshot_from.cast(pa.int64()).cast(TIMESTAMP)
                overrides[VALID_FROM] = pc.if_else(pa.array(is_snap), pa.repeat(at, n), ts)
                copy = np.union1d(copy, snap)
                first_ts = pc.if_else(pa.array(is_snap[self.starts]), pa.repeat(at, len(self.starts)), first_ts)
        if len(copy):  # a fixed or filled version is copied with its chain as the epoch leaves it
            self._drop(out, copy)
            self._copy_filled(out, copy, fills, overrides)
        if close_by is not None:
            us = pc.min_element_wise(first_ts.cast(pa.int64()), close_by.cast(pa.int64()), skip_nulls=True)
            first_ts = us.cast(TIMESTAMP)
        for path, (positions, key_index) in matches.by_file.items():
            out.table_deletes[path] = positions
            closed = ~absorbed[key_index]  # an absorbed table row is replaced by its key's version, not closed
            if closed.any():
                out.copies.append(RowCopy(path, -1, positions[closed], {
                    VALID_TO: first_ts.take(pa.array(key_index[closed])),
                    CURRENT: pa.array(np.zeros(int(closed.sum()), dtype=np.bool_)),
                }))


def resolve_epoch(plan: ChangePlan, tasks: list[tuple[int, pa.Table | None]]) -> EpochChanges:
    """``tasks``: (Spark partition id, entries) per committable, in committable order."""
    return EpochChanges(plan, tasks)
