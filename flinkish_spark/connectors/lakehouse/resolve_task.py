"""Resolving a task's changes by key (executor): :func:`resolve_task`, the first half of :mod:`.resolve`.

The guarantee and the rules per mode are :mod:`.resolve`'s (the module docstring there); this module is what a
sink task does with its share of an epoch. The task's rows are sorted by key and order; it writes the rows the
table will hold (its winners, or all versions) sorted by key -- so data files are key-clustered and their min/max
statistics prune lookups -- and describes them in an *entries* table (one row per change that matters; the
``E_*`` columns below), which travels in the committable. Unchanged (TOASTed) columns are filled from the task's
own earlier versions here; what the task cannot fill it names (``E_UNFILLED``) for the epoch to fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.changes import (
    COMMIT_TS, CURRENT, DELETED, LSN, OP, TIMESTAMP, UNCHANGED, VALID_FROM, VALID_TO, ChangePlan,
)

# Entry columns (besides the key columns).
E_LSN, E_PART, E_ROW = "_e_lsn", "_e_part", "_e_row"  # the change's order
E_KIND = "_e_kind"  # KIND_VERSION: a row was written (at E_POS); KIND_DELETE: none
E_POS = "_e_pos"  # position of the written row among the task's rows (-1 for a delete)
E_FROM_DELETE = "_e_from_delete"  # soft: the row written holds the delete's own values
E_DELETED = "_e_deleted"  # soft: the row written is a soft delete (_deleted = true)
E_VLSN, E_VROW = "_e_vlsn", "_e_vrow"  # soft: the order of the version whose values the row holds
E_TS, E_VALID_TO, E_CURRENT = "_e_ts", "_e_valid_to", "_e_current"  # history: as written
E_TASK = "_e_task"  # added by resolve_epoch: index of the committable
E_UNFILLED = "_e_unfilled"  # columns the written row lacks (unchanged, no earlier version in the task)
KIND_VERSION, KIND_DELETE = 0, 1
NO_LSN = int(np.iinfo(np.int64).min)


@dataclass(frozen=True)
class TaskChanges:
    rows: pa.Table  # the table's columns; the rows this task writes, sorted by key
    entries: pa.Table


def key_changes(columns: list[pa.ChunkedArray | pa.Array]) -> np.ndarray:
    """``d[i]`` = row i+1 has another key than row i (columns sorted, without nulls)."""
    n = len(columns[0])
    if n <= 1:
        return np.zeros(max(n - 1, 0), dtype=np.bool_)
    out: np.ndarray | None = None
    for col in columns:
        ne = np.asarray(pc.not_equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False), dtype=np.bool_)
        out = ne if out is None else (out | ne)
    assert out is not None
    return out


def taken(x: Any, idx: np.ndarray) -> Any:
    """``x.take(idx)`` (a table or an array), or ``x`` itself when ``idx`` picks every row in order -- the common case
    of keys changed in key order, one change each (appended rows of a serial key): no copy of the epoch's rows."""
    if len(idx) == len(x) and (len(idx) == 0 or (idx[0] == 0 and bool(np.all(np.diff(idx) == 1)))):
        return x
    return x.take(pa.array(idx, pa.int64()))


def change_order(table: pa.Table, key: tuple[str, ...], tail: list[str]) -> pa.Array:
    sort_keys = [(k, "ascending") for k in key] + [(c, "ascending") for c in tail]
    return pc.sort_indices(table, sort_keys=sort_keys)  # no nulls: keys are checked, LSNs filled


def resolve_task(plan: ChangePlan, table: pa.Table) -> TaskChanges:
    """One task's rows (the input's columns) -> the rows it writes and its entries."""
    n = table.num_rows
    # A change without an LSN (a snapshot read) comes first: nulls become the smallest value.
    lsn = (pc.fill_null(table.column(LSN).cast(pa.int64()), NO_LSN) if plan.has_lsn
           else pa.array(np.full(n, NO_LSN, dtype=np.int64)))
    is_delete = (pc.fill_null(pc.equal(table.column(OP), "d"), False) if plan.has_op
                 else pa.array(np.zeros(n, dtype=np.bool_)))
    work = pa.table({**{k: table.column(k) for k in plan.key}, E_LSN: lsn,
                     E_ROW: pa.array(np.arange(n, dtype=np.int64)), "_del": is_delete})
    if plan.deletes == "false" and plan.has_op:
        keep = pc.invert(is_delete)
        table, work = table.filter(keep), work.filter(keep)
    order = change_order(work, plan.key, [E_LSN, E_ROW]).to_numpy()
    table, work = taken(table, order), taken(work, order)
    n = table.num_rows
    diff = key_changes([work.column(k) for k in plan.key])
    last = np.append(diff, True) if n else np.zeros(0, dtype=np.bool_)
    dele = np.asarray(work.column("_del").to_numpy(zero_copy_only=False), dtype=np.bool_)
    data = table.select(list(plan.data_columns))
    unfilled: list[list[str] | None] | None = None
    if plan.has_unchanged:
        data, unfilled = _fill_unchanged(data, table.column(UNCHANGED), diff)
    keys = {k: work.column(k) for k in plan.key}
    if plan.mode == "history":
        history = _history_task(plan, table, data, keys, work, last, dele)
        return TaskChanges(history.rows, _with_unfilled(history.entries, unfilled, np.arange(n)))
    win = np.flatnonzero(last)
    win_delete = dele[win]
    if plan.deletes == "soft":
        # A deleted key keeps its last version of the epoch (before the delete), else the delete's values.
        first = np.insert(diff, 0, True) if n else np.zeros(0, dtype=np.bool_)
        group_start = np.flatnonzero(first)[np.cumsum(first) - 1]
        last_version = np.maximum.accumulate(np.where(~dele, np.arange(n), -1)) if n else np.zeros(0, dtype=np.int64)
        source = np.where(win_delete & (last_version[win] >= group_start[win]), last_version[win], win)
        rows = data.take(pa.array(source)).append_column(DELETED, pa.array(win_delete))
        from_delete = win_delete & (source == win)
        entries = _entries(keys, work, win, np.full(len(win), KIND_VERSION), np.arange(len(win)))
        at = pa.array(source, pa.int64())
        entries = (entries.append_column(E_FROM_DELETE, pa.array(from_delete))
                   .append_column(E_DELETED, pa.array(win_delete))
                   .append_column(E_VLSN, work.column(E_LSN).take(at))
                   .append_column(E_VROW, work.column(E_ROW).take(at)))
        return TaskChanges(rows, _with_unfilled(entries, unfilled, source))
    versions = win[~win_delete]
    kinds = np.where(win_delete, KIND_DELETE, KIND_VERSION)
    pos = np.full(len(win), -1, dtype=np.int64)
    pos[~win_delete] = np.arange(len(versions))
    entries = _entries(keys, work, win, kinds, pos)
    return TaskChanges(taken(data, versions), _with_unfilled(entries, unfilled, win))


