"""``mode=upsert|history``: an epoch's changes applied by key with deletion vectors, exactly once.

* **Prepare** (executors): a task checks its rows (:func:`check_rows`), resolves them by
  key (:func:`resolve_task`: the last change per key, or every version), writes the rows
  the table will hold sorted by key as Parquet files below ``flinkish/<uid>/e<epoch>/``,
  and returns a :class:`KeyedCommittable`: the files and the task's *entries* (its keys,
  the order of their changes, where their rows are).
* **Commit** (driver, after the decision is recorded): the epoch's entries are resolved
  across tasks, the changed keys are looked up in the table's live files
  (:class:`KeyLookup`: positions of the rows they replace), and one Delta version is
  written with put-if-absent: the new files (``add``), for every table file holding a
  replaced row ``remove`` (its old deletion vector) + ``add`` (same path, the old vector
  united with the new positions) -- or, with ``mergeMode=copyOnWrite``, the file rewritten
  without them -- rows copied with columns changed (soft deletes, closed history
  versions) in one more file, and ``txn(appId = uid, version = epoch)``. Also an epoch
  that changes nothing writes its version: the txn says it is done.
* **Exactly once**: before each attempt the sink reads the commits written since its
  state (:class:`DeltaState`) and answers ``ALREADY_COMMITTED`` when the txn of its uid
  is >= the epoch -- a replay, or a commit of ours whose answer was lost. When another
  writer took the version (the put-if-absent failed), its commit is read and the
  lookup is done again against the new version: positions are never applied to a state
  they were not computed on (Delta's conflict rule for a read-modify-write, taken
  literally: any concurrent commit means a new read).
* **Files the commit writes itself** (the DV file, copies, rewrites) are below the
  epoch's folder under names that are the same in every attempt of the epoch (so a
  later attempt overwrites, never orphans); cleanup keeps those the table names.

Every ``compactEvery`` epochs the commit is followed by a compaction
(:mod:`flinkish_spark.connectors.delta.compaction`); every ``checkpointInterval``
versions by a checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
import struct
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.delta.append import DeltaFile, decode_files, delta_files, encode_files
from flinkish_spark.connectors.delta.deletion_vectors import Descriptor, DvFileWriter, dv_file_uuid, read_vector
from flinkish_spark.connectors.delta.log import StaleHead, TableChanged, VersionTaken, add_action, commit_payload
from flinkish_spark.connectors.delta.state import DeltaState, LiveFile, load_state
from flinkish_spark.connectors.delta.table import DATA_PREFIX
from flinkish_spark.connectors.lakehouse.changes import check_rows
from flinkish_spark.connectors.lakehouse.files import epoch_dir, read_positions, write_table
from flinkish_spark.connectors.lakehouse.key_lookup import CandidateFile, KeyLookup
from flinkish_spark.connectors.lakehouse.resolve import Apply, EpochChanges, resolve_epoch, resolve_task
from flinkish_spark.errors import CorruptMetadataError, StorageUnavailableError
from flinkish_spark.faults import crash_point, fail_point
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext

if TYPE_CHECKING:
    from flinkish_spark.connectors.delta.sink import DeltaSink

log = logging.getLogger(__name__)

KEYED_MAGIC = b"FKD1"
MAX_ATTEMPTS = 20
DRIVER_FILE_PREFIXES = ("deletion_vector_", "driver-", "compact-")
DV_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class KeyedCommittable:
    """One task's prepared rows (files, in row order) and its entries (Arrow IPC)."""

    partition: int
    files: tuple[DeltaFile, ...]
    starts: tuple[int, ...]  # first row of each file among the task's rows
    entries: bytes

    def entries_table(self) -> pa.Table:
        return pa.ipc.open_stream(self.entries).read_all()

    def locate(self, positions: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(file index, positions in that file, indexes into ``positions``) per file."""
        starts = np.asarray(self.starts, dtype=np.int64)
        which = np.searchsorted(starts, positions, "right") - 1
        for j in np.unique(which):
            sel = np.flatnonzero(which == j)
            yield int(j), positions[sel] - starts[j], sel


def encode_keyed(c: KeyedCommittable) -> bytes:
    header = json.dumps({"partition": c.partition, "files": encode_files(c.files), "starts": list(c.starts)}).encode()
    return KEYED_MAGIC + struct.pack(">I", len(header)) + header + c.entries


def decode_keyed(data: bytes) -> KeyedCommittable:
    (n,) = struct.unpack_from(">I", data, len(KEYED_MAGIC))
    start = len(KEYED_MAGIC) + 4
    header = json.loads(data[start:start + n])
    return KeyedCommittable(int(header["partition"]), decode_files(header["files"]), tuple(header["starts"]),
                            data[start + n:])


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def prepare_keyed(sink: "DeltaSink", batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> KeyedCommittable | None:
    plan = sink.plan
    assert plan is not None
    got = [b for b in batches if b.num_rows]
    if not got:
        return None
    table = pa.Table.from_batches(got)
    check_rows(plan, table, f"flinkish.delta sink uid {sink.uid!r}")
    resolved = resolve_task(plan, table)
    rows = resolved.rows.cast(plan.table_schema)
    token = uuid.uuid4().hex[:8]
    written = write_table(sink.io, epoch_dir(sink.path, DATA_PREFIX, sink.uid, ctx.epoch), rows,
                          lambda i: f"{ctx.partition_id:05d}-{ctx.attempt}-{token}-{i:04d}.parquet",
                          sink.rows_per_file, sink.target_file_size)
    fail_point("sink.write", attempt=ctx.attempt)
    return KeyedCommittable(ctx.partition_id, delta_files(sink, [w for w, _ in written]),
                            tuple(s for _, s in written), _ipc(resolved.entries))


# -- per-process state ----------------------------------------------------------------------------

_STATES: dict[tuple[str, str, str], DeltaState] = {}
_STATES_LOCK = threading.Lock()
_DV_CACHE: OrderedDict[str, np.ndarray] = OrderedDict()
_DV_LOCK = threading.Lock()


def table_state(sink: "DeltaSink") -> DeltaState:
    """The sink's view of the table, loaded once per process, brought up to date on each call."""
    key = sink._head_key()
    with _STATES_LOCK:
        state = _STATES.get(key)
    if state is None:
        table = sink.validate(False, "flinkish.delta commit")
        try:
            state = load_state(sink.log(), table.version())
        except TableChanged:
            return table_state(sink)  # changed again while loading: validate the newer version
        with _STATES_LOCK:
            _STATES[key] = state
    else:
        try:
            state.catch_up(sink.log())
        except TableChanged:
            forget_state(sink)
            return table_state(sink)
    return state


def forget_state(sink: "DeltaSink") -> None:
    with _STATES_LOCK:
        _STATES.pop(sink._head_key(), None)
    sink._forget_head()


def deleted_positions(sink: "DeltaSink", f: LiveFile) -> np.ndarray:
    """The positions a live file's deletion vector covers (cached by the vector's unique id)."""
    if f.dv is None:
        return np.zeros(0, dtype=np.int64)
    key = f"{sink.table_uri}|{f.path}|{f.dv.unique_id}"
    with _DV_LOCK:
        found = _DV_CACHE.get(key)
        if found is not None:
            _DV_CACHE.move_to_end(key)
            return found

    def read_range(where: str, start: int, end: int) -> bytes:
        target = where if f.dv is not None and f.dv.storage_type == "p" else sink.url(where)
        return bytes(sink.io.fs.cat_file(sink.io.strip(target), start, end))

    positions = read_vector(f.dv, read_range)
    _remember_dv(key, positions)
    return positions


def _remember_dv(key: str, positions: np.ndarray) -> None:
    with _DV_LOCK:
        _DV_CACHE[key] = positions
        total = sum(a.nbytes for a in _DV_CACHE.values())
        while total > DV_CACHE_BYTES and len(_DV_CACHE) > 1:
            _, old = _DV_CACHE.popitem(last=False)
            total -= old.nbytes


# -- the commit -----------------------------------------------------------------------------------


def commit_keyed(sink: "DeltaSink", committables: list[KeyedCommittable], epoch: int) -> CommitOutcome:
    plan = sink.plan
    assert plan is not None
    changes = resolve_epoch(plan, [(c.partition, c.entries_table()) for c in committables])
    for _ in range(MAX_ATTEMPTS):
        try:
            state = table_state(sink)
        except StorageUnavailableError:
            return "RETRY_LATER"
        if state.txn(sink.uid) >= epoch:
            return "ALREADY_COMMITTED"
        built = EpochCommit(sink, state, changes, committables, epoch).build()
        version = state.version + 1
        try:
            passed = sink.log().behind_checkpoint(version, sink.log().last_checkpoint())
            if passed is not None:
                state.apply(version, passed)  # a version we had not seen: read again and redo
                continue
            sink.log().write_version(version, built.payload)
        except VersionTaken:
            continue  # another writer's commit: read it, then look the keys up again
        except (StaleHead, TableChanged):
            forget_state(sink)
            continue
        except StorageUnavailableError:
            forget_state(sink)  # the put may have landed: the next attempt reads the log again
            return "RETRY_LATER"
        state.apply(version, built.actions)
        for key, positions in built.vectors.items():
            _remember_dv(f"{sink.table_uri}|{key}", positions)
        crash_point("delta.keyed.after_version")
        after_keyed(sink, state, version, epoch)
        return "COMMITTED"
    return "RETRY_LATER"


def after_keyed(sink: "DeltaSink", state: DeltaState, version: int, epoch: int) -> None:
    """Compaction every ``compactEvery`` epochs, a checkpoint every ``checkpointInterval`` versions.

    The epoch is committed already: a failure here is logged, not raised.
    """
    from flinkish_spark.connectors.delta.compaction import compact

    try:
        if sink.compact_every and (epoch + 1) % sink.compact_every == 0:
            compacted = compact(sink, state, epoch)
            if compacted is not None:
                version = compacted
        if sink.checkpoint_interval and version % sink.checkpoint_interval == 0:
            sink.table().create_checkpoint()
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("flinkish.delta: table maintenance after epoch %d of %s failed: %s", epoch, sink.path, exc)


@dataclass
class Built:
    payload: bytes
    actions: list[dict[str, Any]]
    vectors: dict[str, np.ndarray]  # "<path>|<dv unique id>" -> positions, for the DV cache


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

    def __init__(self, sink: "DeltaSink", state: DeltaState, changes: EpochChanges,
                 committables: list[KeyedCommittable], epoch: int) -> None:
        self.sink, self.state, self.changes, self.committables, self.epoch = sink, state, changes, committables, epoch
        self.folder = epoch_dir(sink.path, DATA_PREFIX, sink.uid, epoch)
        self.relative_folder = f"{DATA_PREFIX}/{sink.uid}/e{epoch:012d}"
        self.now = int(time.time() * 1000)
        self.actions: list[dict[str, Any]] = []
        self.vectors: dict[str, np.ndarray] = {}
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
        rel = f.relative_path
        return rel if "://" in rel or rel.startswith("/") else self.sink.url(rel)

    def build(self) -> Built:
        plan = self.sink.plan
        assert plan is not None
        lookup = KeyLookup(self.sink.io, plan.key, plan.live_column)
        matches = lookup.find(self.changes.keys(), self.candidates())
        apply = self.changes.apply(matches)
        added = self._copies(apply)
        deleted = self._table_deletes(apply)
        added += self._new_files(apply)
        if not self.dvs.empty:
            self.sink.io.write_bytes(self.sink.url(self.dvs.relative_path), self.dvs.bytes())
        crash_point("delta.keyed.before_version")
        info = {"flinkish.uid": self.sink.uid, "flinkish.epoch": self.epoch, "flinkish.mode": plan.mode,
                "operationMetrics": {"numTargetRowsAdded": added, "numTargetRowsDeleted": deleted,
                                     "numKeys": self.changes.keys().num_rows}}
        payload = commit_payload(self.sink.uid, self.epoch, self.actions, info, self.state.version, blind=False,
                                 output_mode="Update")
        lines = [json.loads(line) for line in payload.decode().splitlines() if line.strip()]
        return Built(payload, lines, self.vectors)

    def _add_new(self, file: DeltaFile, positions: np.ndarray | None) -> None:
        stats = file.stats
        add: dict[str, Any] = add_action(file.path, file.size, dict(file.partition_values), file.stats, self.now)["add"]
        if positions is not None and len(positions):
            dv = self.dvs.add(positions)
            add["deletionVector"] = dv.to_json()
            stats = wide_stats(stats)
            self.vectors[f"{add['path']}|{dv.unique_id}"] = positions
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

    def _write_driver_file(self, table: pa.Table, stem: str) -> None:
        written = write_table(self.sink.io, self.folder, table, lambda i: f"{stem}-{i:04d}.parquet",
                              max(table.num_rows, 1), 1 << 62)
        for new in delta_files(self.sink, [w for w, _ in written]):
            self._add_new(new, None)

    def _copies(self, apply: Apply) -> int:
        """Rows written again with some columns changed (soft deletes, closed history versions)."""
        plan = self.sink.plan
        assert plan is not None
        pieces = []
        for copy in apply.copies:
            if copy.file is not None:
                rows = read_positions(self.sink.io, self._file_url(self.state.files[copy.file]), copy.positions)
            else:
                c = self.committables[copy.task]
                parts = []
                order = []
                for j, local, sel in c.locate(copy.positions):
                    parts.append(read_positions(self.sink.io, self.sink.url(c.files[j].path), local))
                    order.append(sel)
                rows = pa.concat_tables(parts).take(pa.array(np.argsort(np.concatenate(order), kind="stable")))
            for name, values in copy.overrides.items():
                rows = rows.set_column(rows.schema.get_field_index(name), name, values)
            pieces.append(rows.cast(plan.table_schema))
        if not pieces:
            return 0
        table = pa.concat_tables(pieces)
        table = table.sort_by([(k, "ascending") for k in plan.key])
        written = write_table(self.sink.io, self.folder, table, lambda i: f"driver-copy-{i:04d}.parquet",
                              self.sink.rows_per_file, self.sink.target_file_size)
        for f in delta_files(self.sink, [w for w, _ in written]):
            self._add_new(f, None)
        return table.num_rows

    def _table_deletes(self, apply: Apply) -> int:
        plan = self.sink.plan
        assert plan is not None
        deleted = 0
        rewrites = 0
        for path, positions in sorted(apply.table_deletes.items()):
            f = self.state.files[path]
            before = deleted_positions(self.sink, f)
            union = np.union1d(before, positions)
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
            self.vectors[f"{f.path}|{dv.unique_id}"] = union
        return deleted

    def _rewrite(self, f: LiveFile, drop: np.ndarray, rows: int, n: int) -> None:
        """copyOnWrite: the file again without the dropped rows (a new file; the old one is removed)."""
        keep = np.setdiff1d(np.arange(rows, dtype=np.int64), drop)
        self._write_driver_file(read_positions(self.sink.io, self._file_url(f), keep), f"driver-rewrite-{n:04d}")


def _footer_rows(sink: "DeltaSink", url: str) -> int:
    import pyarrow.parquet as pq

    with sink.io.fs.open(sink.io.strip(url), "rb") as handle:
        return int(pq.ParquetFile(handle).metadata.num_rows)


def live_references(sink: "DeltaSink") -> set[str]:
    """Paths (relative, decoded) of live data files and of the DV files live files use."""
    state = table_state(sink)
    out = {f.relative_path for f in state.files.values()}
    for f in state.files.values():
        if f.dv is not None and f.dv.storage_type == "u":
            try:
                rel = f.dv.relative_file()
            except CorruptMetadataError:
                continue
            if rel:
                out.add(rel)
    return out


def is_driver_file(name: str) -> bool:
    return name.startswith(DRIVER_FILE_PREFIXES)


__all__ = ["KeyedCommittable", "commit_keyed", "prepare_keyed", "encode_keyed", "decode_keyed", "Descriptor"]
