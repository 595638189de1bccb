"""Keyed change application into an Iceberg table: upsert, deletes, history -- one snapshot per epoch.

* **Prepare** (executors): a task checks its change rows (no null key, ``_op`` in
  r/c/u/d: else :class:`~flinkish_spark.errors.ChangeDataError`), keeps the last change
  per key of the task in upsert mode (all of them in history mode), and stages them as
  one Parquet file below the epoch's folder (``e<epoch>/_changes/``). No manifest names it.
* **Commit** (driver, after the decision): the staged changes of all tasks are resolved
  together (:mod:`.changes`: last change of a key wins by ``_lsn``, then input order),
  the live rows of the changed keys are looked up in the current snapshot
  (:mod:`.lookup`), and one snapshot is committed with

  - the new row versions as data files, and
  - ``mergeOnRead``: a position delete file per partition for the rows they replace or
    delete (format version 2); ``copyOnWrite``: the data files holding those rows
    rewritten without them (the old files removed in the same snapshot).

  An epoch that changes nothing still commits a snapshot (no files): the marker
  ``flinkish.uid``/``flinkish.epoch`` that makes a replay a no-op.
* **Conflicts**: the snapshot is committed with ``assert-ref-snapshot-id`` on the
  snapshot the lookup read. When another writer (or a compaction) committed first, the
  files this attempt wrote are deleted, the table is re-read, and the lookup runs again
  against the new snapshot: stale positions are never committed.

Per-epoch cost: reading the staged changes, the lookup (candidate files pruned by key
bounds, key columns cached per data file), and writing O(changes) rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.connectors.iceberg import changes as ch
from flinkish_spark.connectors.iceberg.commit import Changes
from flinkish_spark.connectors.iceberg.datafiles import IcebergFile, epoch_folder, to_data_file, write_data_files
from flinkish_spark.connectors.iceberg.deletes import write_position_deletes
from flinkish_spark.connectors.iceberg.lookup import LiveFile, LiveFiles, find
from flinkish_spark.connectors.iceberg.table import TableInfo
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.protocol import PrepareContext

STAGED = "_changes"
DELETES = "deletes"


@dataclass(frozen=True)
class KeyedCommittable:
    staged: tuple[str, ...]  # Parquet files of one task's checked (and, in upsert mode, resolved) changes
    rows: int


@dataclass(frozen=True)
class Target:
    """What the driver needs to write an epoch into the table."""

    io: FileIO
    info: TableInfo
    uid: str
    spec: ch.Keyed
    partition_by: tuple[str, ...]
    rows_per_file: int
    target_file_size: int


def stage(io: FileIO, info: TableInfo, uid: str, spec: ch.Keyed, batches: Iterator[pa.RecordBatch],
          ctx: PrepareContext, component: str) -> KeyedCommittable | None:
    """Executor side: check and stage one task's changes."""
    rows = [b for b in batches if b.num_rows]
    if not rows:
        return None
    table = ch.checked(pa.Table.from_batches(rows), spec, ctx.partition_id, component)
    if spec.mode == "upsert":
        table = ch.last_per_key(table, spec)
    if not table.num_rows:
        return None
    url = f"{epoch_folder(info, uid, ctx.epoch)}/{STAGED}/{ctx.partition_id:05d}-{ctx.attempt}-{uuid.uuid4().hex[:8]}.parquet"
    io.makedirs(io.strip(url).rsplit("/", 1)[0])
    with io.fs.open(io.strip(url), "wb") as handle:
        pq.write_table(table, handle, compression="zstd")
    return KeyedCommittable((url,), table.num_rows)


@dataclass
class EpochPlan:
    changes: Changes
    written: list[str]  # what this attempt wrote: deleted when its commit is refused


def plan_epoch(target: Target, table: Any, committables: list[KeyedCommittable], epoch: int) -> EpochPlan:
    """Driver side: the snapshot contents that apply the epoch's staged changes to ``table``'s current snapshot."""
    staged = _read_staged(target.io, [p for c in committables for p in c.staged])
    if staged is None:
        return EpochPlan(Changes(), [])
    spec = target.spec
    schema = table.schema()
    key_fields = [schema.find_field(k) for k in spec.key]
    live = LiveFiles(table)
    if spec.mode == "upsert":
        winners = ch.last_per_key(staged, spec)
        keys = winners.select(list(spec.key))
        if spec.deletes == "soft":
            out = winners.append_column(ch.DELETED, pc.fill_null(pc.equal(winners["_op"], "d"), False))
        elif "_op" in winners.column_names:
            out = winners.filter(pc.fill_null(pc.not_equal(winners["_op"], "d"), True))
        else:
            out = winners
        replaced = find(target.io, live, key_fields, keys)
    else:
        versions, first = ch.history_versions(staged, spec)
        found = find(target.io, live, key_fields, first.select(list(spec.key)))
        replaced, closed = _close_current(target.io, found, first, spec)
        out = versions if closed is None else pa.concat_tables([closed, versions.select(closed.column_names)],
                                                               promote_options="permissive")
    written: list[str] = []
    try:
        new = _write_rows(target, out, epoch)
        written += [f.path for f in new]
        data_files = [to_data_file(f, _spec_id(target)) for f in new]
        if spec.merge_mode == "mergeOnRead":
            deletes = _position_deletes(target, live, replaced, epoch)
            written += [d.file_path for d in deletes]
            return EpochPlan(Changes(data_files=data_files, delete_files=deletes), written)
        rewritten, removed = rewrite_without(target, live, replaced, epoch)
        written += [f.file_path for f in rewritten]
        return EpochPlan(Changes(data_files=data_files + rewritten, removed=removed), written)
    except BaseException:
        target.io.delete_many(written)
        raise


