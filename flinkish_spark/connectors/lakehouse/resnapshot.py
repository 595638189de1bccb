"""A re-snapshot (``_op`` 'B' ... 'E' after a lost slot) applied to a keyed lakehouse table: the keys it delivered.

The new snapshot shows every row that exists, not the rows deleted while no slot kept their
WAL. So from the epoch holding 'B' to the one holding 'E' the sink remembers the keys the
epochs upserted -- one small Parquet file per epoch in the sink's metadata,
``sinks/<uid>/resnapshot/<target hash>/e<epoch>.parquet`` (written before the epoch's commit,
the same bytes on a retry) -- and in the commit of the epoch holding 'E' the format deletes
every live row of the table whose key is not among them (:func:`positions_not_in` per data
file; Delta with deletion vectors, Iceberg with position deletes). Keys, not files: a key
rewritten during the re-snapshot (compaction, a copy-on-write rewrite) is still recognised.

Exactly once: the deletes are part of the epoch's one commit (the table's idempotence
record); a retry computes them again against the newest state. The remembered keys are
removed after the commit (left-overs of a crash there are removed at the next 'B').
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
from flinkish_spark.connectors.lakehouse.resolve_task import E_KIND, KIND_VERSION
from flinkish_spark.io.fileio import FileIO

_ACTIVE: dict[str, set[str]] = {}  # metadata folder -> target hashes with a re-snapshot under way
_LOCK = threading.RLock()  # re-entrant: step() adds under the lock that _active() takes


def target_hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def upserted_keys(entries: Sequence[pa.Table], key: tuple[str, ...]) -> pa.Table:
    """The keys the tasks wrote a row for (their resolve entries of kind VERSION)."""
    parts = [e.filter(pc.equal(e.column(E_KIND), KIND_VERSION)).select(list(key)) for e in entries]
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


class ResnapshotKeys:
    """The re-snapshots under way for the targets of one sink uid (files below ``directory``), by target name."""

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

    def active(self, target: str) -> bool:
        return target_hash(target) in self._active()

    def forget(self) -> None:
        """Drop this process's set of the targets under way (listed again when next asked): another process
        (a committer, :mod:`flinkish_spark.connectors.delta.committers`) may have begun or ended one."""
        with _LOCK:
            _ACTIVE.pop(self.root, None)

    def step(self, target: str, key: tuple[str, ...], entries: Sequence[pa.Table], begin: bool, end: bool,
             epoch: int) -> pa.Table | None:
        """Remember the epoch's upserted keys; at the end, every key the re-snapshot delivered (None before)."""
        folder = join(self.root, target_hash(target))
        if begin:
            stale = [join(folder, n) for n in self.io.list_names(folder) if n != f"e{epoch:012d}.parquet"]
            self.io.delete_many(stale)
        keys = upserted_keys(entries, key)
        buf = _io.BytesIO()
        pq.write_table(keys if keys.num_columns else pa.table({k: pa.array([], pa.int64()) for k in key}), buf)
        self.io.write_bytes(join(folder, f"e{epoch:012d}.parquet"), buf.getvalue())
        with _LOCK:
            self._active().add(target_hash(target))
        if not end:
            return None
        seen = [pq.read_table(_io.BytesIO(self.io.read_bytes(join(folder, n))))
                for n in sorted(self.io.list_names(folder)) if n.endswith(".parquet")]
        delivered = [s for s in seen if s.num_rows]
        return pa.concat_tables(delivered, promote_options="permissive") if delivered else pa.table({})

    def finish(self, target: str) -> None:
        """The epoch with 'E' is in the table: forget the re-snapshot."""
        folder = join(self.root, target_hash(target))
        self.io.delete_many([join(folder, n) for n in self.io.list_names(folder)])
        self.io.remove_empty_dirs(folder)
        with _LOCK:
            self._active().discard(target_hash(target))
