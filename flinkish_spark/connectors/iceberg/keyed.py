"""Keyed change application into an Iceberg table (upsert, deletes, history): one snapshot per epoch.

Built on the shared core (:mod:`flinkish_spark.connectors.lakehouse.changes`, ``resolve``,
``key_lookup``); this module carries out its decisions in Iceberg's terms.

* **Prepare** (executors): a task checks its rows (:func:`~.changes.check_rows`: no null
  key, ``_op`` in r/c/u/d, else :class:`~flinkish_spark.errors.ChangeDataError`), resolves
  them (:func:`~.resolve.resolve_task`), and writes the rows the table will hold as data
  files below ``e<epoch>/`` -- grouped by partition, sorted by key, so the files' key
  bounds prune later lookups. The committable carries the files, the index of each
  file's first row, and the task's *entries* (which key each row is, in which order; above
  1 MiB in a file of ``e<epoch>/`` that it names: :mod:`~.lakehouse.entries_file`).
  No manifest names a file yet.
* **Commit** (driver, after the decision): all tasks' entries are resolved together
  (:func:`~.resolve.resolve_epoch`: the last change of a key wins by ``_lsn``, then input
  order), the changed keys are looked up in the snapshot the commit will assert
  (:class:`~.key_lookup.KeyLookup` over :meth:`.lookup.LiveFiles.candidates`), and one
  snapshot adds the tasks' data files, a data file of copied rows (soft deletes, closed
  history versions), and -- ``mergeOnRead`` -- a position delete file per data file for
  the rows replaced in table files and the losing rows of this epoch's own files (a key
  two tasks wrote), or -- ``copyOnWrite`` -- those files rewritten without the rows.
  An epoch that changes nothing still commits a snapshot (no files): the marker
  ``flinkish.uid``/``flinkish.epoch`` that makes its replay a no-op.
* **Conflicts**: the commit asserts ``main`` still points at the snapshot the lookup read;
  when another writer (or a compaction) committed first, this attempt's own files are
  deleted, the table is re-read, and the lookup runs again: stale positions are never
  committed. The tasks' data files stay valid (they hold no positions).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.connectors.iceberg.commit import Changes
from flinkish_spark.connectors.iceberg.datafiles import (
    IcebergFile,
    epoch_folder,
    to_data_file,
    write_data_files,
    write_located,
)
from flinkish_spark.connectors.iceberg.deletes import write_position_deletes
from flinkish_spark.connectors.iceberg.lookup import LiveFiles
from flinkish_spark.connectors.iceberg.table import TableInfo
from flinkish_spark.connectors.lakehouse.changes import ChangePlan, check_rows
from flinkish_spark.connectors.lakehouse.entries_file import SUFFIX, EntriesFile, read_entries, store_entries, table_of
from flinkish_spark.connectors.lakehouse.key_lookup import KeyLookup
from flinkish_spark.connectors.lakehouse.resolve import Apply, RowCopy, fill_rows, resolve_epoch
from flinkish_spark.connectors.lakehouse.resolve_task import E_POS, resolve_task
from flinkish_spark.connectors.iceberg.routed_target import table_arrow
from flinkish_spark.connectors.lakehouse.tracked import absorb_untracked
from flinkish_spark.connectors.lakehouse.routed_modes import (
    GoneMarks, close_by_keys, conform, mark_gone, unchanged_snapshot_versions, untouched_keys,
)
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.protocol import PrepareContext

DELETES = "deletes"
DRIVER_PARTITION = 99999  # file names of rows the driver writes (copies, copy-on-write rewrites)


@dataclass(frozen=True)
class KeyedCommittable:
    files: tuple[IcebergFile, ...]  # the task's rows
    first_rows: tuple[int, ...]  # per file: the index of its first row among the task's rows
    entries: bytes  # the task's resolve entries, Arrow IPC (b"" when in ``entries_file``)
    partition: int  # the Spark partition (input order across tasks)
    # Large entries: a file beside the data files (lakehouse.entries_file). A committable pickled by a version
    # before it has no such attribute: the class default (None) reads it as inline.
    entries_file: EntriesFile | None = None

    def paths(self) -> list[str]:
        """What the task wrote (URLs): the data files and the entries file."""
        return [f.path for f in self.files] + ([self.entries_file.path] if self.entries_file is not None else [])


@dataclass(frozen=True)
class Target:
    """What the driver needs to write an epoch into the table."""

    io: FileIO
    info: TableInfo
    uid: str
    plan: ChangePlan
    partition_by: tuple[str, ...]
    rows_per_file: int
    target_file_size: int

    @property
    def spec_id(self) -> int:
        return int(json.loads(self.info.spec_json).get("spec-id", 0))


def prepare(target: Target, batches: Iterator[pa.RecordBatch], ctx: PrepareContext,
            component: str) -> KeyedCommittable | None:
    """Executor side: check, resolve and write one task's changes."""
    rows = [b for b in batches if b.num_rows]
    if not rows:
        return None
    table = pa.Table.from_batches(rows)
    check_rows(target.plan, table, component)
    task = resolve_task(target.plan, table)
    out, entries = _grouped(task.rows, task.entries, target.partition_by)
    located = write_located(target.io, target.info, target.uid, out, ctx, target.partition_by, target.rows_per_file,
                            target.target_file_size)
    # Large entries go to a file of the epoch's folder under a name unique to this prepare (a replay never
    # overwrites the file a decision names), written before the committable exists.
    token = uuid.uuid4().hex[:8]
    name = f"{epoch_folder(target.info, target.uid, ctx.epoch)}/{ctx.partition_id:05d}-{ctx.attempt}-{token}{SUFFIX}"
    inline, entries_file = store_entries(target.io, "", name, entries)
    return KeyedCommittable(tuple(f for f, _ in located), tuple(s for _, s in located), inline, ctx.partition_id,
                            entries_file)


