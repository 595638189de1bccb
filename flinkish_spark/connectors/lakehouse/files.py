"""Data files for the lakehouse sinks (``flinkish.delta``, ``flinkish.iceberg``).

Both table formats commit by naming data files in a log (Delta's ``_delta_log``, an
Iceberg manifest): a file no committed version names is invisible to every reader.
So the executors write Parquet files straight to their final place below the table --
no staging copy as in ``flinkish.parquet`` -- and the driver's commit only appends
their names to the table's log.

Every file of one sink uid and epoch lives below one deterministic folder,
``<table>/<prefix>/<uid>/e<epoch, 12 digits>/``, whatever its partition: a sink's
cleanup lists that folder alone (O(files of the epoch), never the whole table) to
delete files that failed task attempts or crashed runs left behind.

This module also maps the project's storage options into each library's form in one
place (:func:`delta_storage_options`, :func:`iceberg_io_properties`).
"""

from __future__ import annotations

import posixpath
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.connectors.parquet_sink import ROW_GROUP_ROWS, dictionary_columns
from flinkish_spark.errors import EnvironmentSetupError
from flinkish_spark.faults import fail_point
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.protocol import PrepareContext

DEFAULT_ROWS_PER_FILE = 1_000_000
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024


def small_file_rows(rows_per_file: int) -> int:
    """A data file of fewer rows is small: the compactions (Delta and Iceberg alike) merge two or more of them."""
    return max(1, rows_per_file // 4)


def require(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or fail with the one line that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise EnvironmentSetupError(
            f"{what} needs the Python package {module.split('.')[0]!r}, which is not installed "
            f"in this interpreter ({exc}). Install it with: pip install 'flinkish_spark[{extra}]' "
            "(on the driver and every executor)."
        ) from None


def epoch_dir(table: str, prefix: str, uid: str, epoch: int) -> str:
    return f"{table.rstrip('/')}/{prefix}/{uid}/e{epoch:012d}"


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file written by a task: where, how large, and what it holds."""

    url: str  # full URL (or local path) as the FileIO wrote it
    size: int
    rows: int
    partition: tuple[tuple[str, Any], ...]  # (column, Python value) in partition order
    metadata: Any  # pyarrow.parquet.FileMetaData (executor side only: never pickled)


def write_files(
    io: FileIO,
    directory: str,
    batches: Iterator[pa.RecordBatch],
    ctx: PrepareContext,
    partition_by: tuple[str, ...],
    drop_partition_columns: bool,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    prepare_table: Callable[[pa.Table], pa.Table] | None = None,
    compression: str = "snappy",
) -> list[WrittenFile]:
    """Write a task's rows as Parquet files below ``directory``, split by partition value.

    Names are ``<partition>-<attempt>-<random>-<n>.parquet`` in ``[k=v/]`` sub-folders:
    two attempts of one task never collide, and a reader that takes partitions from
    folder names (DuckDB's hive_partitioning) agrees with the table's log.
    """
    token = uuid.uuid4().hex[:8]
    writers: dict[tuple[tuple[str, Any], ...], _FileWriter] = {}
    done: list[WrittenFile] = []
    counter = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        for key, piece in _split(batch, partition_by):
            if drop_partition_columns and partition_by:
                piece = piece.drop_columns(list(partition_by))
            offset = 0
            while offset < piece.num_rows:
                w = writers.get(key)
                if w is None or w.full(rows_per_file, target_file_size):
                    if w is not None:
                        done.append(w.close())
                    sub = "/".join(f"{c}={_path_value(v)}" for c, v in key)
                    folder = f"{directory}/{sub}" if sub else directory
                    url = f"{folder}/{ctx.partition_id:05d}-{ctx.attempt}-{token}-{counter:04d}.parquet"
                    counter += 1
                    w = _FileWriter(io, url, key, compression, prepare_table)
                    writers[key] = w
                take = min(piece.num_rows - offset, max(1, rows_per_file - w.rows))
                w.write(piece.slice(offset, take))
                offset += take
                fail_point("sink.write", attempt=ctx.attempt)
    done.extend(w.close() for w in writers.values())
    return [f for f in done if f.rows > 0]


def write_grouped(io: FileIO, directory: str, table: pa.Table, names: Callable[[int], str], partition_by: tuple[str, ...],
                  rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE
                  ) -> tuple[list[tuple[WrittenFile, int]], np.ndarray | None]:
    """:func:`write_table` per partition of ``partition_by`` (below ``k=v/``; the partition columns stay in the
    files): the rows grouped by partition -- a stable sort, each partition's rows in their order -- and written
    group after group. Returns the files with the index of their first row among the *grouped* rows, and the
    grouping (grouped row i is ``table`` row ``order[i]``; None: no partitions, the table's own order)."""
    if not partition_by or table.num_rows == 0:
        return write_table(io, directory, table, names, rows_per_file, target_file_size), None
    order = pc.sort_indices(table, sort_keys=[(c, "ascending", "at_start") for c in partition_by])  # stable
    grouped = table.take(order)
    values = list(zip(*[grouped.column(c).to_pylist() for c in partition_by]))
    out: list[tuple[WrittenFile, int]] = []
    start, n = 0, 0
    for end in range(1, len(values) + 1):
        if end < len(values) and values[end] == values[start]:
            continue
        key = tuple(zip(partition_by, values[start]))
        for w, first in write_table(io, directory, grouped.slice(start, end - start), lambda i: names(n + i),
                                    rows_per_file, target_file_size, partition=key):
            out.append((w, start + first))
            n += 1
        start = end
    return out, np.asarray(order.to_numpy(), dtype=np.int64)


def write_table(io: FileIO, directory: str, table: pa.Table, names: Callable[[int], str], rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                target_file_size: int = DEFAULT_TARGET_FILE_SIZE, compression: str = "snappy",
                partition: tuple[tuple[str, Any], ...] = ()) -> list[tuple[WrittenFile, int]]:
    """Write ``table`` (unpartitioned) in its row order as consecutive files ``directory/names(i)``.

    Returns each file with the index of its first row in ``table``: row ``r`` of ``table``
    is at position ``r - start`` of its file -- what a keyed commit needs to address the
    rows it wrote. A file holds at most ``rows_per_file`` rows, and about
    ``target_file_size`` bytes (estimated from the rows' in-memory size, an upper bound).
    """
    out: list[tuple[WrittenFile, int]] = []
    if table.num_rows == 0:
        return out
    row_bytes = max(1, table.nbytes // table.num_rows)
    per_file = max(1, min(rows_per_file, target_file_size // row_bytes))
    for i, start in enumerate(range(0, table.num_rows, per_file)):
        sub = "/".join(f"{c}={_path_value(v)}" for c, v in partition)  # rows of one partition (write_grouped)
        w = _FileWriter(io, f"{directory}/{sub}/{names(i)}" if sub else f"{directory}/{names(i)}", partition,
                        compression, None)
        piece = table.slice(start, per_file)
        for offset in range(0, piece.num_rows, ROW_GROUP_ROWS):
            w.write(piece.slice(offset, ROW_GROUP_ROWS))
        out.append((w.close(), start))
    return out


def read_positions(io: FileIO, url: str, positions: Any, columns: list[str] | None = None) -> pa.Table:
    """Rows at ``positions`` (sorted) of a Parquet file, reading only the row groups that hold them."""
    import numpy as np

    positions = np.asarray(positions, dtype=np.int64)
    with io.fs.open(io.strip(url), "rb") as handle:
        pf = pq.ParquetFile(handle)
        counts = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        bounds = np.cumsum([0] + counts)
        groups = sorted(set(np.searchsorted(bounds, positions, "right") - 1))
        if not groups:
            return pf.schema_arrow.empty_table() if columns is None else pf.schema_arrow.empty_table().select(columns)
        table = pf.read_row_groups(groups, columns=columns)
    # positions -> index within the concatenation of the groups read
    base = np.cumsum([0] + [counts[g] for g in groups])
    group_of = np.searchsorted(bounds, positions, "right") - 1
    local = positions - bounds[group_of] + base[np.searchsorted(groups, group_of)]
    return table.take(pa.array(local))


def _path_value(value: Any) -> str:
    return "__HIVE_DEFAULT_PARTITION__" if value is None else str(value).replace("/", "%2F")


def _split(batch: pa.RecordBatch, partition_by: tuple[str, ...]) -> Iterator[tuple[tuple[tuple[str, Any], ...], pa.Table]]:
    table = pa.Table.from_batches([batch])
    if not partition_by:
        yield (), table
        return
    for key in table.group_by(list(partition_by)).aggregate([]).to_pylist():
        mask = None
        for col, value in key.items():
            cond = pc.is_null(table[col]) if value is None else pc.equal(table[col], value)
            mask = cond if mask is None else pc.and_(mask, cond)
        yield tuple((c, key[c]) for c in partition_by), table.filter(mask)


class _FileWriter:
    """One data file, buffered into row groups of ``ROW_GROUP_ROWS`` (Spark hands over 10k-row batches)."""

    def __init__(self, io: FileIO, url: str, key: tuple[tuple[str, Any], ...], compression: str,
                 prepare_table: Callable[[pa.Table], pa.Table] | None) -> None:
        self.url, self.key = url, key
        io.makedirs(posixpath.dirname(io.strip(url)))
        self.handle = io.fs.open(io.strip(url), "wb")
        self.compression = compression
        self.prepare_table = prepare_table
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._buffered_bytes = 0

    def write(self, table: pa.Table) -> None:
        self._buffer.append(table)
        self._buffered += table.num_rows
        self._buffered_bytes += table.nbytes
        self.rows += table.num_rows
        if self._buffered >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        if self.prepare_table is not None:
            table = self.prepare_table(table)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.handle, table.schema, compression=self.compression,
                                           use_dictionary=dictionary_columns(table))
        self.writer.write_table(table, row_group_size=max(self._buffered, 1))
        self._buffer, self._buffered, self._buffered_bytes = [], 0, 0

    def full(self, rows_per_file: int, target_size: int) -> bool:
        return self.rows >= rows_per_file or self.handle.tell() + self._buffered_bytes >= target_size

    def close(self) -> WrittenFile:
        self._flush()
        assert self.writer is not None or self.rows == 0
        metadata = None
        if self.writer is not None:
            self.writer.close()
            metadata = self.writer.writer.metadata
        size = self.handle.tell()
        self.handle.close()
        return WrittenFile(self.url, size, self.rows, self.key, metadata)


# -- storage options, mapped once per library -----------------------------------------------


def delta_storage_options(fsspec_options: Mapping[str, Any]) -> dict[str, str]:
    """delta-rs (object_store) options for the fsspec options of :func:`storage_options_from`.

    Commits on S3 use conditional PUTs (``If-None-Match``), which S3, MinIO and moto
    support: two writers of one table cannot both create the same log version, without
    a DynamoDB lock. Credentials not given here come from the AWS environment variables,
    which delta-rs reads itself.
    """
    out: dict[str, str] = {}
    endpoint = fsspec_options.get("endpoint_url")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    region = (fsspec_options.get("client_kwargs") or {}).get("region_name")
    if region:
        out["AWS_REGION"] = str(region)
    for ours, theirs in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY"), ("token", "AWS_SESSION_TOKEN")):
        if fsspec_options.get(ours):
            out[theirs] = str(fsspec_options[ours])
    out["conditional_put"] = "etag"
    # An unreachable endpoint fails in seconds, not after object_store's 3-minute retry budget.
    out["connect_timeout"] = "5s"
    out["timeout"] = "60s"
    out["retry_timeout"] = "20s"
    return out


def iceberg_io_properties(fsspec_options: Mapping[str, Any]) -> dict[str, str]:
    """pyiceberg FileIO properties (``s3.*``) for the fsspec options of :func:`storage_options_from`."""
    out: dict[str, str] = {}
    endpoint = fsspec_options.get("endpoint_url")
    if endpoint:
        out["s3.endpoint"] = str(endpoint)
    region = (fsspec_options.get("client_kwargs") or {}).get("region_name")
    if region:
        out["s3.region"] = str(region)
    for ours, theirs in (("key", "s3.access-key-id"), ("secret", "s3.secret-access-key"), ("token", "s3.session-token")):
        if fsspec_options.get(ours):
            out[theirs] = str(fsspec_options[ours])
    out["s3.connect-timeout"] = "5"
    return out
