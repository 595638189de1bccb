"""History with tracked columns (``trackHistoryColumns``, Databricks' ``track_history_column_list``): a change of
only untracked columns updates the key's current version in place.

Format-independent (the routed Delta and Iceberg sinks; PostgreSQL does the same in SQL,
:mod:`flinkish_spark.connectors.postgres.routed_apply`). The guarantee, per key, over the epoch's ordered changes
on top of the table's current version: a version whose tracked columns equal its predecessor's -- the key's
previous version in the epoch (no delete between), or for the key's first change the table's current version --
*absorbs* it: one version remains, with the later change's values and the predecessor's ``_valid_from`` (the
table's current version is replaced, not closed). A change of a tracked column opens a version as without the
option; a delete closes the current one. Several changes in one epoch are taken in order, so an untracked change
after a tracked one updates the new version. Unchanged (TOASTed) columns a change does not carry count as its
predecessor's values (they did not change) -- the same values the commit fills in.

Deterministic in the epoch's rows and the table before it, so a replayed epoch decides the same. Cost: a read of
the tracked columns of the versions that have a predecessor and of those predecessors (rows the tasks wrote, and
the table's current rows the key lookup found) -- nothing for keys changed once in an epoch and new to the table
(a snapshot).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.changes import TIMESTAMP, VALID_FROM
from flinkish_spark.connectors.lakehouse.resolve import EpochChanges, Matches
from flinkish_spark.connectors.lakehouse.resolve_task import E_TS, E_UNFILLED, KIND_VERSION

Read = Callable[[str | None, int, np.ndarray], pa.Table]


def _column(rows: pa.Table, name: str, t: pa.DataType) -> pa.Array:
    if name not in rows.column_names:
        return pa.nulls(rows.num_rows, t)
    return rows.column(name).combine_chunks().cast(t)


def same_values(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Per row: ``a`` and ``b`` hold the same value (two nulls are the same)."""
    try:
        eq = pc.fill_null(pc.equal(a, b), False)
        both = pc.and_(pc.is_null(a), pc.is_null(b))
        return np.asarray(pc.or_(eq, both).to_numpy(zero_copy_only=False), dtype=np.bool_)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # a nested type: compared as Python values
        return np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist())], dtype=np.bool_)


