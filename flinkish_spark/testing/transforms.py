"""DataFrame transforms for pipeline specs (``"map": ["flinkish_spark.testing.transforms:..."]``).

They inject task failures into the Spark job that writes a batch, for sinks whose rows never
pass through flinkish code (:func:`flinkish_spark.files_sink`), or make batches slow.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

import pyarrow as pa

from flinkish_spark.faults import fail_point

POINT = "spark_files.task"


def fail_midway(df: Any) -> Any:
    """Pass ``df`` through a ``mapInArrow`` that calls ``fail_point("spark_files.task")`` after
    the first half of each task's first batch went to the writer (``FLINKISH_FAIL_AT`` arms it),
    so a failing attempt has begun to write its file when it fails."""

    def through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        first = True
        for batch in batches:
            if first and batch.num_rows > 1:
                half = batch.num_rows // 2
                yield batch.slice(0, half)
                fail_point(POINT, attempt=attempt)
                yield batch.slice(half)
            else:
                yield batch
            first = False

    return df.mapInArrow(through, df.schema)


SLOW_TASK_ENV = "FLINKISH_TASK_SECONDS"


def slow_tasks(df: Any) -> Any:
    """Pass ``df`` through a ``mapInArrow`` whose every task first sleeps ``FLINKISH_TASK_SECONDS``
    (default 3): batches that last longer than a lease timeout, whatever the source."""
    seconds = float(os.environ.get(SLOW_TASK_ENV, "3"))

    def through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        time.sleep(seconds)
        yield from batches

    return df.mapInArrow(through, df.schema)


def windowed_counts(df: Any) -> Any:
    """Rows per 10-second event-time window of ``ts`` (a flinkish.sequence with ``watermarkColumn=ts``),
    through :func:`flinkish_spark.with_watermark`: ``start timestamp, n long``, append mode."""
    from pyspark.sql import functions as F

    from flinkish_spark.finish.watermark import with_watermark

    return (with_watermark(df, "ts", "5 seconds").groupBy(F.window("ts", "10 seconds"))
            .agg(F.count("*").alias("n")).select(F.col("window.start").alias("start"), "n"))
