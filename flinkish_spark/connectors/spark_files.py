"""``flinkish_spark.files_sink``: exactly-once files written by Spark's own ``DataFrameWriter``.

The rows never pass through Python: only the decision and the visibility switch do.

* **Prepare** (a Spark job started from the driver, inside ``foreachBatch``):
  ``df.write.format(fmt).options(...).partitionBy(...).save(<path>/_flinkish_staging/<uid>/<epoch>/<token>)``
  -- any built-in file format, compression and partitioning exactly as Spark does them. The
  staging folder starts with ``_``, so Spark, pyarrow and DuckDB (``<path>/**/*.parquet``
  globs aside, see docs) skip it. Task retries and speculative attempts are Spark's own
  business there: its ``FileOutputCommitter`` (algorithm version 1, which this sink forces)
  moves only the one committed attempt of each task into the folder, at job commit. After the
  job succeeded, one listing of the folder gives the committable: the (staged, final) pairs of
  every data file (Spark's ``_SUCCESS``, ``.crc`` and other ``_``/``.`` files are left out).
* **Decide** (driver): the pairs are recorded in the decision log
  (:func:`flinkish_spark.sink.committer.commit_epoch`, put-if-absent).
* **Commit** (driver): each staged file moves to its recorded final name
  ``<path>/[k=v/]part-<epoch>-<n>-<uid><Spark's suffix, e.g. .snappy.parquet or .json.gz>``,
  concurrently (server-side copies on S3), as ``flinkish.parquet`` does
  (:class:`~flinkish_spark.connectors.parquet_sink.StagedFilesCommitter`).

Why commit is idempotent: the final names are fixed by the decision, a move of a file that
is already at its final name is skipped (one listing of the staging folder tells which are
left), and a batch that is decided or done never runs Spark's write again on replay -- so a
repeated commit or a replay can neither duplicate nor lose a file.
"""

from __future__ import annotations

import os
import posixpath
import re
import uuid
from typing import Any, Callable, ClassVar, Mapping, Sequence

from flinkish_spark.connectors.parquet_sink import STAGING, ParquetCommittable, StagedFile, StagedFilesCommitter
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.sink.committer import CommitResult
from flinkish_spark.sink.foreach_batch import transactional_with
from flinkish_spark.sink.lease import DEFAULT_TIMEOUT_S

FORMATS = ("parquet", "orc", "json", "csv", "text")
# Version 2 of Hadoop's FileOutputCommitter moves each task's files into the folder at task
# commit, so a task that dies midway through its commit can leave files that a retry writes
# again (MAPREDUCE-7282). Version 1 moves them only at job commit, after every task succeeded:
# the listing taken after the job is then exactly one attempt per task.
COMMITTER_ALGORITHM = "mapreduce.fileoutputcommitter.algorithm.version"
_FILE_COUNTER = re.compile(r"c\d+")


def is_data_file(relative: str) -> bool:
    """Whether Spark's reader would read ``relative`` (a path below the written folder).

    The rule of Spark's ``InMemoryFileIndex``: hidden are names starting with ``.`` and
    names starting with ``_`` that are not partition folders (``_SUCCESS``, ``_temporary``,
    ``_committed_*``, ``.part-*.crc``).
    """
    return not any(p.startswith(".") or (p.startswith("_") and "=" not in p) for p in relative.split("/"))


def final_name(relative: str, epoch: int, n: int, uid: str) -> str:
    """``k=v/part-<task>-<job uuid>.c000.snappy.parquet`` -> ``k=v/part-<epoch>-<n>-<uid>.snappy.parquet``.

    Spark's base name has no dot before its suffixes; the first of them is the file counter of
    the task (``c000``; ``-c000`` in older Sparks, part of the stem), the rest are the format's
    and compression's (``.snappy.parquet``, ``.json.gz``) and are kept as they are.
    """
    folder, base = posixpath.split(relative)
    suffixes = base.split(".")[1:]
    if suffixes and _FILE_COUNTER.fullmatch(suffixes[0]):
        suffixes = suffixes[1:]
    name = f"part-{epoch:012d}-{n:05d}-{uid}" + "".join(f".{s}" for s in suffixes)
    return f"{folder}/{name}" if folder else name


class SparkFilesSink(StagedFilesCommitter):
    """The commit half of :func:`files_sink`; the prepare half is :meth:`write_epoch`."""

    # Spark decides the file sizes (maxRecordsPerFile): a file may exceed S3's 5 GB
    # single-copy limit, so S3 moves use s3fs's copy, which switches to multipart there.
    small_files: ClassVar[bool] = False

    def __init__(self, io: FileIO, path: str, uid: str, fmt: str, partition_by: tuple[str, ...],
                 options: dict[str, str]) -> None:
        self.io = io
        self.path = path
        self.uid = uid
        self.format = fmt
        self.partition_by = partition_by
        self.options = options

    def committed_name(self) -> "re.Pattern[str]":
        return re.compile(rf"part-(\d{{12}})-\d{{5}}-{re.escape(self.uid)}(\..*)?")

    def write_epoch(self, df: Any, epoch: int) -> list[ParquetCommittable]:
        """Prepare: Spark writes ``df`` into a fresh staging folder; return what it wrote."""
        # A fresh folder per call: a replay of an undecided epoch by a new run never meets
        # the debris of the crashed run's job (cleanup removes that once the epoch is decided).
        target = f"{self.staging_dir(epoch)}/{uuid.uuid4().hex[:12]}"
        writer = df.write.format(self.format).options(**{**self.options, COMMITTER_ALGORITHM: "1"})
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.mode("error").save(target)  # "errorifexists" in Classic; Spark Connect knows only "error"
        committable = self.listed(target, epoch)
        return [committable] if committable.files else []

    def listed(self, target: str, epoch: int) -> ParquetCommittable:
        root = self.io.strip(target).rstrip("/")
        relative = sorted(p[len(root) + 1:] for p in self.io.find(target))
        data = [r for r in relative if is_data_file(r)]
        files = tuple(
            StagedFile(self.io.url(f"{root}/{r}"), f"{self.path}/{final_name(r, epoch, n, self.uid)}", 0)
            for n, r in enumerate(data)
        )
        return ParquetCommittable(files)


