"""Iceberg data files written by tasks, and their manifest descriptions.

A task writes Parquet files with the table's field ids (so readers resolve columns by id)
below ``<table location>/data/flinkish/<uid>/e<epoch>/[k=v/]`` and describes each one as an
:class:`IcebergFile`: path, size, partition values and the column statistics of the
Parquet footer (record count, value/null counts, lower/upper bounds) -- what the driver
needs to build its manifest entry, and what key lookups prune candidate files by. No
manifest names a file yet, so no reader sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa

from flinkish_spark.connectors.iceberg.table import TableInfo
from flinkish_spark.connectors.lakehouse.files import WrittenFile, epoch_dir, write_files
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.protocol import PrepareContext

DATA_PREFIX = "data/flinkish"


@dataclass(frozen=True)
class IcebergFile:
    """One prepared data file: everything the driver needs to build its manifest entry."""

    path: str
    size: int
    partition: tuple[Any, ...]  # Iceberg's internal values, in partition spec order
    statistics: tuple[tuple[str, Any], ...]  # DataFileStatistics.to_serialized_dict() items
    content: int = 0  # 0 data, 1 position deletes (pyiceberg's DataFileContent)


def epoch_folder(info: TableInfo, uid: str, epoch: int) -> str:
    return epoch_dir(info.location.rstrip("/"), DATA_PREFIX, uid, epoch)


def write_data_files(io: FileIO, info: TableInfo, uid: str, batches: Iterator[pa.RecordBatch], ctx: PrepareContext,
                     partition_by: tuple[str, ...], rows_per_file: int, target_file_size: int,
                     prepare_table: Callable[[pa.Table], pa.Table] | None = None) -> list[IcebergFile]:
    """Write ``batches`` as Parquet data files of the table described by ``info``; describe them."""
    return [f for f, _ in _write(io, info, uid, batches, ctx, partition_by, rows_per_file, target_file_size,
                                 prepare_table)]


def write_located(io: FileIO, info: TableInfo, uid: str, rows: pa.Table, ctx: PrepareContext,
                  partition_by: tuple[str, ...], rows_per_file: int, target_file_size: int) -> list[tuple[IcebergFile, int]]:
    """Write ``rows`` -- grouped by partition already, i.e. each partition's rows contiguous -- as data files,
    each with the index of its first row in ``rows``: row ``r`` is at position ``r - first`` of its file.

    The file writer keeps each partition's rows in order and fills its files one after the
    other, so the files of a partition cover consecutive ranges of that partition's rows.
    """
    if not rows.num_rows:
        return []
    starts: dict[tuple[Any, ...], int] = {}
    if partition_by:
        for i, values in enumerate(zip(*[rows[c].to_pylist() for c in partition_by])):
            starts.setdefault(tuple(values), i)
    else:
        starts[()] = 0
    written = _write(io, info, uid, iter(rows.to_batches(max_chunksize=64 * 1024)), ctx, partition_by, rows_per_file,
                     target_file_size, None)
    out = []
    for f, w in written:
        key = tuple(v for _, v in w.partition)
        out.append((f, starts[key]))
        starts[key] += w.rows
    return out


def _write(io: FileIO, info: TableInfo, uid: str, batches: Iterator[pa.RecordBatch], ctx: PrepareContext,
           partition_by: tuple[str, ...], rows_per_file: int, target_file_size: int,
           prepare_table: Callable[[pa.Table], pa.Table] | None) -> list[tuple[IcebergFile, WrittenFile]]:
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
        schema_to_pyarrow,
    )
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

    schema = Schema.model_validate_json(info.schema_json)
    spec = PartitionSpec.model_validate_json(info.spec_json)
    target = schema_to_pyarrow(schema)  # carries the field ids readers resolve columns by

    def with_field_ids(table: pa.Table) -> pa.Table:
        if prepare_table is not None:
            table = prepare_table(table)
        return table.select(target.names).cast(target)

    written = write_files(io, epoch_folder(info, uid, ctx.epoch), batches, ctx, partition_by,
                          drop_partition_columns=False, rows_per_file=rows_per_file,
                          target_file_size=target_file_size, prepare_table=with_field_ids)
    properties = dict(info.properties)
    files = []
    for f in written:
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=f.metadata, stats_columns=compute_statistics_plan(schema, properties),
            parquet_column_mapping=parquet_path_to_id_mapping(schema))
        record = stats.partition(spec, schema)
        partition = tuple(record[i] for i in range(len(record))) if spec.fields else ()
        files.append((IcebergFile(f.url, f.size, partition, tuple(stats.to_serialized_dict().items())), f))
    return files


def to_data_file(f: IcebergFile, spec_id: int) -> Any:
    """The manifest's description of a prepared data or position delete file."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    return DataFile.from_args(
        content=DataFileContent(f.content), file_path=f.path, file_format=FileFormat.PARQUET, partition=Record(*f.partition),
        file_size_in_bytes=f.size, sort_order_id=None, spec_id=spec_id, equality_ids=None, key_metadata=None,
        **dict(f.statistics))