def _fill_unchanged(data: pa.Table, lists: pa.ChunkedArray, diff: np.ndarray) -> tuple[pa.Table, list[list[str] | None] | None]:
    """Rows sorted by key and order: each column a row lists as unchanged takes the value of the key's latest
    earlier row that carries it; the columns no earlier row of the key carries, per row (None: nothing unchanged)."""
    n = data.num_rows
    if lists.null_count == n:
        return data, None
    listed = lists.to_pylist()
    first = np.insert(diff, 0, True) if n else np.zeros(0, dtype=np.bool_)
    group_start = np.flatnonzero(first)[np.cumsum(first) - 1]
    index = np.arange(n)
    still: list[list[str] | None] = [None] * n
    for name in sorted({c for cols in listed if cols for c in cols}):
        marked = np.array([bool(cols) and name in cols for cols in listed], dtype=np.bool_)
        if name in data.column_names:
            src = np.maximum.accumulate(np.where(~marked, index, -1))
            found = marked & (src >= group_start)
            if found.any():
                i = data.schema.get_field_index(name)
                data = data.set_column(i, data.schema.field(i), data.column(i).take(pa.array(np.where(found, src, index))))
            marked &= ~found
        for row in np.flatnonzero(marked):
            still[row] = (still[row] or []) + [name]
    return data, still


def _with_unfilled(entries: pa.Table, unfilled: list[list[str] | None] | None, rows: np.ndarray) -> pa.Table:
    """``entries`` with the columns each one's written row (``rows``: its index among the sorted rows) lacks."""
    if unfilled is None:
        return entries
    return entries.append_column(E_UNFILLED, pa.array([unfilled[int(i)] for i in rows], pa.list_(pa.string())))


def _entries(keys: dict[str, pa.ChunkedArray], work: pa.Table, idx: np.ndarray, kinds: np.ndarray,
             pos: np.ndarray) -> pa.Table:
    cols = {k: taken(v, idx) for k, v in keys.items()}
    cols[E_LSN] = taken(work.column(E_LSN), idx)
    cols[E_ROW] = taken(work.column(E_ROW), idx)
    cols[E_KIND] = pa.array(kinds, pa.int8())
    cols[E_POS] = pa.array(pos, pa.int64())
    return pa.table(cols)


def _history_task(plan: ChangePlan, table: pa.Table, data: pa.Table, keys: dict[str, pa.ChunkedArray],
                  work: pa.Table, last: np.ndarray, dele: np.ndarray) -> TaskChanges:
    n = table.num_rows
    ts = table.column(COMMIT_TS).cast(TIMESTAMP)
    next_ts = pa.concat_arrays([a for a in ts.slice(1).chunks] + [pa.nulls(1, TIMESTAMP)]) if n else pa.nulls(0, TIMESTAMP)
    valid_to = pc.if_else(pa.array(last), pa.nulls(n, TIMESTAMP), next_ts)
    current = pa.array(last & ~dele)
    versions = pa.array(np.flatnonzero(~dele))
    rows = data.take(versions)
    rows = (rows.append_column(VALID_FROM, ts.take(versions)).append_column(VALID_TO, valid_to.take(versions))
            .append_column(CURRENT, current.take(versions)))
    pos = np.full(n, -1, dtype=np.int64)
    pos[~dele] = np.arange(int((~dele).sum()))
    entries = _entries(keys, work, np.arange(n), np.where(dele, KIND_DELETE, KIND_VERSION), pos)
    entries = entries.append_column(E_TS, ts).append_column(E_VALID_TO, valid_to).append_column(E_CURRENT, current)
    return TaskChanges(rows, entries)
