"""``flinkish.parquet``: an exactly-once Parquet sink on any fsspec URL (local disk, S3).

Prepare (executors) writes each task's rows to staging files
``<path>/_flinkish_staging/<uid>/<epoch>/<partition>-<attempt>-<random>-<n>.parquet.staged``:
invisible to Spark and pyarrow (they skip ``_``-prefixed folders) and to
``*.parquet`` globs (DuckDB), because of the folder and the suffix. Commit (driver)
moves each staged file to its final, deterministic name
``<path>/[k=v/]part-<epoch>-<partition>-<n>-<uid>.parquet`` -- an atomic rename on local
disk, a server-side copy then delete on S3 -- so no reader ever sees a half-written file,
and a repeated commit finds the final file in place and cannot duplicate it.
"""

from __future__ import annotations

import json
import posixpath
import re
import uuid
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.types import StructType

from flinkish_spark.errors import CommitFailedError, ConfigError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.options import Options
from flinkish_spark.sink.datasource import TwoPhaseCommitDataSource
from flinkish_spark.sink.protocol import CommitOutcome, EpochCommitter, PrepareContext, TwoPhaseCommitSink
from flinkish_spark.faults import crash_point, fail_point

STAGING = "_flinkish_staging"
STAGED_SUFFIX = ".parquet.staged"
DEFAULT_ROWS_PER_FILE = 1_000_000
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
# A file may overshoot its target by one Arrow batch: stay well below S3's 5 GB copy limit.
MAX_S3_TARGET_FILE_SIZE = 4 * 1024**3


def check_s3_target_file_size(io: FileIO, size: int, what: str, given: str) -> None:
    """Refuse a target file size that S3 could not make visible with one server-side copy."""
    if io.protocol == "s3" and size > MAX_S3_TARGET_FILE_SIZE:
        raise ConfigError(
            f"{what} must be at most 4GB on S3 (got {given}): a committed file is made visible "
            "with one server-side copy, which S3 allows up to 5 GB"
        )


_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


@dataclass(frozen=True)
class StagedFile:
    staged: str
    final: str
    rows: int


@dataclass(frozen=True)
class ParquetCommittable:
    files: tuple[StagedFile, ...]


def parse_size(opts: Options, name: str, default: int) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    text = raw.strip().lower().replace(" ", "")
    digits = text.rstrip("kmgb")
    unit = text[len(digits):]
    if not digits.isdigit() or unit not in _SIZE_UNITS or int(digits) <= 0:
        raise ConfigError(f"{opts.component}: option '{name}' must be a size such as 134217728, 128MB or 1GB, got {raw!r}")
    return int(digits) * _SIZE_UNITS[unit]


class StagedFilesCommitter(EpochCommitter[ParquetCommittable]):
    """Commit of staged files: each staged file moves to its final name recorded in the decision.

    Shared by ``flinkish.parquet`` (staged by Python tasks) and
    :mod:`flinkish_spark.connectors.spark_files` (staged by Spark's own writer). Subclasses
    set ``io``, ``path`` and ``uid``; staging lives in :meth:`staging_dir`.
    """

    io: FileIO
    path: str
    uid: str
    # Every staged file is below S3's 5 GB single-copy limit (one CopyObject per file).
    small_files: ClassVar[bool] = True

    def staging_dir(self, epoch: int) -> str:
        return f"{self.path}/{STAGING}/{self.uid}/{epoch:012d}"

    def committed_name(self) -> "re.Pattern[str]":
        """A committed file's base name for this uid; group 1 is its epoch."""
        return re.compile(rf"part-(\d{{12}})-\d{{5}}-\d{{4}}-{re.escape(self.uid)}\.parquet")

    def last_committed_epoch(self) -> int:
        """The newest epoch among this uid's committed file names below ``path`` (-1: none).

        One recursive listing of the output: asked only when the sink's metadata is missing or
        belongs to another query (see :mod:`flinkish_spark.sink.incarnation`).
        """
        pattern = self.committed_name()
        epochs = [int(m.group(1)) for p in self.io.find(self.path) if f"/{STAGING}/" not in p
                  for m in [pattern.fullmatch(p.rsplit("/", 1)[-1])] if m]
        return max(epochs, default=-1)

    # -- commit / abort (driver) -------------------------------------------------------------

    def commit(self, committables: list[ParquetCommittable], epoch: int) -> CommitOutcome:
        # One listing tells which staged files are still to move (a repeated commit finds
        # some or all of them moved already); requests stay O(files), never O(files^2).
        present = {self.io.strip(p) for p in self.io.find(self.staging_dir(epoch))}
        pending: list[tuple[str, str]] = []
        for c in committables:
            for f in c.files:
                if self.io.strip(f.staged) in present:
                    pending.append((f.staged, f.final))
                elif not self.io.exists(f.final):
                    raise CommitFailedError(
                        f"epoch {epoch} of sink uid {self.uid!r}: neither the staged file {f.staged} nor its "
                        f"final file {f.final} exists. The staging folder was cleaned by hand; the epoch's "
                        "data is lost from the sink and must be rewritten."
                    )
        if pending:
            self.io.move_many(pending[:1], small=self.small_files)
            crash_point("sink.mid_commit")  # some files visible, others not yet
            self.io.move_many(pending[1:], small=self.small_files)
        return "COMMITTED"

    def abort(self, committables: list[ParquetCommittable], epoch: int) -> None:
        self.io.delete_many([f.staged for c in committables for f in c.files])

    def cleanup(self, epoch: int, keep: list[ParquetCommittable]) -> None:
        staging = self.staging_dir(epoch)
        wanted = {self.io.strip(f.staged) for c in keep for f in c.files}
        leftovers = [p for p in self.io.find(staging) if p not in wanted]
        self.io.delete_many([self.io.url(p) for p in leftovers])
        self.io.remove_empty_dirs(staging)

    def encode(self, committable: ParquetCommittable) -> bytes:
        return json.dumps([asdict(f) for f in committable.files], sort_keys=True).encode()

    def decode(self, data: bytes) -> ParquetCommittable:
        return decode_committable(data)


