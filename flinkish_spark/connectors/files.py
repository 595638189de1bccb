"""``flinkish.files``: files on any fsspec URL (local, S3) as a split source, one split per file.

Each file is one split of length 1: it is read whole in one epoch and is
finished from then on -- never read again, also across restarts. With
``bounded=true`` the file set is the one listed at the first epoch and the
source finishes when all of them are read; with ``bounded=false`` (the
default, as Spark's file source) new files are picked up on every trigger.

``cleanup=delete|archive`` removes or moves a file only after the epoch that
read it is committed (see :meth:`FilesEnumerator.on_checkpoint_complete`), so a
crash can never lose a file that is not yet in the sink.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Collection, Iterator, Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.options import Options
from flinkish_spark.source.datasource import SplitDataSource
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split, SplitExtent

FileFormat = Literal["parquet", "csv", "json"]
Cleanup = Literal["none", "delete", "archive"]
_GLOB_CHARS = "*?["


def base_dir(path: str) -> str:
    """The directory part of ``path`` before any glob character."""
    cut = min((path.index(c) for c in _GLOB_CHARS if c in path), default=None)
    if cut is None:
        return path.rstrip("/")
    return posixpath.dirname(path[:cut]).rstrip("/")


class FileLister:
    """Lists the data files of a path, a directory (recursively) or a glob; hidden files skipped."""

    def __init__(self, io: FileIO, path: str) -> None:
        self.io = io
        self.path = path

    def list(self) -> list[str]:
        if any(c in self.path for c in _GLOB_CHARS):
            found = self.io.glob(self.path)
        else:
            found = self.io.find(self.path)  # a directory's files, or the file itself
        return [self.io.url(p) for p in found if not posixpath.basename(p).startswith(("_", "."))]


class FilesEnumerator(SplitEnumerator):
    def __init__(self, source: "FilesDataSource") -> None:
        self.source = source
        self.discovered_once = False
        self.cleaned_through = -1

    def discover(self, known: Collection[str]) -> list[Split]:
        if self.source.bounded and self.discovered_once:
            return []
        self.discovered_once = True
        return [Split(p) for p in self.source.lister().list() if p not in known]

    def extent(self, split: Split, position: int) -> SplitExtent:
        return SplitExtent(1, 1)  # a file is read whole, in one epoch

    def no_more_splits(self) -> bool:
        return self.source.bounded and self.discovered_once

    def snapshot_state(self) -> bytes:
        return json.dumps({"discovered_once": self.discovered_once, "cleaned_through": self.cleaned_through}).encode()

    def restore(self, state: bytes) -> None:
        if state:
            d = json.loads(state)
            self.discovered_once = bool(d.get("discovered_once", False))
            self.cleaned_through = int(d.get("cleaned_through", -1))

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        if self.source.cleanup != "none":
            for rec in checkpoint.splits:
                if rec.finished and rec.finished_in is not None and self.cleaned_through < rec.finished_in <= checkpoint.ckpt_id:
                    self.source.clean_up(rec.split_id)
        self.cleaned_through = max(self.cleaned_through, checkpoint.ckpt_id)


class FilesReader(SplitReader):
    def __init__(self, source: "FilesDataSource", schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.source = source
        self.target = to_arrow_schema(schema, timezone="UTC")

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        if start >= end:
            return
        io = self.source.data_io
        fmt = self.source.format
        with io.open_input(split.split_id) as f:
            if fmt == "parquet":
                pf = pq.ParquetFile(f)
                names = [n for n in self.target.names if n in pf.schema_arrow.names]
                yield from pf.iter_batches(columns=names)
                return
            if fmt == "csv":
                table = pacsv.read_csv(
                    f,
                    read_options=pacsv.ReadOptions(
                        column_names=None if self.source.header else self.target.names,
                    ),
                    convert_options=pacsv.ConvertOptions(
                        column_types={fld.name: fld.type for fld in self.target},
                        include_columns=self.target.names if self.source.header else None,
                        include_missing_columns=True,
                    ),
                )
            else:
                table = pajson.read_json(
                    f, parse_options=pajson.ParseOptions(explicit_schema=self.target, unexpected_field_behavior="ignore")
                )
        yield from table.to_batches()


class FilesDataSource(SplitDataSource):
    """``spark.readStream.format("flinkish.files")``."""

    KIND = "flinkish.files"
    EXTRA_OPTIONS = ("path", "format", "bounded", "maxFilesPerTrigger", "cleanup", "archivePath", "header")

    def configure(self, opts: Options) -> None:
        self.path = opts.required("path", "the input files: a directory, a file or a glob (fsspec URL)").rstrip("/")
        self.format: FileFormat = opts.choice("format", ("parquet", "csv", "json"), "parquet")
        self.bounded = opts.boolean("bounded", False)
        self.max_files_per_trigger = opts.integer("maxFilesPerTrigger", None, minimum=1)
        self.cleanup: Cleanup = opts.choice("cleanup", ("none", "delete", "archive"), "none")
        self.header = opts.boolean("header", True)
        self.data_io = FileIO.for_url(self.path, storage_options_from(self.raw_options, self.path), what="option 'path'")
        archive = opts.get("archivePath")
        if self.cleanup == "archive":
            if not archive or not archive.strip():
                raise ConfigError(f"{opts.component}: cleanup=archive needs the option 'archivePath' (where read files are moved)")
            archive = archive.strip().rstrip("/")
            base = base_dir(self.path)
            if archive == base or archive.startswith(base + "/"):
                raise ConfigError(
                    f"{opts.component}: option 'archivePath' ({archive}) is inside the input path "
                    f"({self.path}); archived files would be read again. Choose a folder outside it."
                )
            if FileIO.for_url(archive, what="option 'archivePath'").protocol != self.data_io.protocol:
                raise ConfigError(f"{opts.component}: option 'archivePath' must be on the same storage as 'path'")
        elif archive:
            raise ConfigError(f"{opts.component}: option 'archivePath' is only used with cleanup=archive")
        self.archive_path = archive

    def config(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "bounded": self.bounded}

    def lister(self) -> FileLister:
        return FileLister(self.data_io, self.path)

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        recorded = self.recorded_schema()
        if recorded is not None:
            return recorded
        files = self.lister().list()
        if not files:
            raise ConfigError(
                f"{self.name()} source: cannot infer a schema: no files under {self.path!r} yet. "
                "Pass one with spark.readStream.schema(...)."
            )
        first = files[0]
        with self.data_io.open_input(first) as f:
            if self.format == "parquet":
                arrow_schema = pq.read_schema(f)
            elif self.format == "csv":
                arrow_schema = pacsv.read_csv(
                    f, read_options=pacsv.ReadOptions(autogenerate_column_names=not self.header)
                ).schema
            else:
                arrow_schema = pajson.read_json(f).schema
        return from_arrow_schema(arrow_schema.remove_metadata())

    def default_read_limit(self) -> ReadLimit:
        if self.max_files_per_trigger is not None:
            return ReadMaxFiles(self.max_files_per_trigger)
        return ReadAllAvailable()

    def create_enumerator(self) -> FilesEnumerator:
        return FilesEnumerator(self)

    def create_reader(self, schema: StructType) -> FilesReader:
        return FilesReader(self, schema)

    def clean_up(self, url: str) -> None:
        """Delete or archive one fully read file; idempotent (a file already gone is skipped)."""
        if not self.data_io.exists(url):
            return
        if self.cleanup == "delete":
            self.data_io.delete(url)
        elif self.cleanup == "archive":
            assert self.archive_path is not None
            base = self.data_io.strip(base_dir(self.path))
            rel = posixpath.relpath(self.data_io.strip(url), base) if base else posixpath.basename(url)
            if rel.startswith(".."):
                rel = posixpath.basename(url)
            try:
                self.data_io.move(url, f"{self.archive_path}/{rel}")
            except FileNotFoundError:
                # A second notification for the same epoch (the commit notification and the final
                # one can both cover the last epoch) moved it first: gone from the input is the goal.
                if self.data_io.exists(url):
                    raise