def _grouped(rows: pa.Table, entries: pa.Table, partition_by: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    """Rows grouped by partition (key order kept within each), the entries' row positions moved along."""
    if not partition_by or not rows.num_rows:
        return rows, entries
    order = pc.sort_indices(rows, sort_keys=[(c, "ascending", "at_start") for c in partition_by]).to_numpy()
    moved = np.empty(len(order), dtype=np.int64)
    moved[order] = np.arange(len(order))
    pos = entries[E_POS].to_numpy()
    new_pos = np.where(pos >= 0, moved[np.maximum(pos, 0)], -1)
    return rows.take(pa.array(order)), entries.set_column(entries.schema.get_field_index(E_POS), E_POS,
                                                          pa.array(new_pos, pa.int64()))


def entries_of(c: KeyedCommittable, io: FileIO, epoch: int) -> pa.Table:
    """The task's resolve entries (read from its file, checked against the committable, when there)."""
    if c.entries_file is not None:
        return read_entries(io, "", c.entries_file, epoch)
    return table_of(c.entries)


@dataclass
class EpochPlan:
    changes: Changes
    written: list[str]  # what this attempt wrote on the driver: deleted when its commit is refused
    matched: int = 0  # live table rows the epoch replaced or deleted


def plan_epoch(target: Target, table: Any, committables: list[KeyedCommittable], epoch: int,
               truncate: bool = False, gone: dict[str, np.ndarray] | None = None, marks: GoneMarks | None = None) -> EpochPlan:
    """Driver side: the snapshot that applies the epoch's changes to ``table``'s current snapshot.

    ``truncate``: the epoch empties the table first (every live file removed, the keys looked up in
    no file). ``gone``: rows of table files gone besides the lookup's (data file -> positions): deleted, or
    as ``marks`` says (a routed target's mode: :mod:`~flinkish_spark.connectors.lakehouse.routed_modes`).
    """
    plan = target.plan
    marks = marks or GoneMarks()
    epoch_changes = resolve_epoch(plan, [(c.partition, entries_of(c, target.io, epoch)) for c in committables])
    live = LiveFiles(table, empty=truncate)
    key_field = table.schema().find_field(plan.key[0])
    matches = KeyLookup(target.io, plan.key, plan.live_column).find(epoch_changes.keys(),
                                                                  live.candidates(target.io, key_field))
    read = _reader(target, committables)
    same = np.zeros(0, dtype=np.int64)
    if marks.routed and plan.mode == "history":
        matches, same = unchanged_snapshot_versions(epoch_changes, matches, list(plan.data_columns),
                                                    plan.table_schema, read)
    close_by = close_by_keys(epoch_changes.keys(), marks.close_by_us, marks.shard_close_us)
    same = absorb_untracked(epoch_changes, matches, read, same,  # trackHistoryColumns (a truncate closed the rows)
                            table_rows=untouched_keys(close_by) & (not marks.rest_gone))
    snapshot_from = pa.scalar(marks.close_us, pa.int64()) if marks.routed and marks.close_us >= 0 else None
    applied = epoch_changes.apply(matches, close_by, snapshot_from)
    if len(same):
        epoch_changes.drop_written(applied, same)  # a re-snapshot row equal to the current version: no new version
    gone = dict(gone or {})
    if marks.rest_gone:  # every live row the epoch does not replace
        for f in live.data:
            rows = np.arange(int(f.entry.data_file.record_count), dtype=np.int64)
            gone[f.path] = np.union1d(gone.get(f.path, np.zeros(0, dtype=np.int64)),
                                      np.setdiff1d(rows, live.deleted(target.io, f)))
    if marks.how != "delete":
        mark_gone(applied, gone, marks.how, marks.close_us,
                  lambda path, column, positions: _read_at(target.io, path, positions).column(column).combine_chunks(),
                  marks.shard_close_us)
        gone = {}
    new = [(f, start, i) for i, c in enumerate(committables) for f, start in zip(c.files, c.first_rows)]
    data_files = [to_data_file(f, target.spec_id) for f, _, _ in new]
    written: list[str] = []
    try:
        copies = _copies(target, committables, applied.copies, table_arrow(table.schema()))
        if copies.num_rows:
            extra = write_data_files(target.io, target.info, target.uid, iter(copies.to_batches()),
                                     PrepareContext(target.uid, epoch, DRIVER_PARTITION, 0), target.partition_by,
                                     target.rows_per_file, target.target_file_size)
            written += [f.path for f in extra]
            data_files += [to_data_file(f, target.spec_id) for f in extra]
        # positions to delete: per data file path, with its (spec, partition)
        doomed: dict[str, tuple[np.ndarray, int, tuple[Any, ...]]] = {}
        for path, positions in applied.table_deletes.items():
            f = live.by_path[path]
            doomed[path] = (positions, f.spec_id, f.partition)
        for path, positions in (gone or {}).items():  # (no truncate: then every file goes)
            f = live.by_path[path]
            before = doomed.get(path, (np.zeros(0, dtype=np.int64),))[0]
            doomed[path] = (np.union1d(before, positions), f.spec_id, f.partition)
        for task, positions in applied.new_deletes.items():
            c = committables[task]
            which = np.searchsorted(np.asarray(c.first_rows), positions, side="right") - 1
            for k in np.unique(which):
                own = c.files[int(k)]
                doomed[own.path] = (positions[which == k] - c.first_rows[int(k)], target.spec_id, own.partition)
        if plan.merge_mode == "mergeOnRead":
            deletes = _position_deletes(target, doomed, epoch)
            written += [d.file_path for d in deletes]
            changes = Changes(data_files=data_files, delete_files=deletes)
        else:
            rewritten, removed, replaced = _rewrite(target, live, doomed, epoch)
            written += [f.file_path for f in rewritten]
            data_files = [d for d in data_files if d.file_path not in replaced] + rewritten
            changes = Changes(data_files=data_files, removed=removed)
        if truncate:
            everything: dict[str, set[str]] = {}
            whole = LiveFiles(table)
            for f in (*whole.data, *whole.deletes):
                everything.setdefault(f.manifest, set()).add(f.path)
            changes = Changes(changes.data_files, changes.delete_files,
                              {m: frozenset(p) for m, p in everything.items()})
        return EpochPlan(changes, written, sum(len(p) for p in applied.table_deletes.values()))
    except BaseException:
        target.io.delete_many(written)
        raise


def _copies(target: Target, committables: list[KeyedCommittable], copies: list[RowCopy], schema: pa.Schema) -> pa.Table:
    """The rows the resolution copies (from table files or this epoch's files), with their overrides, in the table's
    ``schema`` (a file written before a column was added lacks it)."""
    read = _reader(target, committables)
    parts = []
    for copy in copies:
        if not len(copy.positions):
            continue
        rows = read(copy.file, copy.task, copy.positions)
        for column, values in copy.overrides.items():
            i = rows.schema.get_field_index(column)
            rows = rows.set_column(i, rows.schema.field(i), values.cast(rows.schema.field(i).type))
        parts.append(conform(fill_rows(rows, copy.fill, read), schema))
    if not parts:
        return pa.table({})
    return pa.concat_tables(parts, promote_options="permissive")


def _reader(target: Target, committables: list[KeyedCommittable]) -> Callable[[str | None, int, np.ndarray], pa.Table]:
    """Rows of a table file (``task`` -1) or of a committable's files (``file`` None), in ``positions``' order."""
    def read(file: str | None, task: int, positions: np.ndarray) -> pa.Table:
        if file is not None:
            return _read_at(target.io, file, positions)
        c = committables[task]
        which = np.searchsorted(np.asarray(c.first_rows), positions, side="right") - 1
        pieces = []
        for k in np.unique(which):
            sel = np.flatnonzero(which == k)
            pieces.append((sel, _read_at(target.io, c.files[int(k)].path, positions[sel] - c.first_rows[int(k)])))
        rows = pa.concat_tables([p for _, p in pieces])
        order = np.concatenate([sel for sel, _ in pieces])
        return rows.take(pa.array(np.argsort(order, kind="stable")))

    return read


def _read_at(io: FileIO, path: str, positions: np.ndarray) -> pa.Table:
    with io.fs.open(io.strip(path), "rb") as handle:
        return pq.read_table(handle).take(pa.array(np.asarray(positions, dtype=np.int64)))


def _position_deletes(target: Target, doomed: dict[str, tuple[np.ndarray, int, tuple[Any, ...]]],
                      epoch: int) -> list[Any]:
    """One position delete file per data file named (file-scoped, as Java Iceberg writes them by default
    since 1.8, ``write.delete.granularity=file``): a reader matches it to its data file by its exact
    ``file_path`` bounds, and readers that insist on one data file per delete file (polars) read it."""
    folder = f"{epoch_folder(target.info, target.uid, epoch)}/{DELETES}"
    out = []
    for path, (positions, spec_id, partition) in doomed.items():
        if len(positions):
            rows = pa.table({"file_path": pa.array([path] * len(positions), pa.string()),
                             "pos": pa.array(positions, pa.int64())})
            f = write_position_deletes(target.io, folder, rows, partition, name=uuid.uuid4().hex)
            out.append(to_data_file(f, spec_id))
    return out


def _rewrite(target: Target, live: LiveFiles, doomed: dict[str, tuple[np.ndarray, int, tuple[Any, ...]]],
             epoch: int) -> tuple[list[Any], dict[str, frozenset[str]], set[str]]:
    """Copy-on-write: each named file written again without its doomed rows (and the rows its delete files
    already remove). Table files are removed in the snapshot; this epoch's own files are just replaced."""
    removed: dict[str, set[str]] = {}
    replaced: set[str] = set()
    new: list[Any] = []
    for path, (positions, spec_id, _) in doomed.items():
        f = live.by_path.get(path)
        gone = np.concatenate([positions, live.deleted(target.io, f)]) if f is not None else positions
        with target.io.fs.open(target.io.strip(path), "rb") as handle:
            data = pq.read_table(handle)
        keep = np.ones(data.num_rows, dtype=bool)
        keep[gone.astype(np.int64)] = False
        if f is not None:
            removed.setdefault(f.manifest, set()).add(path)
        else:
            replaced.add(path)
        rest = data.filter(pa.array(keep))
        if rest.num_rows:
            files = write_data_files(target.io, target.info, target.uid, iter(rest.to_batches()),
                                     PrepareContext(target.uid, epoch, DRIVER_PARTITION, 0), target.partition_by,
                                     target.rows_per_file, target.target_file_size)
            new += [to_data_file(x, spec_id) for x in files]
    return new, {m: frozenset(p) for m, p in removed.items()}, replaced
