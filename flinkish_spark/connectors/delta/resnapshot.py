"""A re-snapshot (``_op`` 'B' ... 'E' after a lost slot) applied to a keyed Delta table.

The new snapshot shows every row that exists, not the rows deleted while no slot kept their
WAL. So from the epoch holding 'B' to the one holding 'E' the sink remembers the keys the
epochs upserted -- one small Parquet file per epoch in the sink's metadata,
``sinks/<uid>/resnapshot/<target hash>/e<epoch>.parquet`` (written before the epoch's
version, the same bytes on a retry) -- and in the version of the epoch holding 'E' it
deletes every live row of the table whose key is not among them (deletion vectors, as any
replaced row). Keys, not files: a key rewritten during the re-snapshot (compaction, a
copy-on-write rewrite) is still recognised.

Exactly once: the deletes are part of the epoch's one Delta version (txn of the uid); a
retry computes them again against the newest state. The remembered keys are removed after
the version is written (left-overs of a crash there are removed at the next 'B').
Cost: nothing for a table outside a re-snapshot (the set of tables in one is read once per
process with one listing); at 'E', one read of the key columns of every live file of the table.
"""

from __future__ import annotations

import hashlib
import io as _io
import threading
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.connectors.delta.committables import KeyedCommittable
from flinkish_spark.connectors.delta.live import deleted_positions
from flinkish_spark.connectors.delta.state import DeltaState
from flinkish_spark.connectors.delta.table import DeltaTarget
from flinkish_spark.connectors.lakehouse.resolve import E_KIND, KIND_VERSION
from flinkish_spark.io.fileio import FileIO

_ACTIVE: dict[str, set[str]] = {}  # metadata folder -> target hashes with a re-snapshot under way
_LOCK = threading.RLock()  # re-entrant: step() adds under the lock that _active() takes


def target_hash(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:16]


def upserted_keys(keyed: Sequence[KeyedCommittable], key: tuple[str, ...]) -> pa.Table:
    """The keys the tasks wrote a row for (their entries of kind VERSION)."""
    parts = []
    for k in keyed:
        entries = k.entries_table()
        parts.append(entries.filter(pc.equal(entries.column(E_KIND), KIND_VERSION)).select(list(key)))
    return pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})


def positions_not_in(keys: pa.Table, seen: pa.Table) -> np.ndarray:
    """Positions of the rows of ``keys`` whose key is not a row of ``seen`` (same column names)."""
    names = list(keys.column_names)
    if seen.num_rows == 0:
        return np.arange(keys.num_rows, dtype=np.int64)
    seen = seen.select(names).cast(keys.schema)
    left = keys.append_column("__pos", pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    unique = seen.group_by(names, use_threads=False).aggregate([])
    right = unique.append_column("__hit", pa.repeat(pa.scalar(True), unique.num_rows))
    joined = left.join(right, names, join_type="left outer", use_threads=False)
    hit = np.zeros(keys.num_rows, dtype=np.bool_)
    hit[joined.column("__pos").to_numpy()] = np.asarray(pc.fill_null(joined.column("__hit"), False).to_numpy(
        zero_copy_only=False), dtype=np.bool_)
    return np.flatnonzero(~hit)


class Resnapshots:
    """The re-snapshots under way for the targets of one sink uid (files below ``directory``)."""

    def __init__(self, io: FileIO, directory: str) -> None:
        self.io = io
        self.root = join(directory, "resnapshot")

    def _active(self) -> set[str]:
        with _LOCK:
            found = _ACTIVE.get(self.root)
            if found is None:
                found = set(self.io.list_names(self.root))
                _ACTIVE[self.root] = found
            return found

    def active(self, path: str) -> bool:
        return target_hash(path) in self._active()

    def step(self, target: DeltaTarget, state: DeltaState, begin: bool, end: bool,
             keyed: Sequence[KeyedCommittable], epoch: int) -> dict[str, np.ndarray] | None:
        """Remember the epoch's keys; at the end, the live rows to delete (table file -> positions)."""
        assert target.plan is not None
        key = target.plan.key
        folder = join(self.root, target_hash(target.path))
        if begin:
            stale = [join(folder, n) for n in self.io.list_names(folder) if n != f"e{epoch:012d}.parquet"]
            self.io.delete_many(stale)
        keys = upserted_keys(keyed, key)
        buf = _io.BytesIO()
        pq.write_table(keys if keys.num_columns else pa.table({k: pa.array([], pa.int64()) for k in key}), buf)
        self.io.write_bytes(join(folder, f"e{epoch:012d}.parquet"), buf.getvalue())
        with _LOCK:
            self._active().add(target_hash(target.path))
        if not end:
            return None
        seen = [pq.read_table(_io.BytesIO(self.io.read_bytes(join(folder, n))))
                for n in sorted(self.io.list_names(folder)) if n.endswith(".parquet")]
        seen_keys = pa.concat_tables([s for s in seen if s.num_rows], promote_options="permissive") if any(
            s.num_rows for s in seen) else pa.table({})
        gone: dict[str, np.ndarray] = {}
        for f in state.files.values():
            url = f.relative_path if "://" in f.relative_path or f.relative_path.startswith("/") else target.url(f.relative_path)
            with target.io.fs.open(target.io.strip(url), "rb") as handle:
                keys_of_file = pq.read_table(handle, columns=list(key))
            positions = (np.arange(keys_of_file.num_rows, dtype=np.int64) if seen_keys.num_columns == 0
                         else positions_not_in(keys_of_file, seen_keys))
            positions = np.setdiff1d(positions, deleted_positions(target, f))
            if len(positions):
                gone[f.path] = positions
        return gone

    def finish(self, target: DeltaTarget) -> None:
        """The epoch with 'E' is in the table: forget the re-snapshot."""
        folder = join(self.root, target_hash(target.path))
        self.io.delete_many([join(folder, n) for n in self.io.list_names(folder)])
        self.io.remove_empty_dirs(folder)
        with _LOCK:
            self._active().discard(target_hash(target.path))

