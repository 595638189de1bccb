"""What the tasks of a ``flinkish.delta`` epoch hand the driver, and how it is stored in the decision log.

* :class:`DeltaCommittable` (``mode=append``): the data files a task wrote, as their
  ``add`` actions will name them; stored as JSON.
* :class:`KeyedCommittable` (``mode=upsert|history``): the files, where each file's rows
  start among the task's rows, and the task's *entries* (Arrow IPC; see
  :mod:`flinkish_spark.connectors.lakehouse.resolve_task`); stored as ``FKD1`` + the length of a
  JSON header + the header + the IPC bytes. Entries larger than
  :data:`~flinkish_spark.connectors.lakehouse.entries_file.INLINE_MAX_BYTES` are in a file beside the
  task's data files instead (:mod:`flinkish_spark.connectors.lakehouse.entries_file`): stored as ``FKD2``
  + the length of the header + the header, which names the file (``"entries_file"``: path relative to
  the table root, size, rows, CRC-32), and no IPC bytes. ``FKD1`` records (also all records of versions
  before the entries files) are read as before.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.lakehouse.entries_file import EntriesFile, read_entries, table_of
from flinkish_spark.connectors.lakehouse.files import WrittenFile
from flinkish_spark.connectors.lakehouse.stats import column_stats

if TYPE_CHECKING:
    from flinkish_spark.io.fileio import FileIO

KEYED_MAGIC = b"FKD1"  # entries inline
KEYED_FILE_MAGIC = b"FKD2"  # entries in a file


@dataclass(frozen=True)
class DeltaFile:
    """One prepared data file, as its Delta add action will name it."""

    path: str  # relative to the table root
    size: int
    rows: int
    partition_values: tuple[tuple[str, str | None], ...]
    stats: str


@dataclass(frozen=True)
class DeltaCommittable:
    files: tuple[DeltaFile, ...]


@dataclass(frozen=True)
class KeyedCommittable:
    """One task's prepared rows (files, in row order) and its entries (Arrow IPC inline, or in ``entries_file``)."""

    partition: int
    files: tuple[DeltaFile, ...]
    starts: tuple[int, ...]  # first row of each file among the task's rows
    entries: bytes  # b"" when they are in ``entries_file``
    entries_file: EntriesFile | None = None

    def entries_table(self, io: "FileIO", table_path: str, epoch: int) -> pa.Table:
        if self.entries_file is not None:
            return read_entries(io, table_path, self.entries_file, epoch)
        return table_of(self.entries)

    def paths(self) -> set[str]:
        """What the task wrote, relative to the table root: the data files and the entries file."""
        return {f.path for f in self.files} | ({self.entries_file.path} if self.entries_file is not None else set())

    def locate(self, positions: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(file index, positions in that file, indexes into ``positions``) per file."""
        starts = np.asarray(self.starts, dtype=np.int64)
        which = np.searchsorted(starts, positions, "right") - 1
        for j in np.unique(which):
            sel = np.flatnonzero(which == j)
            yield int(j), positions[sel] - starts[j], sel


def encode_keyed(c: KeyedCommittable) -> bytes:
    fields: dict[str, Any] = {"partition": c.partition, "files": encode_files(c.files), "starts": list(c.starts)}
    if c.entries_file is not None:
        # A new magic: a version without entries files refuses the record instead of reading no entries.
        fields["entries_file"] = c.entries_file.to_json()
        header = json.dumps(fields).encode()
        return KEYED_FILE_MAGIC + struct.pack(">I", len(header)) + header
    header = json.dumps(fields).encode()  # byte for byte what versions before the entries files wrote
    return KEYED_MAGIC + struct.pack(">I", len(header)) + header + c.entries


def is_keyed(data: bytes) -> bool:
    return data[:4] in (KEYED_MAGIC, KEYED_FILE_MAGIC)


def decode_keyed(data: bytes) -> KeyedCommittable:
    magic = data[:4]
    if magic not in (KEYED_MAGIC, KEYED_FILE_MAGIC):
        raise ValueError(f"not a keyed flinkish.delta committable (starts with {magic!r})")
    (n,) = struct.unpack_from(">I", data, len(KEYED_MAGIC))
    start = len(KEYED_MAGIC) + 4
    header = json.loads(data[start:start + n])
    ref = header.get("entries_file")
    return KeyedCommittable(int(header["partition"]), decode_files(header["files"]), tuple(header["starts"]),
                            data[start + n:], None if ref is None else EntriesFile.from_json(ref))


def delta_files(io: "FileIO", table_path: str, written: list[WrittenFile]) -> tuple[DeltaFile, ...]:
    root = io.strip(table_path).rstrip("/") + "/"
    return tuple(
        DeltaFile(io.strip(f.url)[len(root):], f.size, f.rows,
                  tuple((c, partition_value(v)) for c, v in f.partition), delta_stats(f))
        for f in written
    )


def encode_files(files: tuple[DeltaFile, ...]) -> list[Any]:
    return [[f.path, f.size, f.rows, [list(p) for p in f.partition_values], f.stats] for f in files]


def decode_files(data: list[Any]) -> tuple[DeltaFile, ...]:
    return tuple(DeltaFile(p, s, r, tuple((c, v) for c, v in pv), st) for p, s, r, pv, st in data)


def partition_value(value: Any) -> str | None:
    """Delta's partition value serialisation (protocol: "Partition Value Serialization")."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def delta_stats(f: WrittenFile) -> str:
    """numRecords, nullCount and (where exact) minValues/maxValues from the Parquet footer."""
    mins, maxs, nulls = column_stats(f.metadata)
    return json.dumps({"numRecords": f.rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})
