"""Key lookup: where the live rows of an epoch's changed keys are (data file, row position).

This is the cost that decides a keyed commit, so it is kept to what the changes need:

1. **Candidates** -- the live data files of the snapshot (from its manifests; a manifest is
   immutable, so its entries are cached per path and each one is read once per process)
   whose lower/upper bounds of the key column(s) can hold one of the changed keys.
2. **Only the key columns** of a candidate are read, and kept per file path (data files
   are immutable too) in a process-wide cache with a byte budget: a single numeric key as
   a sorted array with its row order, so that finding k keys in an n-row file costs
   O(k log n), not O(n); other keys as an Arrow table (a hash join, O(n)).
3. **Rows already deleted** are left out: the position delete files that apply to a
   candidate (pyiceberg's own rule, :class:`pyiceberg.table.delete_file_index.DeleteFileIndex`:
   same partition, sequence number >= the data file's, file_path bounds) are read --
   cached per delete file -- only for candidates that hold a changed key.

Reads of uncached candidates run on a thread pool (pyarrow releases the GIL). A table
with equality delete files cannot be looked up (pyiceberg does not read them either):
:class:`~flinkish_spark.errors.TableMismatchError`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.connectors.iceberg.deletes import read_positions
from flinkish_spark.errors import TableMismatchError
from flinkish_spark.io.fileio import FileIO

DEFAULT_CACHE_BYTES = 512 * 1024 * 1024
THREADS = 8


class _Lru:
    """A byte-bounded LRU cache of immutable files' contents, shared by the threads of a process."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: Any, load: Callable[[], tuple[Any, int]]) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
        value, size = load()
        with self._lock:
            if key not in self._items and size <= self.budget:
                self._items[key] = (value, size)
                self._size += size
                while self._size > self.budget:
                    _, (_, dropped) = self._items.popitem(last=False)
                    self._size -= dropped
        return value


def _loader(read: Callable[[Any, Any], tuple[Any, int]], io: Any, what: Any) -> Callable[[], tuple[Any, int]]:
    return lambda: read(io, what)


_ENTRIES = _Lru(64 * 1024 * 1024)
_KEYS = _Lru(DEFAULT_CACHE_BYTES)
_DELETED = _Lru(128 * 1024 * 1024)


@dataclass(frozen=True)
class LiveFile:
    entry: Any  # pyiceberg ManifestEntry (data_file, sequence_number)
    manifest: str  # the manifest that lists it (what a removal rewrites)

    @property
    def path(self) -> str:
        return str(self.entry.data_file.file_path)


class LiveFiles:
    """The live data and position delete files of one snapshot."""

    def __init__(self, table: Any, snapshot: Any | None = None) -> None:
        from pyiceberg.manifest import DataFileContent, ManifestContent
        from pyiceberg.table.delete_file_index import DeleteFileIndex

        snapshot = snapshot if snapshot is not None else table.current_snapshot()
        self.snapshot_id = snapshot.snapshot_id if snapshot is not None else None
        self.data: list[LiveFile] = []
        self.deletes: list[LiveFile] = []
        self._index = DeleteFileIndex()
        io = table.io
        for m in snapshot.manifests(io) if snapshot is not None else []:
            entries = _ENTRIES.get(m.manifest_path, _loader(_entries, io, m))
            target = self.data if m.content == ManifestContent.DATA else self.deletes
            for entry in entries:
                if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                    raise TableMismatchError(
                        f"the Iceberg table {table.name()} has equality delete files (e.g. {entry.data_file.file_path}), "
                        "which flinkish cannot apply when it looks up keys (pyiceberg does not read them either). "
                        "Rewrite the table's data files first (Spark: CALL system.rewrite_data_files).")
                target.append(LiveFile(entry, m.manifest_path))
                if target is self.deletes:
                    self._index.add_delete_file(entry, partition_key=entry.data_file.partition)

    def deletes_for(self, f: LiveFile) -> list[str]:
        """Paths of the position delete files that apply to the data file ``f``."""
        found = self._index.for_data_file(f.entry.sequence_number or 0, f.entry.data_file,
                                          partition_key=f.entry.data_file.partition)
        return sorted(d.file_path for d in found)


def _entries(io: Any, manifest: Any) -> tuple[list[Any], int]:
    entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
    return entries, 1024 + 512 * len(entries)


def candidates(live: LiveFiles, key_fields: list[Any], keys: pa.Table) -> list[LiveFile]:
    """The live data files whose key bounds can hold one of ``keys`` (files without bounds always can)."""
    from pyiceberg.conversions import from_bytes

    ranges = []
    for field in key_fields:
        column = _internal(keys[field.name])
        low, high = pc.min_max(column).values()
        ranges.append((field, low.as_py(), high.as_py()))
    single = _sorted_numeric(keys[key_fields[0].name]) if len(key_fields) == 1 else None
    out = []
    for f in live.data:
        lower, upper = f.entry.data_file.lower_bounds or {}, f.entry.data_file.upper_bounds or {}
        keep = True
        for field, low, high in ranges:
            lo, hi = lower.get(field.field_id), upper.get(field.field_id)
            if lo is None or hi is None or low is None:
                continue
            lo_v, hi_v = from_bytes(field.field_type, lo), from_bytes(field.field_type, hi)
            if hi_v < low or lo_v > high:
                keep = False
                break
            if single is not None:  # any changed key within [lo, hi]?
                i = np.searchsorted(single, lo_v, side="left")
                keep = bool(i < len(single) and single[i] <= hi_v)
        if keep:
            out.append(f)
    return out