class ParquetSink(StagedFilesCommitter, TwoPhaseCommitSink[ParquetCommittable]):
    def __init__(self, io: FileIO, path: str, uid: str, schema: StructType, partition_by: tuple[str, ...],
                 rows_per_file: int, target_file_size: int, compression: str) -> None:
        self.io = io
        self.path = path.rstrip("/")
        self.uid = uid
        self.partition_by = partition_by
        self.rows_per_file = rows_per_file
        self.target_file_size = target_file_size
        self.compression = compression
        self.file_names = [n for n in schema.fieldNames() if n not in partition_by]

    @classmethod
    def at(cls, path: str, uid: str, schema: StructType, partition_by: tuple[str, ...] = (),
           rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
           compression: str = "snappy", options: dict[str, str] | None = None) -> "ParquetSink":
        """A sink for :func:`flinkish_spark.transactional` (foreachBatch); options as the format's."""
        io = FileIO.for_url(path, storage_options_from(options or {}, path), what="path")
        check_s3_target_file_size(io, target_file_size, "ParquetSink.at(): target_file_size", str(target_file_size))
        io.check_writable_root(path, "path")
        return cls(io, path, uid, schema, tuple(partition_by), rows_per_file, target_file_size, compression)

    # -- prepare (executors) ---------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> ParquetCommittable | None:
        token = uuid.uuid4().hex[:8]
        writers: dict[str, _RollingWriter] = {}
        files: list[StagedFile] = []
        counter = 0

        def writer_for(part_dir: str, schema: pa.Schema) -> _RollingWriter:
            nonlocal counter
            w = writers.get(part_dir)
            if w is None or w.full(self.rows_per_file, self.target_file_size):
                if w is not None:
                    files.append(w.close())
                n = counter
                counter += 1
                staged = f"{self.staging_dir(ctx.epoch)}/{ctx.partition_id:05d}-{ctx.attempt}-{token}-{n:04d}{STAGED_SUFFIX}"
                final_dir = f"{self.path}/{part_dir}" if part_dir else self.path
                final = f"{final_dir}/part-{ctx.epoch:012d}-{ctx.partition_id:05d}-{n:04d}-{self.uid}.parquet"
                w = _RollingWriter(self.io, staged, final, schema, self.compression)
                writers[part_dir] = w
            return w

        for batch in batches:
            if batch.num_rows == 0:
                continue
            for part_dir, piece in self._split(batch):
                # Spark's batches carry its session time zone: write them as they come.
                columns = piece.select(self.file_names)
                offset = 0
                while offset < columns.num_rows:  # honour rowsPerFile inside large batches
                    w = writer_for(part_dir, columns.schema)
                    take = min(columns.num_rows - offset, max(1, self.rows_per_file - w.rows))
                    w.write(columns.slice(offset, take))
                    offset += take
                    fail_point("sink.write", attempt=ctx.attempt)
        files.extend(w.close() for w in writers.values())
        files = [f for f in files if f.rows > 0]
        return ParquetCommittable(tuple(files)) if files else None

    def _split(self, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
        if not self.partition_by:
            yield "", batch
            return
        table = pa.Table.from_batches([batch])
        keys = table.group_by(list(self.partition_by)).aggregate([]).to_pylist()
        for key in keys:
            mask = None
            for col, value in key.items():
                cond = pc.is_null(table[col]) if value is None else pc.equal(table[col], value)
                mask = cond if mask is None else pc.and_(mask, cond)
            part_dir = "/".join(f"{c}={'__HIVE_DEFAULT_PARTITION__' if key[c] is None else key[c]}" for c in self.partition_by)
            for piece in table.filter(mask).to_batches():
                yield part_dir, piece

def decode_committable(data: bytes) -> ParquetCommittable:
    return ParquetCommittable(tuple(StagedFile(**d) for d in json.loads(data)))


ROW_GROUP_ROWS = 256 * 1024
_DICTIONARY_SAMPLE = 65_536


def dictionary_columns(table: pa.Table) -> list[str]:
    """Columns worth dictionary encoding: at most half their sampled values distinct.

    pyarrow tries a dictionary for every column by default, which makes writing
    high-cardinality columns (ids, timestamps) about four times slower for no gain.
    """
    chosen = []
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_nested(column.type):
            continue
        sample = column.slice(0, _DICTIONARY_SAMPLE)
        if len(sample) and pc.count_distinct(sample).as_py() <= len(sample) // 2:
            chosen.append(name)
    return chosen


class _RollingWriter:
    """One staged file. Spark hands over small Arrow batches (10k rows by default):
    they are buffered into row groups of ``ROW_GROUP_ROWS`` -- one row group per Spark
    batch would make files slow to write and to read."""

    def __init__(self, io: FileIO, staged: str, final: str, schema: pa.Schema, compression: str) -> None:
        self.staged, self.final = staged, final
        self.io = io
        io.makedirs(posixpath.dirname(io.strip(staged)))
        self.handle = io.fs.open(io.strip(staged), "wb")
        self.schema = schema
        self.compression = compression
        self.writer: pq.ParquetWriter | None = None  # made at the first flush, when data is known
        self.rows = 0
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._buffered_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)
        self._buffered += batch.num_rows
        self._buffered_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self._buffered >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        table = pa.Table.from_batches(self._buffer)
        if self.writer is None:
            self.writer = pq.ParquetWriter(
                self.handle, self.schema, compression=self.compression, use_dictionary=dictionary_columns(table)
            )
        self.writer.write_table(table, row_group_size=max(self._buffered, 1))
        self._buffer, self._buffered, self._buffered_bytes = [], 0, 0

    def full(self, rows_per_file: int, target_size: int) -> bool:
        # Buffered bytes count as written: uncompressed, so files err on the small side.
        return self.rows >= rows_per_file or self.handle.tell() + self._buffered_bytes >= target_size

    def close(self) -> StagedFile:
        self._flush()
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.handle, self.schema, compression=self.compression)
        self.writer.close()
        self.handle.close()
        return StagedFile(self.staged, self.final, self.rows)


