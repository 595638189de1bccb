"""A keyed task's *entries* (its changed keys, see :mod:`.resolve`) in a file beside its data files.

Why: the entries travel from each task to the driver in the committable, and the driver records every
committable in the epoch's decision record. Inline, a 2 M-row transaction's entries (~40 bytes a row) were
copied through Spark's commit message, the record's encoding (base64 in JSON for routed sinks, Parquet) and
its decoding -- about 1 GiB of the driver's commit process. Above :data:`INLINE_MAX_BYTES` a task writes them
to ``<its data files' name stem>.entries.arrow`` (Arrow IPC stream, the same bytes that travelled inline) in
the epoch's folder of the table, and the committable carries only an :class:`EntriesFile`: the path, the size,
the row count and a CRC-32 of the bytes. Small entries stay inline: a file per task and changed table would
cost a PUT in the prepare and a GET in the commit of every epoch of a many-table mirror.

Guarantee (exactly once across kill -9 at any point, see docs/guarantees.md):

* the file is written, completely, before the task returns its committable (``write_bytes``: atomic rename on
  local disk, one PUT on an object store), under a name unique to the prepare (the data files' random token):
  a replay of the epoch never overwrites the file a decision names;
* the decision record names the file with its size and CRC: a restart that commits the decided epoch again
  reads the same file, and a missing, truncated or replaced one is refused (:class:`CorruptMetadataError`)
  rather than applied;
* the file is never named by the table: the epoch's cleanup (the sink's ``cleanup_epoch``, after the epoch is
  done) removes it with every other file of the epoch's folder that the table does not name -- the files of
  losing attempts, and the decided one, whose epoch no commit will read again.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flinkish_spark.errors import CorruptMetadataError
from flinkish_spark.io.fileio import FileIO

#: Entries (Arrow IPC bytes) up to this size travel inline in the committable; larger ones in a file.
INLINE_MAX_BYTES = 1 << 20
SUFFIX = ".entries.arrow"


@dataclass(frozen=True)
class EntriesFile:
    """Where a task's entries are, relative to the table root, and what the reader checks."""

    path: str  # relative to the table root (Delta), or a full URL (Iceberg: its data files are named so too)
    size: int
    rows: int
    crc32: int

    def to_json(self) -> list[Any]:
        return [self.path, self.size, self.rows, self.crc32]

    @classmethod
    def from_json(cls, data: list[Any]) -> "EntriesFile":
        path, size, rows, crc = data
        return cls(str(path), int(size), int(rows), int(crc))


def ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_of(data: bytes | pa.Buffer) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _url(root: str, path: str) -> str:
    return f"{root.rstrip('/')}/{path}" if root else path


def store_entries(io: FileIO, root: str, relative: str, entries: pa.Table,
                  inline_max: int | None = None) -> tuple[bytes, EntriesFile | None]:
    """(inline bytes, None) for small entries, else (b"", the file written at ``root``/``relative``; ``root`` "":
    ``relative`` is a URL)."""
    data = ipc_bytes(entries)
    if len(data) <= (INLINE_MAX_BYTES if inline_max is None else inline_max):
        return data, None
    io.write_bytes(_url(root, relative), data)
    return b"", EntriesFile(relative, len(data), entries.num_rows, zlib.crc32(data))


def read_entries(io: FileIO, root: str, ref: EntriesFile, epoch: int) -> pa.Table:
    """The entries a committable's file holds, checked against what the committable recorded."""
    url = _url(root, ref.path)
    hint = ("If no output of this epoch is visible in the table, delete the epoch's commit record (decisions/"
            f"{epoch:012d}.parquet below the sink's metadata) and restart to redo the epoch.")
    try:
        data = io.read_bytes(url)
    except FileNotFoundError:
        raise CorruptMetadataError(f"{url}: the key entries file that the commit record of epoch {epoch} names "
                                   f"is missing. {hint}") from None
    if len(data) != ref.size or zlib.crc32(data) != ref.crc32:
        raise CorruptMetadataError(f"{url}: the key entries file that the commit record of epoch {epoch} names has "
                                   f"{len(data)} bytes (CRC-32 {zlib.crc32(data):08x}), the record says {ref.size} "
                                   f"(CRC-32 {ref.crc32:08x}): truncated or replaced. {hint}")
    table = table_of(pa.py_buffer(data))
    if table.num_rows != ref.rows:
        raise CorruptMetadataError(f"{url}: {table.num_rows} key entries, the commit record of epoch {epoch} says "
                                   f"{ref.rows}. {hint}")
    return table
