"""The end-of-input watermark flush (Flink's MAX_WATERMARK at end of input), for Spark.

Spark's watermark is ``max(event time) - delay`` and only moves when rows arrive, so
with bounded input an append-mode event-time window that is still open at the end is
never emitted. A flinkish source with ``.option("watermarkColumn", "<col>")`` therefore
emits, once *every* source under its metadata root has ended (bounded end or drain),
one marker row whose ``<col>`` is :data:`END_OF_INPUT_TS` (all other columns null).
:func:`with_watermark` applies ``withWatermark`` and removes the marker right after it:
the marker moves the watermark past every window, and never reaches user output.

Guarantees: the marker is emitted exactly once per source (its emission is recorded in
Spark's offset log), only after all sources under the root have ended -- so an input
that ended early never makes another input's later rows late -- and only for sources
that opted in. Without :func:`with_watermark` the marker row *is* visible: use both.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

END_OF_INPUT_TS = datetime(9999, 12, 31, tzinfo=timezone.utc)
# Anything at or after this instant is treated as the marker (and as a flushed watermark).
MARKER_THRESHOLD = datetime(9000, 1, 1, tzinfo=timezone.utc)


def with_watermark(df: "DataFrame", column: str, delay: str) -> "DataFrame":
    """``df.withWatermark(column, delay)`` that flushes at end of input and drops the marker.

    Use it on a stream read with ``.option("watermarkColumn", column)``. Spark keeps
    this filter above the watermark node (a predicate on the event-time column is
    never pushed below it), so the marker still advances the watermark.
    """
    from pyspark.sql import functions as F

    col = F.col(column)
    return df.withWatermark(column, delay).where(col.isNull() | (col < F.lit(MARKER_THRESHOLD)))