def absorb_untracked(changes: EpochChanges, matches: Matches, read: Read, keep: np.ndarray | None = None,
                     table_rows: bool | np.ndarray = True) -> np.ndarray:
    """Apply the tracked-columns rule to ``changes`` (:meth:`EpochChanges.absorb`), before ``changes.apply(matches)``.
    ``keep``: entry indices the caller holds (the unchanged snapshot versions), returned as indices after it.
    ``table_rows`` false: no table row is absorbed (a truncate in the epoch closes them all at its time); per key
    (a bool per key): only those keys' (a merged target: the keys of shards not truncated)."""
    plan = changes.plan
    keep = np.zeros(0, dtype=np.int64) if keep is None else keep
    if plan.mode != "history" or plan.track is None or changes.entries is None:
        return keep
    n = len(changes.group)
    index = np.arange(n)
    is_version = changes.kind == KIND_VERSION
    at_start = np.zeros(n, dtype=np.bool_)
    at_start[changes.starts] = True
    prev_version = np.zeros(n, dtype=np.bool_)
    prev_version[1:] = ~at_start[1:] & is_version[:-1]
    # the table's current row of each key (exactly one; a key the lookup found twice is left as it is)
    count = np.zeros(len(changes.starts), dtype=np.int64)
    for _, key_index in matches.by_file.values():
        np.add.at(count, key_index, 1)
    in_table = (count == 1) & table_rows
    cand = is_version & (prev_version | (at_start & in_table[changes.group]))
    if not cand.any():
        return keep
    need = np.union1d(np.flatnonzero(cand), np.flatnonzero(cand & prev_version) - 1)  # candidates, predecessors
    schema = plan.table_schema
    tracked = list(plan.track)
    # One values table: the table rows of the keys (rows 0..T-1), then the needed entries' rows.
    table_parts, table_keys = [], []
    wanted_keys = np.zeros(len(changes.starts), dtype=np.bool_)
    wanted_keys[changes.group[cand & at_start]] = True
    for path, (positions, key_index) in sorted(matches.by_file.items()):
        sel = wanted_keys[key_index] & in_table[key_index]
        if sel.any():
            table_parts.append(read(path, -1, positions[sel]))
            table_keys.append(key_index[sel])
    keys = np.concatenate(table_keys) if table_keys else np.zeros(0, dtype=np.int64)
    row_of_key = np.full(len(changes.starts), -1, dtype=np.int64)
    row_of_key[keys] = np.arange(len(keys))
    entry_parts, order = [], []
    for task in np.unique(changes.task[need]):
        at = np.flatnonzero(changes.task[need] == task)
        entry_parts.append(read(None, int(task), changes.pos[need[at]]))
        order.append(at)
    entry_rows = pa.concat_tables(entry_parts, promote_options="permissive").take(
        pa.array(np.argsort(np.concatenate(order), kind="stable")))
    t_rows = len(keys)
    row_of_entry = np.full(n, -1, dtype=np.int64)
    row_of_entry[need] = t_rows + np.arange(len(need))
    pred_row = np.full(n, -1, dtype=np.int64)  # each candidate's predecessor's row
    pv = np.flatnonzero(cand & prev_version)
    pred_row[pv] = row_of_entry[pv - 1]
    pt = np.flatnonzero(cand & ~prev_version)
    pred_row[pt] = row_of_key[changes.group[pt]]
    # an unchanged column a change did not carry is its predecessor's value: the row points to that one's
    unfilled = changes.entries.column(E_UNFILLED).to_pylist() if E_UNFILLED in changes.entries.column_names else None
    lacking = [int(i) for i in need if unfilled is not None and unfilled[i] and cand[i]]
    same = cand.copy()
    for name in tracked:
        t = schema.field(name).type
        values = pa.concat_arrays([_column(p, name, t) for p in table_parts] + [_column(entry_rows, name, t)])
        src = np.arange(len(values))
        for i in lacking:  # ascending: a predecessor is resolved first
            if name in unfilled[i] and pred_row[i] >= 0:  # type: ignore[index]
                src[row_of_entry[i]] = src[pred_row[i]]
        values = values.take(pa.array(src))
        at = np.flatnonzero(cand)
        same[at] &= same_values(values.take(pa.array(row_of_entry[at])), values.take(pa.array(pred_row[at])))
    if unfilled is not None:
        # A version lacking a column whose predecessor is another task's row: the commit fills it from the row
        # before that one (a removed predecessor is no fill source); it stays a version of its own (rare: a table's
        # changes are one task unless a change range is read by several)
        for j in np.flatnonzero(same & prev_version):
            if unfilled[j] and changes.task[j - 1] != changes.task[j]:
                same[j] = False
    if not same.any():
        return keep
    # runs of absorbing versions: each takes the _valid_from of its run's first version (or the table row's)
    run = np.maximum.accumulate(np.where(~same, index, -1))
    from_table = run < changes.starts[changes.group]
    ts = changes.entries.column(E_TS).combine_chunks().cast(TIMESTAMP)
    table_from = (pa.concat_arrays([_column(p, VALID_FROM, TIMESTAMP) for p in table_parts])
                  if table_parts else pa.nulls(0, TIMESTAMP))
    absorbing = np.flatnonzero(same)
    from_entry = np.where(from_table[absorbing], -1, run[absorbing])
    inherited = pc.if_else(pa.array(from_table[absorbing]),
                           table_from.take(pa.array(row_of_key[changes.group[absorbing]], pa.int64(),
                                                    mask=~from_table[absorbing])),  # null: not from the table
                           ts.take(pa.array(np.maximum(from_entry, 0))))
    new_ts = pc.replace_with_mask(ts, pa.array(same), inherited) if len(absorbing) else ts
    removed = np.zeros(n, dtype=np.bool_)
    removed[absorbing[~at_start[absorbing]] - 1] = True
    table_absorbed = np.zeros(len(changes.starts), dtype=np.bool_)
    table_absorbed[changes.group[absorbing[at_start[absorbing]]]] = True
    shift: np.ndarray = np.cumsum(removed) - removed
    changes.absorb(removed, new_ts, same, table_absorbed)
    return keep - shift[keep]
