"""One attempt of a keyed epoch commit: the Delta version, computed against one state of the table.

:class:`EpochCommit` turns an epoch's resolved changes and the key lookup's matches into
actions: the tasks' files (``add``; rows that lost to another task's change of their key
deleted by a vector, or in ``copyOnWrite`` written again), for each table file holding
replaced rows ``remove`` (its old vector) + ``add`` (the same path with the old vector
united with the new positions; its statistics marked ``tightBounds: false``) -- or the
file rewritten without them -- and the rows copied with columns changed (soft deletes,
closed history versions). It writes the epoch's DV file and its own data files under
names that are the same in every attempt, so an attempt that lost its version to
another writer is overwritten by the next, never orphaned. Nothing of it is visible
until :func:`~flinkish_spark.connectors.delta.keyed.commit_keyed` puts the version.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.delta.committables import DeltaFile, KeyedCommittable, delta_files
from flinkish_spark.connectors.delta.deletion_vectors import DvFileWriter, dv_file_uuid, union_positions
from flinkish_spark.connectors.delta.live import deleted_positions
from flinkish_spark.connectors.delta.log import add_action, commit_payload
from flinkish_spark.connectors.delta.state import DeltaState, LiveFile
from flinkish_spark.connectors.delta.table import DATA_PREFIX, DeltaTarget
from flinkish_spark.connectors.lakehouse.files import epoch_dir, read_positions, write_grouped
from flinkish_spark.connectors.lakehouse.key_lookup import CandidateFile, KeyLookup
from flinkish_spark.connectors.lakehouse.resolve import Apply, EpochChanges, Matches, fill_rows
from flinkish_spark.connectors.lakehouse.tracked import absorb_untracked
from flinkish_spark.connectors.lakehouse.routed_modes import (
    GoneAs, close_by_keys, conform, mark_gone, unchanged_snapshot_versions, untouched_keys,
)
from flinkish_spark.faults import crash_point

@dataclass(frozen=True)
class EpochExtra:
    """What a routed epoch adds to a keyed commit: actions first (a new schema), a truncate, and rows gone
    (what becomes of them: the table's mode, :func:`~flinkish_spark.connectors.lakehouse.routed_modes.gone_rows_as`)."""

    before: tuple[dict[str, Any], ...] = ()  # e.g. the metaData action of an evolved schema
    drop_all: bool = False  # a truncate (upsert, deletes applied): remove every live file before the epoch's rows
    gone: dict[str, np.ndarray] | None = None  # table file -> positions gone besides the lookup's (re-snapshot end)
    gone_as: GoneAs = "delete"
    rest_gone: bool = False  # every live row the epoch does not replace is gone (a truncate, soft or history)
    lookup: bool = True  # False: the epoch's keys replace no table row (history after a truncate closed them all)
    close_us: int = -1  # history: the time gone rows' versions end (epoch µs)
    close_by_us: int = -1  # history: a truncate's time, by which the epoch's keys' table versions end (-1: none)
    routed: bool = False  # a routed target (history: a snapshot row equal to the current version adds none)
    shard_close_us: tuple[tuple[str, int], ...] = ()  # history, merged target: truncated shard -> its truncate's time


@dataclass
class Built:
    payload: bytes
    actions: list[dict[str, Any]]
    vectors: dict[tuple[str, str], np.ndarray]  # (path, vector's unique id) -> positions, for the DV cache


def wide_stats(stats: str | None, rows: int | None = None) -> str:
    """Statistics of a file that now has a deletion vector: its bounds are no longer tight."""
    parsed: dict[str, Any] = json.loads(stats) if stats else {}
    if rows is not None and "numRecords" not in parsed:
        parsed["numRecords"] = rows
    parsed["tightBounds"] = False
    return json.dumps(parsed)


def _bound(value: Any, t: pa.DataType) -> Any:
    """A statistics value as a Python value of the key's type (None where not comparable)."""
    if value is None:
        return None
    try:
        if pa.types.is_date(t) and isinstance(value, str):
            import datetime as dt

            return dt.date.fromisoformat(value)
        if pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            return value
    except ValueError:
        return None
    return None


class EpochCommit:
    """One attempt's Delta version for an epoch, computed against ``state``."""

    def __init__(self, sink: DeltaTarget, state: DeltaState, changes: EpochChanges,
                 committables: list[KeyedCommittable], epoch: int, extra: EpochExtra | None = None) -> None:
        self.sink, self.state, self.changes, self.committables, self.epoch = sink, state, changes, committables, epoch
        self.extra = extra or EpochExtra()
        self.folder = epoch_dir(sink.path, DATA_PREFIX, sink.uid, epoch)
        self.relative_folder = f"{DATA_PREFIX}/{sink.uid}/e{epoch:012d}"
        self.now = int(time.time() * 1000)
        self.actions: list[dict[str, Any]] = []
        self.vectors: dict[tuple[str, str], np.ndarray] = {}
        self.dvs = DvFileWriter(self.relative_folder, dv_file_uuid(sink.uid, epoch))

    def candidates(self) -> list[CandidateFile]:
        plan = self.sink.plan
        assert plan is not None
        first = plan.key[0]
        t = plan.table_schema.field(first).type
        out = []
        for f in self.state.files.values():
            lo, hi = f.bounds(first)
            out.append(CandidateFile(f.path, self._file_url(f), f.size, _bound(lo, t), _bound(hi, t),
                                     functools.partial(deleted_positions, self.sink, f)))
        return out

    def _file_url(self, f: LiveFile) -> str:
        return self._url(f.relative_path)

    def _url(self, rel: str) -> str:
        return rel if "://" in rel or rel.startswith("/") else self.sink.url(rel)

    def build(self, durable_files: bool = True) -> Built:
        """``durable_files`` False: the deletion vector file is not fsynced (the caller syncs the file system before
        the version is linked: :mod:`~flinkish_spark.connectors.delta.version_writes`)."""
        plan = self.sink.plan
        assert plan is not None
        self.actions.extend(self.extra.before)
        if self.extra.drop_all:  # a truncate: every live row goes, the epoch's rows come after it
            matches = Matches({})
            deleted = sum(self._drop_file(f) for f in list(self.state.files.values()))
        elif not self.extra.lookup:
            matches = Matches({})
        else:
            lookup = KeyLookup(self.sink.io, plan.key, plan.live_column)
            matches = lookup.find(self.changes.keys(), self.candidates())
        close_by = close_by_keys(self.changes.keys(), self.extra.close_by_us, self.extra.shard_close_us)
        same = np.zeros(0, dtype=np.int64)
        if plan.mode == "history" and self.extra.routed:
            columns = [c for c in plan.data_columns]
            matches, same = unchanged_snapshot_versions(self.changes, matches, columns, plan.table_schema, self._read)
        same = absorb_untracked(self.changes, matches, self._read, same,  # trackHistoryColumns
                                table_rows=untouched_keys(close_by) & (not self.extra.rest_gone))
        snapshot_from = pa.scalar(self.extra.close_us, pa.int64()) if self.extra.routed and self.extra.close_us >= 0 else None
        apply = self.changes.apply(matches, close_by, snapshot_from)
        if len(same):
            self.changes.drop_written(apply, same)  # a re-snapshot row equal to the current version: no new version
        gone = dict(self.extra.gone or {})
        if self.extra.rest_gone:
            for f in self.state.files.values():
                rows = f.num_records if f.num_records is not None else _footer_rows(self.sink, self._file_url(f))
                live = np.setdiff1d(np.arange(rows, dtype=np.int64), deleted_positions(self.sink, f))
                gone[f.path] = live if f.path not in gone else np.union1d(gone[f.path], live)
        if self.extra.gone_as == "delete":
            for path, positions in gone.items():
                have = apply.table_deletes.get(path)
                apply.table_deletes[path] = positions if have is None else np.union1d(have, positions)
        elif gone:
            mark_gone(apply, gone, self.extra.gone_as, self.extra.close_us, self._read_column, self.extra.shard_close_us)
        added = self._copies(apply)
        deleted = 0 if not self.extra.drop_all else deleted
        deleted += self._table_deletes(apply)
        added += self._new_files(apply)
        self._seed_key_indexes()
        if not self.dvs.empty:
            self.sink.io.write_bytes(self.sink.url(self.dvs.relative_path), self.dvs.bytes(), durable=durable_files)
        crash_point("delta.keyed.before_version")
        info = {"flinkish.uid": self.sink.uid, "flinkish.epoch": self.epoch, "flinkish.mode": plan.mode,
                "operationMetrics": {"numTargetRowsAdded": added, "numTargetRowsDeleted": deleted,
                                     "numKeys": self.changes.keys().num_rows}}
        payload = commit_payload(self.sink.uid, self.epoch, self.actions, info, self.state.version, blind=False,
                                 output_mode="Update")
        lines = [json.loads(line) for line in payload.decode().splitlines() if line.strip()]
        return Built(payload, lines, self.vectors)

    def _read(self, file: str | None, task: int, positions: np.ndarray) -> pa.Table:
        """Rows of a table file (``task`` -1), or of a committable's files (``file`` None), in ``positions``' order."""
        if file is not None:
            return read_positions(self.sink.io, self._file_url(self.state.files[file]), positions)
        c = self.committables[task]
        parts = []
        order = []
        for j, local, sel in c.locate(positions):
            parts.append(read_positions(self.sink.io, self.sink.url(c.files[j].path), local))
            order.append(sel)
        return pa.concat_tables(parts).take(pa.array(np.argsort(np.concatenate(order), kind="stable")))

    def _read_column(self, path: str, column: str, positions: np.ndarray) -> pa.Array:
        f = self.state.files[path]
        return read_positions(self.sink.io, self._file_url(f), positions, [column]).column(column).combine_chunks()

    def _add_new(self, file: DeltaFile, positions: np.ndarray | None) -> None:
        stats = file.stats
        add: dict[str, Any] = add_action(file.path, file.size, dict(file.partition_values), file.stats, self.now)["add"]
        if positions is not None and len(positions):
            dv = self.dvs.add(positions)
            add["deletionVector"] = dv.to_json()
            stats = wide_stats(stats)
            self.vectors[(add["path"], dv.unique_id)] = positions
        add["stats"] = stats
        self.actions.append({"add": add})

    def _new_files(self, apply: Apply) -> int:
        """The tasks' files; rows that lost to another task's change of the key are deleted
        (a vector, or in copyOnWrite the file written again); a file whose rows all lost is
        left out (the epoch's cleanup deletes it)."""
        plan = self.sink.plan
        assert plan is not None
        rows = 0
        for index, c in enumerate(self.committables):
            drops = apply.new_deletes.get(index, np.zeros(0, dtype=np.int64))
            per_file: dict[int, np.ndarray] = {j: local for j, local, _ in c.locate(drops)} if len(drops) else {}
            for j, f in enumerate(c.files):
                local = per_file.get(j)
                if local is not None and len(local) >= f.rows:
                    continue
                if local is not None and plan.merge_mode == "copyOnWrite":
                    keep = np.setdiff1d(np.arange(f.rows, dtype=np.int64), local)
                    table = read_positions(self.sink.io, self.sink.url(f.path), keep)
                    self._write_driver_file(table, f"driver-rewrite-t{index:05d}-{j:04d}")
                    rows += len(keep)
                    continue
                self._add_new(f, local)
                rows += f.rows - (0 if local is None else len(local))
        return rows

    def _seed_key_indexes(self) -> None:
        """The key index of each task file this version names, from the epoch's entries (no read of the file in the
        next epoch's lookup: :meth:`KeyLookup.seed`). A file never named (a lost attempt) only takes cache room."""
        plan = self.sink.plan
        assert plan is not None
        if plan.live_column is not None:
            return  # history: the index depends on the rows' _current too (KeyLookup.seed keeps none)
        for index, c in enumerate(self.committables):
            ends = [start + f.rows for start, f in zip(c.starts, c.files)]
            if not c.files or c.starts[0] != 0 or list(c.starts[1:]) != ends[:-1]:
                continue  # not the files' rows one after another (as :meth:`KeyedCommittable.locate` reads them)
            keys = self.changes.written_keys(index, ends[-1])
            if keys is not None:
                self._seed(c.files, c.starts, keys)

    def _seed(self, files: Sequence[DeltaFile], starts: Sequence[int], keys: pa.Table) -> None:
        """:meth:`KeyLookup.seed` of each file, whose rows' keys are ``keys`` from its start on."""
        plan = self.sink.plan
        assert plan is not None
        if plan.live_column is not None:
            return
        lookup = KeyLookup(self.sink.io, plan.key, plan.live_column)
        for f, start in zip(files, starts):
            lookup.seed(self._url(f.path), f.size, keys.slice(start, f.rows))

    def _write_driver_file(self, table: pa.Table, stem: str) -> None:
        written, _ = write_grouped(self.sink.io, self.folder, table, lambda i: f"{stem}-{i:04d}.parquet",
                                   self.sink.partition_by, max(table.num_rows, 1), 1 << 62)
        for new in delta_files(self.sink.io, self.sink.path, [w for w, _ in written]):
            self._add_new(new, None)

    def _copies(self, apply: Apply) -> int:
        """Rows written again with some columns changed (soft deletes, closed history versions)."""
        plan = self.sink.plan
        assert plan is not None
        read = self._read
        pieces = []
        for copy in apply.copies:
            rows = read(copy.file, copy.task, copy.positions)
            for name, values in copy.overrides.items():
                rows = rows.set_column(rows.schema.get_field_index(name), name, values)
            pieces.append(conform(fill_rows(rows, copy.fill, read), plan.table_schema))
        if not pieces:
            return 0
        table = pa.concat_tables(pieces, promote_options="permissive")
        table = table.sort_by([(k, "ascending") for k in plan.key])
        written, order = write_grouped(self.sink.io, self.folder, table, lambda i: f"driver-copy-{i:04d}.parquet",
                                       self.sink.partition_by, self.sink.rows_per_file, self.sink.target_file_size)
        files = delta_files(self.sink.io, self.sink.path, [w for w, _ in written])
        for f in files:
            self._add_new(f, None)
        keys = table.select(list(plan.key))
        self._seed(files, [first for _, first in written], keys if order is None else keys.take(pa.array(order)))
        return table.num_rows

    def _table_deletes(self, apply: Apply) -> int:
        plan = self.sink.plan
        assert plan is not None
        deleted = 0
        rewrites = 0
        for path, positions in sorted(apply.table_deletes.items()):
            f = self.state.files[path]
            before = deleted_positions(self.sink, f)
            union = union_positions(before, positions)
            deleted += len(union) - len(before)
            rows = f.num_records
            if rows is None:
                rows = _footer_rows(self.sink, self._file_url(f))
            self.actions.append(f.remove_action(self.now))
            if len(union) >= rows:
                continue  # every row of the file is gone: the remove alone
            if plan.merge_mode == "copyOnWrite":
                self._rewrite(f, union, rows, rewrites)
                rewrites += 1
                continue
            dv = self.dvs.add(union)
            add = f.add_action(dv)
            add["add"]["stats"] = wide_stats(f.stats, rows)
            self.actions.append(add)
            self.vectors[(f.path, dv.unique_id)] = union
        return deleted

    def _drop_file(self, f: LiveFile) -> int:
        rows = f.num_records
        if rows is None:
            rows = _footer_rows(self.sink, self._file_url(f))
        self.actions.append(f.remove_action(self.now))
        return rows - len(deleted_positions(self.sink, f))

    def _rewrite(self, f: LiveFile, drop: np.ndarray, rows: int, n: int) -> None:
        """copyOnWrite: the file again without the dropped rows (a new file; the old one is removed)."""
        keep = np.setdiff1d(np.arange(rows, dtype=np.int64), drop)
        self._write_driver_file(read_positions(self.sink.io, self._file_url(f), keep), f"driver-rewrite-{n:04d}")


def _footer_rows(sink: DeltaTarget, url: str) -> int:
    import pyarrow.parquet as pq

    with sink.io.fs.open(sink.io.strip(url), "rb") as handle:
        return int(pq.ParquetFile(handle).metadata.num_rows)