def _read_staged(io: FileIO, paths: list[str]) -> pa.Table | None:
    tables = []
    for path in paths:
        with io.fs.open(io.strip(path), "rb") as handle:
            tables.append(pq.read_table(handle))
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _spec_id(target: Target) -> int:
    import json

    return int(json.loads(target.info.spec_json).get("spec-id", 0))


def _write_rows(target: Target, rows: pa.Table, epoch: int) -> list[IcebergFile]:
    """The epoch's new row versions as data files, sorted by key (so key bounds prune lookups)."""
    if not rows.num_rows:
        return []
    rows = rows.sort_by([(k, "ascending") for k in target.spec.key])
    ctx = PrepareContext(target.uid, epoch, 99999, 0)
    return write_data_files(target.io, target.info, target.uid, iter(rows.to_batches(max_chunksize=64 * 1024)), ctx,
                            target.partition_by, target.rows_per_file, target.target_file_size)


def _by_file(live: LiveFiles, rows: pa.Table) -> dict[str, tuple[LiveFile, np.ndarray]]:
    files = {f.path: f for f in live.data}
    out: dict[str, tuple[LiveFile, np.ndarray]] = {}
    if not rows.num_rows:
        return out
    for part in rows.group_by("file_path").aggregate([("pos", "list")]).to_pylist():
        out[part["file_path"]] = (files[part["file_path"]], np.unique(np.asarray(part["pos_list"], dtype=np.int64)))
    return out


def _position_deletes(target: Target, live: LiveFiles, rows: pa.Table, epoch: int) -> list[Any]:
    """One position delete file per (spec, partition) of the data files that hold ``rows``."""
    groups: dict[tuple[int, tuple[Any, ...]], list[tuple[str, np.ndarray]]] = {}
    for path, (f, pos) in _by_file(live, rows).items():
        record = f.entry.data_file.partition
        partition = tuple(record[i] for i in range(len(record))) if record is not None else ()
        groups.setdefault((f.entry.data_file.spec_id or 0, partition), []).append((path, pos))
    folder = f"{epoch_folder(target.info, target.uid, epoch)}/{DELETES}"
    out = []
    for (spec_id, partition), parts in groups.items():
        positions = pa.table({"file_path": pa.array([p for p, pos in parts for _ in range(len(pos))], pa.string()),
                              "pos": pa.array(np.concatenate([pos for _, pos in parts]), pa.int64())})
        out.append(to_data_file(write_position_deletes(target.io, folder, positions, partition), spec_id))
    return out


def rewrite_without(target: Target, live: LiveFiles, rows: pa.Table, epoch: int,
                    ) -> tuple[list[Any], dict[str, frozenset[str]]]:
    """Copy-on-write: the data files that hold ``rows`` written again without them (and without the rows
    their delete files already remove); returns the new files and the removals by manifest."""
    from flinkish_spark.connectors.iceberg.deletes import read_positions

    removed: dict[str, set[str]] = {}
    new: list[Any] = []
    for path, (f, pos) in _by_file(live, rows).items():
        gone = read_positions(target.io, live.deletes_for(f))
        gone = gone.filter(pc.equal(gone["file_path"], path))["pos"].to_numpy()
        with target.io.fs.open(target.io.strip(path), "rb") as handle:
            data = pq.read_table(handle)
        keep = np.ones(data.num_rows, dtype=bool)
        keep[np.concatenate([pos, gone]).astype(np.int64)] = False
        removed.setdefault(f.manifest, set()).add(path)
        rest = data.filter(pa.array(keep))
        if rest.num_rows:
            ctx = PrepareContext(target.uid, epoch, 99998, 0)
            files = write_data_files(target.io, target.info, target.uid, iter(rest.to_batches()), ctx,
                                     target.partition_by, target.rows_per_file, target.target_file_size)
            new += [to_data_file(x, f.entry.data_file.spec_id or 0) for x in files]
    return new, {m: frozenset(p) for m, p in removed.items()}


def _close_current(io: FileIO, found: pa.Table, first: pa.Table, spec: ch.Keyed) -> tuple[pa.Table, pa.Table | None]:
    """History: of the live rows of the changed keys, the current versions -- to delete -- and their
    closed copies (``_valid_to`` = the key's first change in the epoch, ``_current`` false)."""
    if not found.num_rows:
        return found, None
    parts, where = [], []
    for part in found.group_by("file_path").aggregate([("pos", "list")]).to_pylist():
        with io.fs.open(io.strip(part["file_path"]), "rb") as handle:
            data = pq.read_table(handle)
        pos = np.asarray(part["pos_list"], dtype=np.int64)
        rows = data.take(pa.array(pos))
        current = pc.fill_null(rows[ch.CURRENT], False)
        parts.append(rows.filter(current))
        where.append(pa.table({"file_path": pa.array([part["file_path"]] * int(pc.sum(current).as_py() or 0), pa.string()),
                               "pos": pa.array(pos[current.to_numpy(zero_copy_only=False)], pa.int64())}))
    rows = pa.concat_tables(parts)
    if not rows.num_rows:
        return pa.concat_tables(where), None
    closes = first.select([*spec.key, "_commit_ts"])
    closes = pa.table({**{k: closes[k].cast(rows.schema.field(k).type) for k in spec.key},
                       "__to": closes["_commit_ts"].cast(rows.schema.field(ch.VALID_TO).type)})
    joined = rows.join(closes, keys=list(spec.key), join_type="inner")
    closed = joined.set_column(joined.schema.get_field_index(ch.VALID_TO), ch.VALID_TO, joined["__to"]) \
        .set_column(joined.schema.get_field_index(ch.CURRENT), ch.CURRENT, pa.array([False] * joined.num_rows))
    return pa.concat_tables(where), closed.drop_columns(["__to"])
