"""What the shared key lookup (:mod:`flinkish_spark.connectors.lakehouse.key_lookup`) needs to know
of an Iceberg snapshot: its live data files as candidates, and which of their rows are deleted.

* **Live files** -- the data and position delete files of the snapshot, from its manifests
  (a manifest is immutable: its entries are cached per path, so an epoch reads only the
  manifests it has not seen).
* **Candidates** -- each live data file with the lower/upper bounds of the first key
  column from its manifest entry: the lookup skips files whose range misses every key. A
  file written before ``int -> long`` / ``float -> double`` keeps 4-byte bounds, which the
  spec reads as the wider type: :func:`key_bound` decodes by the stored width (pyiceberg
  before 0.12 decoded them as 8 bytes and failed).
* **Deleted positions** -- the position delete files that apply to a data file, by
  pyiceberg's own reader rule (:class:`pyiceberg.table.delete_file_index.DeleteFileIndex`:
  same partition, sequence number >= the data file's, ``file_path`` bounds), read only
  for files that hold a changed key, and cached per delete file (immutable too).

A table with equality delete files cannot be looked up (pyiceberg does not read them
either): :class:`~flinkish_spark.errors.TableMismatchError`.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from flinkish_spark.connectors.iceberg.deletes import read_positions
from flinkish_spark.connectors.lakehouse.key_lookup import CandidateFile
from flinkish_spark.errors import TableMismatchError
from flinkish_spark.io.fileio import FileIO


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


_INT, _FLOAT = struct.Struct("<i"), struct.Struct("<f")  # Iceberg's single-value encoding of int and float
_ENTRIES = _Lru(64 * 1024 * 1024)
_DELETED = _Lru(128 * 1024 * 1024)


@dataclass(frozen=True)
class LiveFile:
    entry: Any  # pyiceberg ManifestEntry (data_file, sequence_number)
    manifest: str  # the manifest that lists it (what a removal rewrites)

    @property
    def path(self) -> str:
        return str(self.entry.data_file.file_path)

    @property
    def partition(self) -> tuple[Any, ...]:
        record = self.entry.data_file.partition
        return tuple(record[i] for i in range(len(record))) if record is not None else ()

    @property
    def spec_id(self) -> int:
        return int(self.entry.data_file.spec_id or 0)


class LiveFiles:
    """The live data and position delete files of one snapshot."""

    def __init__(self, table: Any, snapshot: Any | None = None, empty: bool = False) -> None:
        """``empty``: no live file (what an epoch that truncates the table looks its keys up in)."""
        from pyiceberg.manifest import DataFileContent, ManifestContent
        from pyiceberg.table.delete_file_index import DeleteFileIndex

        snapshot = None if empty else snapshot if snapshot is not None else table.current_snapshot()
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
        self.by_path = {f.path: f for f in self.data}

    def deletes_for(self, f: LiveFile) -> list[str]:
        """Paths of the position delete files that apply to the data file ``f``."""
        found = self._index.for_data_file(f.entry.sequence_number or 0, f.entry.data_file,
                                          partition_key=f.entry.data_file.partition)
        return sorted(d.file_path for d in found)

    def deleted(self, io: FileIO, f: LiveFile) -> np.ndarray:
        """The sorted positions of ``f`` that its delete files remove."""
        parts = [_DELETED.get(d, _loader(_read_deleted, io, d)).get(f.path) for d in self.deletes_for(f)]
        found = [p for p in parts if p is not None and len(p)]
        return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)

    def candidates(self, io: FileIO, key_field: Any) -> list[CandidateFile]:
        """The live data files for the shared lookup, with the bounds of the first key column."""
        out = []
        for f in self.data:
            d = f.entry.data_file
            lo, hi = (d.lower_bounds or {}).get(key_field.field_id), (d.upper_bounds or {}).get(key_field.field_id)
            lower = key_bound(key_field.field_type, lo) if lo is not None else None
            upper = key_bound(key_field.field_type, hi) if hi is not None else None
            out.append(CandidateFile(f.path, f.path, int(d.file_size_in_bytes), lower, upper,
                                     _deleted_of(self, io, f)))
        return out


def key_bound(field_type: Any, raw: bytes) -> Any:
    """A manifest bound as a value of the column's current type. A ``long`` / ``double`` bound of 4 bytes
    is from a file written while the column was ``int`` / ``float`` (Iceberg's promotions keep the files):
    decoded by its width, whatever pyiceberg's ``from_bytes`` does with it."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import DoubleType, LongType

    if len(raw) == 4 and isinstance(field_type, LongType):
        return _INT.unpack(raw)[0]
    if len(raw) == 4 and isinstance(field_type, DoubleType):
        return _FLOAT.unpack(raw)[0]
    return from_bytes(field_type, raw)


def _deleted_of(live: LiveFiles, io: FileIO, f: LiveFile) -> Callable[[], np.ndarray]:
    return lambda: live.deleted(io, f)


def _loader(read: Callable[[Any, Any], tuple[Any, int]], io: Any, what: Any) -> Callable[[], tuple[Any, int]]:
    return lambda: read(io, what)


def _entries(io: Any, manifest: Any) -> tuple[list[Any], int]:
    entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
    return entries, 1024 + 512 * len(entries)


def _read_deleted(io: FileIO, path: str) -> tuple[dict[str, np.ndarray], int]:
    rows = read_positions(io, [path])
    out: dict[str, np.ndarray] = {}
    for part in rows.group_by("file_path").aggregate([("pos", "list")]).to_pylist():
        out[part["file_path"]] = np.asarray(part["pos_list"], dtype=np.int64)
    return out, 64 + sum(len(k) + v.nbytes for k, v in out.items())
