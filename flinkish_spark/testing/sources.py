"""Sources for tests: a sequence whose reader logs every read, to prove what was (not) re-read.

``flinkish.testing.counting`` takes the options of ``flinkish.sequence`` plus
``readLog`` (a local directory). Each ``read(split, start, end)`` on an
executor creates one file there named ``<split>-<start>-<end>-<random>``, so a
test can list exactly which ranges Spark asked the reader for, across
processes and restarts. It doubles as the worked example of a custom source.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.connectors.sequence import SequenceDataSource, SequenceReader
from flinkish_spark.options import Options
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split


class CountingReader(SplitReader):
    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.inner = SequenceReader()

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        os.makedirs(self.log_dir, exist_ok=True)
        name = f"{split.split_id}-{start}-{end}-{uuid.uuid4().hex[:8]}"
        open(os.path.join(self.log_dir, name), "w").close()
        yield from self.inner.read(split, start, end)


class CountingSequenceDataSource(SequenceDataSource):
    KIND = "flinkish.testing.counting"
    EXTRA_OPTIONS = SequenceDataSource.EXTRA_OPTIONS + ("readLog",)

    def configure(self, opts: Options) -> None:
        super().configure(opts)
        self.read_log = opts.required("readLog", "a local directory where reads are logged")

    def create_reader(self, schema: StructType) -> CountingReader:
        return CountingReader(self.read_log)


def read_log(log_dir: str) -> list[tuple[str, int, int]]:
    """The (split, start, end) ranges logged in ``log_dir``, sorted."""
    out = []
    for name in os.listdir(log_dir) if os.path.isdir(log_dir) else []:
        split, start, end, _ = name.rsplit("-", 3)
        out.append((split, int(start), int(end)))
    return sorted(out)


def register_test_sources(spark: Any) -> None:
    spark.dataSource.register(CountingSequenceDataSource)
