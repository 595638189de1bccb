"""Iceberg position delete files (format version 2): which rows of which data files are gone.

A position delete file is a Parquet file with the columns ``file_path`` (string, field id
2147483546) and ``pos`` (long, 2147483545, the 0-based row position in that data file),
sorted by ``file_path`` then ``pos``, as the spec asks. It belongs to one partition: a
reader applies it to the data files of that partition whose data sequence number is <=
its own, and whose path lies within its ``file_path`` bounds -- which we write exact (not
truncated), so a file that names one data file is matched to that file alone.

Reading them back (:func:`read_positions`) is what a key lookup needs to skip rows that
are already deleted.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.connectors.iceberg.datafiles import IcebergFile
from flinkish_spark.io.fileio import FileIO

PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
POSITION_DELETES = 1  # DataFileContent.POSITION_DELETES
SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(PATH_FIELD_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_FIELD_ID).encode()}),
])


def write_position_deletes(io: FileIO, folder: str, positions: pa.Table, partition: tuple[Any, ...],
                           name: str | None = None) -> IcebergFile:
    """Write one position delete file of ``positions`` (columns file_path, pos) below ``folder``."""
    table = positions.select(["file_path", "pos"]).cast(SCHEMA)
    table = table.sort_by([("file_path", "ascending"), ("pos", "ascending")])
    url = f"{folder.rstrip('/')}/{name or uuid.uuid4().hex}-deletes.parquet"
    io.makedirs(folder)
    with io.fs.open(io.strip(url), "wb") as handle:
        pq.write_table(table, handle, compression="zstd")
        size = handle.tell()
    return IcebergFile(url, size, partition, tuple(_statistics(table).items()), content=POSITION_DELETES)


def _statistics(table: pa.Table) -> dict[str, Any]:
    """The manifest's column statistics of a delete file: exact bounds, so readers can match it to its data files."""
    paths = table["file_path"]
    first, last = paths[0].as_py(), paths[-1].as_py()
    low, high = pc.min_max(table["pos"]).values()
    n = table.num_rows
    return {
        "record_count": n,
        "column_sizes": {},
        "value_counts": {PATH_FIELD_ID: n, POS_FIELD_ID: n},
        "null_value_counts": {PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
        "nan_value_counts": {},
        "lower_bounds": {PATH_FIELD_ID: first.encode(), POS_FIELD_ID: struct.pack("<q", low.as_py())},
        "upper_bounds": {PATH_FIELD_ID: last.encode(), POS_FIELD_ID: struct.pack("<q", high.as_py())},
        "split_offsets": None,
    }


def read_positions(io: FileIO, delete_files: Iterable[str]) -> pa.Table:
    """The (file_path, pos) rows of the position delete files at these paths."""
    tables = []
    for path in delete_files:
        with io.fs.open(io.strip(path), "rb") as handle:
            tables.append(pq.read_table(handle, columns=["file_path", "pos"]))
    if not tables:
        return SCHEMA.empty_table()
    return pa.concat_tables(tables).cast(SCHEMA)