def check_spark_can_write(spark: Any, path: str) -> None:
    """Fail before anything is written when Spark's Hadoop layer has no file system for ``path``."""
    scheme = path.split("://", 1)[0].lower() if "://" in path else "file"
    if scheme == "file" or _hadoop_has(spark, scheme):
        return
    if scheme in ("s3", "s3n"):
        why = "Hadoop has no file system for 's3://' (with the S3A jars, Spark writes to s3a:// URLs)"
    elif scheme == "s3a":
        why = "the pyspark wheel has no S3A connector (hadoop-aws)"
    else:
        why = f"Hadoop has no FileSystem for the scheme {scheme!r}"
    raise ConfigError(
        f"files_sink(): Spark's own writer cannot reach {path!r}: {why}. Either add the S3A jars as "
        "jars/README.md describes and use an s3a:// path, or use the sink 'flinkish.parquet' "
        "(writeStream.format('flinkish.parquet'), or ParquetSink with flinkish_spark.transactional), "
        "which writes through fsspec and needs no jars. Nothing was written."
    )


def _hadoop_has(spark: Any, scheme: str) -> bool:
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: the server decides; its error will name the scheme
        return True
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, spark._jsc.hadoopConfiguration())
    except Exception:  # noqa: BLE001 - Py4JJavaError(UnsupportedFileSystemException) and kin
        return False
    return True


def files_sink(
    path: str,
    uid: str,
    checkpoint: str,
    format: str = "parquet",
    partitionBy: Sequence[str] | str | None = None,
    options: Mapping[str, str] | None = None,
    storage_options: Mapping[str, str] | None = None,
    lease_timeout: float = DEFAULT_TIMEOUT_S,
    on_commit: Callable[[CommitResult], None] | None = None,
    continue_after_epoch: int | None = None,
) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function that appends each batch to ``path`` exactly once, written by Spark.

    ``format``: parquet, orc, json, csv or text; ``options``: the format's writer options as
    for ``df.write`` (``compression``, ``maxRecordsPerFile``, ...); ``partitionBy``: Hive-style
    partition columns. ``checkpoint``: where the decision log lives (any fsspec URL, S3
    included); ``storage_options``: fsspec options for ``path`` and ``checkpoint``
    (``endpointUrl``, ``region``, ``storageOptions``). ``path`` must be reachable by Spark's
    Hadoop layer (local, ``file://``, HDFS, ``s3a://`` with the jars). ``continue_after_epoch``:
    as for :func:`~flinkish_spark.sink.foreach_batch.transactional` (after a reset checkpointLocation).

    Example::

        query = (df.writeStream
                 .foreachBatch(flinkish_spark.files_sink("/data/out", uid="orders", checkpoint="/data/meta",
                                                         format="json", partitionBy="day"))
                 .option("checkpointLocation", "/data/cp").start())
    """
    if format not in FORMATS:
        raise ConfigError(f"files_sink(): format must be one of {', '.join(FORMATS)}, got {format!r}")
    if not isinstance(path, str) or not path.strip():
        raise ConfigError("files_sink(): path must be a non-empty path or URL")
    columns = (partitionBy,) if isinstance(partitionBy, str) else tuple(partitionBy or ())
    if "://" not in path:
        path = os.path.abspath(path)  # Spark and FileIO must resolve a relative path alike
    path = path.rstrip("/")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        check_spark_can_write(active, path)
    opts = {k: str(v) for k, v in (options or {}).items()}
    io = FileIO.for_url(path, storage_options_from(dict(storage_options or {}), path), what="files_sink(): path")
    io.check_writable_root(path, "files_sink(): path")
    sink = SparkFilesSink(io, path, uid, format, columns, opts)
    checked: list[bool] = []

    def prepare(df: Any, epoch: int) -> list[ParquetCommittable]:
        if not checked:  # the sink was made before any session existed
            check_spark_can_write(df.sparkSession, path)
            checked.append(True)
        return sink.write_epoch(df, epoch)

    return transactional_with(sink, prepare, uid, checkpoint, storage_options, lease_timeout, on_commit,
                              continue_after_epoch)


__all__ = ["FORMATS", "STAGING", "SparkFilesSink", "check_spark_can_write", "files_sink"]
