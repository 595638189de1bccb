"""A routed target in its table's mode: its extra columns checked, and the rows a truncate or a re-snapshot's end takes away.

Format-independent (the routed Delta and Iceberg sinks), for one table's
:class:`~flinkish_spark.connectors.lakehouse.table_modes.TableMode`:

* :func:`check_mode_columns` -- an existing target holds exactly its mode's extra columns (``_deleted``, or
  ``_valid_from``/``_valid_to``/``_current``) besides the source table's: a target written in another mode
  (the sink's ``mode``/``deletes``/``tableModes`` changed between runs) is one clear error naming the table
  and the fix, raised before anything of the epoch is written;
* :func:`gone_rows_as` -- what a row that is *gone* (a truncate took it, a re-snapshot did not deliver its key)
  becomes: deleted (``deletes=true``), kept with ``_deleted = true`` (``soft``), closed at a time
  (``history``: ``_valid_to`` set, ``_current = false``; its earlier versions stay), or nothing
  (``deletes=false``: the target keeps every key it ever held);
* :func:`unchanged_snapshot_versions` -- history: a re-snapshot row equal to its key's current version adds no
  version (the current one stays open);
* :func:`mark_gone` -- adds such rows to an epoch's :class:`~flinkish_spark.connectors.lakehouse.resolve.Apply`:
  each is deleted from its file and copied with the columns changed, in the epoch's one commit (so exactly
  once, as every other row of it). Rows marked already (``_deleted`` true, a closed version) are left as
  they are.
* Merged shards (history): a truncated shard's versions close at *its* truncate's time (``shard_close_us``): the
  gone rows by their ``_source_table`` (:func:`mark_gone`), the epoch's keys of that shard by :func:`close_by_keys`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.changes import CURRENT, DELETED, HISTORY_COLUMNS, TIMESTAMP, VALID_TO
from flinkish_spark.connectors.lakehouse.resolve import Apply, EpochChanges, Matches, RowCopy
from flinkish_spark.connectors.lakehouse.resolve_task import E_LSN, KIND_VERSION, NO_LSN
from flinkish_spark.connectors.lakehouse.routes import SOURCE_TABLE
from flinkish_spark.connectors.lakehouse.routing import TablePart
from flinkish_spark.connectors.lakehouse.table_modes import TableMode
from flinkish_spark.errors import SchemaChangeError

GoneAs = Literal["delete", "soft", "close", "keep"]
#: Every column a routed mode can add to a target.
MODE_COLUMNS = (DELETED,) + HISTORY_COLUMNS


@dataclass(frozen=True)
class GoneMarks:
    """What a routed epoch does with the rows it takes away (a format's commit carries it out)."""

    how: GoneAs = "delete"
    rest_gone: bool = False  # every live row the epoch does not replace is gone (a truncate, soft or history)
    close_us: int = -1  # history: when gone rows' versions end (epoch µs)
    close_by_us: int = -1  # history: a truncate's time, by which the epoch's keys' table versions end (-1: none)
    routed: bool = False  # history: a snapshot row equal to the key's current version adds none
    shard_close_us: tuple[tuple[str, int], ...] = ()  # history, merged target: truncated shard -> its truncate's time


def close_by_keys(keys: pa.Table, close_by_us: int, shard_close_us: tuple[tuple[str, int], ...]
                  ) -> pa.Scalar | pa.Array | None:
    """History: the time by which each of the epoch's keys' table versions end (``keys``: the epoch's keys): a
    truncate's of the whole table (one scalar), or, in a merged target, the truncate's of the key's shard (per key,
    null for a shard not truncated); None: none. A target keyed without ``_source_table`` (keys unique across shards)
    has no shard per key: its keys' versions close at their first change."""
    if close_by_us >= 0:
        return pa.scalar(close_by_us, pa.int64())
    if not shard_close_us or SOURCE_TABLE not in keys.column_names:
        return None
    times = dict(shard_close_us)
    return pa.array([times.get(s) for s in keys.column(SOURCE_TABLE).to_pylist()], pa.int64())


def untouched_keys(close_by: pa.Scalar | pa.Array | None) -> bool | np.ndarray:
    """Which keys' table rows no truncate closed (all, none, or per key): what trackHistoryColumns may update in place."""
    if close_by is None:
        return True
    if isinstance(close_by, pa.Scalar):
        return False
    return np.asarray(close_by.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with ``schema``'s columns first, of its types (null where the rows lack one), then the other
    columns they have: a table file's rows copied (a soft delete, a closed version) keep a column the source
    dropped (the target keeps it) and get the columns added since the file was written."""
    cols = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
            for f in schema]
    rest = [n for n in rows.column_names if n not in schema.names]
    return pa.Table.from_arrays(cols + [rows.column(n) for n in rest],
                                schema=pa.schema(list(schema) + [rows.schema.field(n) for n in rest]))


def close_time_us(parts: Iterable[TablePart], truncate: bool) -> int:
    """When history closes the versions an epoch's truncate or re-snapshot end takes (epoch µs): the truncate's
    commit time; a re-snapshot's end has none (the rows went while no slot kept the WAL): the epoch's newest change
    of the table, else the commit's own time (one attempt's version or snapshot lands: a retry may pick a later
    time)."""
    parts = list(parts)
    at = max((p.truncate_us for p in parts if p.truncate), default=-1) if truncate else -1
    if at < 0:
        at = max((p.figures.commit_us for p in parts), default=-1)
    return at if at >= 0 else int(time.time() * 1_000_000)


def gone_rows_as(mode: TableMode) -> GoneAs:
    if mode.mode == "history":
        return "keep" if mode.deletes == "false" else "close"
    if mode.deletes == "soft":
        return "soft"
    return "delete" if mode.deletes == "true" else "keep"


def check_mode_columns(source_table: str, target_name: str, target_columns: list[str], source_columns: set[str],
                       mode: TableMode, option_hint: str) -> None:
    """Raise when the target's extra columns are not its mode's (``source_columns``: every column the source
    table's schemas of the epoch have -- a source column of an extra column's name is the source's)."""
    have = {c for c in target_columns if c in MODE_COLUMNS and c not in source_columns}
    want = set(mode.extra_columns)
    if have == want:
        return
    shape = "upsert" if not have else ("history" if CURRENT in have else "upsert with deletes soft")
    missing = sorted(want - have)
    raise SchemaChangeError(
        f"source table {source_table}: {target_name} was written in another mode ({shape}: its extra columns are "
        f"{', '.join(sorted(have)) or 'none'}) than the one the sink gives the table now ({mode.describe()}"
        f"{', which writes ' + ', '.join(missing) if missing else ''}); nothing was written. Give the table its "
        f"former mode again ({option_hint}), or mirror it to a new target with a new sink uid (or drop the target "
        "and restart: it is created again from a new snapshot only with a new uid)."
    )


def mark_gone(apply: Apply, gone: dict[str, np.ndarray], how: GoneAs, close_us: int,
              read_flag: Callable[[str, str, np.ndarray], pa.Array],
              shard_close_us: tuple[tuple[str, int], ...] = ()) -> int:
    """Add the ``gone`` rows (table file -> sorted positions, rows the epoch does not replace) to ``apply`` as
    ``how`` says; ``read_flag(file, column, positions)`` reads a column of a file's rows. ``shard_close_us``
    (history, merged target): a row of a truncated shard closes at that shard's time, the others at ``close_us``.
    The rows marked."""
    times = dict(shard_close_us)
    if how == "keep":
        return 0
    marked = 0
    for path, positions in sorted(gone.items()):
        positions = np.asarray(positions, dtype=np.int64)
        replaced = apply.table_deletes.get(path)
        if replaced is not None:
            positions = np.setdiff1d(positions, replaced)
        if not len(positions):
            continue
        if how != "delete":
            flag = read_flag(path, DELETED if how == "soft" else CURRENT, positions)
            live = pc.fill_null(flag, False) if how == "close" else pc.invert(pc.fill_null(flag, False))
            positions = positions[np.asarray(live.to_numpy(zero_copy_only=False), dtype=np.bool_)]
            if not len(positions):
                continue
        apply.table_deletes[path] = positions if replaced is None else np.union1d(replaced, positions)
        n = len(positions)
        marked += n
        if how == "soft":
            apply.copies.append(RowCopy(path, -1, positions, {DELETED: pa.array(np.ones(n, dtype=np.bool_))}))
        elif how == "close":
            if times:  # by each row's shard
                shards = read_flag(path, SOURCE_TABLE, positions).to_pylist()
                ts = pa.array([times.get(s, close_us) for s in shards], pa.int64()).cast(TIMESTAMP)
            else:
                ts = pa.array(np.full(n, close_us, dtype=np.int64)).cast(TIMESTAMP)
            apply.copies.append(RowCopy(path, -1, positions, {VALID_TO: ts,
                                                              CURRENT: pa.array(np.zeros(n, dtype=np.bool_))}))
    return marked


def unchanged_snapshot_versions(changes: EpochChanges, matches: Matches, columns: list[str], schema: pa.Schema,
                                read: Callable[[str | None, int, np.ndarray], pa.Table]) -> tuple[Matches, np.ndarray]:
    """History: the keys whose only change of the epoch is a snapshot row (a re-snapshot's) equal in ``columns`` to
    the key's current version in the table get no new version and keep their current one open: the matches
    without them, and their entries (whose written rows the commit deletes). ``read(file, task, positions)``: rows
    of a table file (``task`` -1) or of a committable's files (``file`` None). Costs a read of those rows, on both
    sides: nothing outside an epoch with snapshot rows of keys the table holds."""
    none = np.zeros(0, dtype=np.int64)
    entries = changes.entries
    if entries is None or not matches.by_file:
        return matches, none
    lsn = np.asarray(entries.column(E_LSN).to_numpy(), dtype=np.int64)
    single = changes.starts[(changes.ends - changes.starts) == 1]
    candidates = single[(lsn[single] == NO_LSN) & (changes.kind[single] == KIND_VERSION)]
    if not len(candidates):
        return matches, none
    entry_of = np.full(len(changes.starts), -1, dtype=np.int64)
    entry_of[changes.group[candidates]] = candidates
    in_table: list[tuple[pa.Table, np.ndarray]] = []
    table_count = np.zeros(len(changes.starts), dtype=np.int64)
    for path, (positions, key_index) in matches.by_file.items():
        np.add.at(table_count, key_index, 1)
        sel = entry_of[key_index] >= 0
        if sel.any():
            in_table.append((conform(read(path, -1, positions[sel]), schema).select(columns), key_index[sel]))
    if not in_table:
        return matches, none
    old = pa.concat_tables([t for t, _ in in_table])
    keys = np.concatenate([k for _, k in in_table])
    chosen = entry_of[keys]
    new_parts, order = [], []
    for task in np.unique(changes.task[chosen]):
        at = np.flatnonzero(changes.task[chosen] == task)
        new_parts.append(conform(read(None, int(task), changes.pos[chosen[at]]), schema).select(columns))
        order.append(at)
    new = pa.concat_tables(new_parts).take(pa.array(np.argsort(np.concatenate(order), kind="stable")))
    same = np.ones(len(keys), dtype=np.bool_)
    for name in columns:
        a, b = old.column(name), new.column(name)
        try:
            eq = pc.fill_null(pc.equal(a, b), False)
            both_null = pc.and_(pc.is_null(a), pc.is_null(b))
            same &= np.asarray(pc.or_(eq, both_null).to_numpy(zero_copy_only=False), dtype=np.bool_)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # a nested type: compared as Python values
            same &= np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist())], dtype=np.bool_)
    same &= table_count[keys] == 1
    skip = keys[same]
    if not len(skip):
        return matches, none
    kept = {}
    for path, (positions, key_index) in matches.by_file.items():
        keep = ~np.isin(key_index, skip)
        if keep.any():
            kept[path] = (positions[keep], key_index[keep])
    return Matches(kept), entry_of[skip]