class ParquetSinkDataSource(TwoPhaseCommitDataSource):
    """``df.writeStream.format("flinkish.parquet")``."""

    KIND = "flinkish.parquet"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ("rowsPerFile", "targetFileSize", "partitionBy", "compression")

    def configure(self, opts: Options) -> None:
        self.path = opts.required("path", "where the Parquet files go (fsspec URL), e.g. .option('path', 's3://b/out')").rstrip("/")
        self.rows_per_file = opts.integer("rowsPerFile", DEFAULT_ROWS_PER_FILE, minimum=1) or DEFAULT_ROWS_PER_FILE
        self.target_file_size = parse_size(opts, "targetFileSize", DEFAULT_TARGET_FILE_SIZE)
        raw = opts.get("partitionBy") or ""
        self.partition_by = tuple(c.strip() for c in raw.split(",") if c.strip())
        self.compression = opts.choice("compression", ("snappy", "zstd", "gzip", "none"), "snappy")
        self.data_io = FileIO.for_url(self.path, storage_options_from(self.raw_options, self.path), what="option 'path'")
        check_s3_target_file_size(self.data_io, self.target_file_size, f"{opts.component}: option 'targetFileSize'",
                                  repr(opts.get("targetFileSize")))
        self.data_io.check_writable_root(self.path, "option 'path'")

    def sink(self, schema: StructType) -> ParquetSink:
        missing = [c for c in self.partition_by if c not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' names {missing}, which the query does not have ({schema.simpleString()})")
        if len(self.partition_by) == len(schema.fieldNames()):
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' cannot name every column")
        return ParquetSink(self.data_io, self.path, self.uid, schema, self.partition_by,
                           self.rows_per_file, self.target_file_size, self.compression)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        self.sink(schema)  # validate partitionBy against the schema before any task runs
        return super().streamWriter(schema, overwrite)