def _internal(column: Any) -> Any:
    """Values as Iceberg's bounds decode them: days for dates, microseconds for timestamps."""
    if pa.types.is_date(column.type):
        return column.cast(pa.int32())
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us")).cast(pa.int64())
    return column


def _sorted_numeric(column: Any) -> np.ndarray | None:
    t = column.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return None
    values = pc.drop_null(column)
    return np.sort(np.asarray(values.to_numpy(zero_copy_only=False)))


def find(io: FileIO, live: LiveFiles, key_fields: list[Any], keys: pa.Table, threads: int = THREADS) -> pa.Table:
    """The live rows holding one of ``keys``: a table of ``file_path``, ``pos`` and the key columns."""
    names = [f.name for f in key_fields]
    keys = keys.select(names)
    files = candidates(live, key_fields, keys) if keys.num_rows else []
    if len(files) > 1 and threads > 1:
        with ThreadPoolExecutor(max_workers=min(threads, len(files))) as pool:
            parts = list(pool.map(lambda f: _find_in(io, live, f, names, keys), files))
    else:
        parts = [_find_in(io, live, f, names, keys) for f in files]
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return pa.table({"file_path": pa.array([], pa.string()), "pos": pa.array([], pa.int64()),
                         **{n: pa.array([], keys.schema.field(n).type) for n in names}})
    return pa.concat_tables(parts)


def _find_in(io: FileIO, live: LiveFiles, f: LiveFile, names: list[str], keys: pa.Table) -> pa.Table:
    index = _KEYS.get((f.path, tuple(names)), lambda: _read_keys(io, f.path, names))
    if isinstance(index, tuple):  # one numeric key: sorted values and their row positions
        values, order = index
        wanted = np.unique(np.asarray(pc.drop_null(keys[names[0]]).to_numpy(zero_copy_only=False)))
        lo = np.searchsorted(values, wanted, side="left")
        hi = np.searchsorted(values, wanted, side="right")
        hits = np.nonzero(hi > lo)[0]
        if not len(hits):
            return _empty(names, keys)
        pos = np.concatenate([order[lo[i]:hi[i]] for i in hits])
        key_values = np.concatenate([np.repeat(wanted[i], hi[i] - lo[i]) for i in hits])
        found = pa.table({"pos": pa.array(pos, pa.int64()),
                          names[0]: pa.array(key_values).cast(keys.schema.field(names[0]).type)})
    else:
        wanted_keys = pa.table({n: keys[n].cast(index.schema.field(n).type) for n in names})
        joined = index.join(wanted_keys.group_by(names).aggregate([]), keys=names, join_type="inner")
        if not joined.num_rows:
            return _empty(names, keys)
        found = pa.table({"pos": joined["pos"], **{n: joined[n].cast(keys.schema.field(n).type) for n in names}})
    deleted = [_DELETED.get(d, _loader(_read_deleted, io, d)).get(f.path) for d in live.deletes_for(f)]
    gone = [d for d in deleted if d is not None and len(d)]
    if gone:
        found = found.filter(pc.invert(pc.is_in(found["pos"], pa.array(np.concatenate(gone)))))
    return found.add_column(0, "file_path", pa.array([f.path] * found.num_rows, pa.string()))


def _empty(names: list[str], keys: pa.Table) -> pa.Table:
    return pa.table({"file_path": pa.array([], pa.string()), "pos": pa.array([], pa.int64()),
                     **{n: pa.array([], keys.schema.field(n).type) for n in names}})


def _read_keys(io: FileIO, path: str, names: list[str]) -> tuple[Any, int]:
    with io.fs.open(io.strip(path), "rb") as handle:
        table = pq.read_table(handle, columns=names)
    if len(names) == 1:
        values = _sorted_numeric(table[names[0]]) is not None
        if values and table[names[0]].null_count == 0:
            array = np.asarray(table[names[0]].to_numpy())
            order = np.argsort(array, kind="stable")
            return (array[order], order), array.nbytes + order.nbytes
    table = table.append_column("pos", pa.array(np.arange(table.num_rows), pa.int64()))
    return table, table.nbytes


def _read_deleted(io: FileIO, path: str) -> tuple[dict[str, np.ndarray], int]:
    rows = read_positions(io, [path])
    out: dict[str, np.ndarray] = {}
    for part in rows.group_by("file_path").aggregate([("pos", "list")]).to_pylist():
        out[part["file_path"]] = np.asarray(part["pos_list"], dtype=np.int64)
    return out, 64 + sum(len(k) + v.nbytes for k, v in out.items())
