"""PostgreSQL helpers for tests: a counting ``flinkish.postgres`` source, and the checkpoint of Spark's last commit.

``flinkish.testing.pgcounting`` takes the options of the ``flinkish.postgres`` source plus
``readLog`` (a local directory): each ``read(split, start, end)`` on an executor creates
one file there, so a test can prove which chunks were (not) read again after a restart.
After logging, a read passes the crash point ``pgcounting.read`` (``FLINKISH_CRASH_AT=
pgcounting.read:4`` kills the run as the fourth split read begins, whichever process runs it).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.connectors.postgres.source import PostgresReader, PostgresSourceDataSource
from flinkish_spark.faults import crash_point
from flinkish_spark.options import Options
from flinkish_spark.source.split import Split
from flinkish_spark.testing.spark_log import committed_batches


class CountingPostgresReader(PostgresReader):
    def __init__(self, source: "CountingPostgresSource", schema: StructType) -> None:
        super().__init__(source, schema)
        self.log_dir = source.read_log

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        os.makedirs(self.log_dir, exist_ok=True)
        open(os.path.join(self.log_dir, f"{split.split_id}@{start}@{end}@{uuid.uuid4().hex[:8]}"), "w").close()
        crash_point("pgcounting.read")
        yield from super().read(split, start, end)


class CountingPostgresSource(PostgresSourceDataSource):
    KIND = "flinkish.testing.pgcounting"
    EXTRA_OPTIONS = PostgresSourceDataSource.EXTRA_OPTIONS + ("readLog",)

    def configure(self, opts: Options) -> None:
        super().configure(opts)
        self.read_log = opts.required("readLog", "a local directory where reads are logged")

    def create_reader(self, schema: StructType) -> CountingPostgresReader:
        return CountingPostgresReader(self, schema)


def pg_read_log(log_dir: str) -> list[tuple[str, int, int]]:
    out = []
    for name in os.listdir(log_dir) if os.path.isdir(log_dir) else []:
        split, start, end, _ = name.split("@")
        out.append((split, int(start), int(end)))
    return sorted(out)


def register_postgres_test_sources(spark: Any) -> None:
    spark.dataSource.register(CountingPostgresSource)


def committed_checkpoint(checkpoint_location: str, meta_root: str, uid: str) -> Any:
    """The source checkpoint of Spark's last committed batch (None before the first commit)."""
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.source.offset import SourceOffset

    done = committed_batches(checkpoint_location)
    if not done:
        return None
    with open(os.path.join(checkpoint_location, "offsets", str(max(done)))) as f:
        lines = f.read().splitlines()
    for line in lines[2:]:
        off = SourceOffset.from_json(line)
        if off is not None and off.uid == uid:
            if off.ckpt < 0:
                return None
            return SourceCheckpointStore(FileIO.for_url(meta_root), meta_root, uid, kind="").read(off.ckpt)
    return None
