"""``flinkish.sequence``: a deterministic generator split into lanes, bounded or unbounded.

Split *k* emits ``seq`` = 0, 1, 2, ... with event time ``ts`` = 2024-01-01T00:00:00Z
+ ``seq`` seconds, so every output is checkable. With ``rowsPerSplit`` the
splits are bounded (one number for all, or a comma list, one per split) and
finish one by one; without it they never end. ``rowsPerSecond`` (total over all
splits) paces the generator; an unbounded sequence defaults to 1 row/s, like
Spark's rate source.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, ClassVar, Collection, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from flinkish_spark.errors import ConfigError
from flinkish_spark.options import Options
from flinkish_spark.source.datasource import SplitDataSource
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split, SplitExtent

SCHEMA = "split int, seq long, ts timestamp"
BASE_EVENT_TIME_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
BATCH_ROWS = 1 << 16
DEFAULT_SPLITS = 2
DEFAULT_UNBOUNDED_RATE = 1.0


class SequenceEnumerator(SplitEnumerator):
    def __init__(self, lengths: list[int | None], rows_per_second: float | None) -> None:
        self.lengths = lengths
        self.rate_per_split = None if rows_per_second is None else rows_per_second / len(lengths)
        self.start_ms: int | None = None

    def discover(self, known: Collection[str]) -> list[Split]:
        if self.start_ms is None:
            self.start_ms = int(time.time() * 1000)
        return [Split(str(k)) for k in range(len(self.lengths)) if str(k) not in known]

    def extent(self, split: Split, position: int) -> SplitExtent:
        end = self.lengths[int(split.split_id)]
        if self.rate_per_split is None:
            assert end is not None  # configure() gives unbounded sequences a rate
            return SplitExtent(end, end)
        assert self.start_ms is not None
        elapsed = max(0.0, time.time() - self.start_ms / 1000.0)
        produced = int(elapsed * self.rate_per_split)
        available = produced if end is None else min(produced, end)
        # Never report less than what was already read (clock steps back, restored state).
        return SplitExtent(max(available, position), end)

    def no_more_splits(self) -> bool:
        return True  # the lanes are fixed by the options

    def snapshot_state(self) -> bytes:
        return json.dumps({"start_ms": self.start_ms}).encode()

    def restore(self, state: bytes) -> None:
        if state:
            self.start_ms = json.loads(state).get("start_ms")


class SequenceReader(SplitReader):
    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        k = int(split.split_id)
        for lo in range(start, end, BATCH_ROWS):
            hi = min(end, lo + BATCH_ROWS)
            seq = np.arange(lo, hi, dtype=np.int64)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.full(hi - lo, k, dtype=np.int32)),
                    pa.array(seq),
                    pa.array(BASE_EVENT_TIME_US + seq * 1_000_000, pa.timestamp("us", tz="UTC")),
                ],
                names=["split", "seq", "ts"],
            )


class SequenceDataSource(SplitDataSource):
    """``spark.readStream.format("flinkish.sequence")``."""

    KIND = "flinkish.sequence"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ("splits", "rowsPerSplit", "rowsPerSecond", "maxRowsPerTrigger")

    def configure(self, opts: Options) -> None:
        lengths_raw = opts.get("rowsPerSplit")
        splits = opts.integer("splits", None, minimum=1)
        lengths: list[int | None]
        if lengths_raw is None or lengths_raw.strip() == "":
            lengths = [None] * (splits or DEFAULT_SPLITS)
        else:
            parts = [p.strip() for p in lengths_raw.split(",")]
            try:
                values = [int(p) for p in parts]
            except ValueError:
                raise ConfigError(
                    f"{opts.component}: option 'rowsPerSplit' must be a whole number or a comma list "
                    f"of them (one per split), got {lengths_raw!r}"
                ) from None
            if any(v < 0 for v in values):
                raise ConfigError(f"{opts.component}: option 'rowsPerSplit' must not be negative, got {lengths_raw!r}")
            if len(values) == 1:
                lengths = [values[0]] * (splits or DEFAULT_SPLITS)
            else:
                if splits is not None and splits != len(values):
                    raise ConfigError(
                        f"{opts.component}: option 'rowsPerSplit' lists {len(values)} lengths but "
                        f"'splits' is {splits}; give one length per split or drop 'splits'"
                    )
                lengths = list(values)
        self.lengths = lengths
        rate = opts.number("rowsPerSecond")
        if rate is None and any(n is None for n in lengths):
            rate = DEFAULT_UNBOUNDED_RATE
        self.rows_per_second = rate
        self.max_rows_per_trigger = opts.integer("maxRowsPerTrigger", None, minimum=1)

    def config(self) -> dict[str, Any]:
        lengths: Any = self.lengths
        if len(set(self.lengths)) == 1:
            lengths = self.lengths[0]
        elif len(self.lengths) > 64:
            # Keep checkpoints O(live splits): a digest still detects a changed list.
            lengths = "sha256:" + hashlib.sha256(json.dumps(self.lengths).encode()).hexdigest()
        return {"splits": len(self.lengths), "rowsPerSplit": lengths}

    def schema(self) -> str:
        return SCHEMA

    def default_read_limit(self) -> ReadLimit:
        if self.max_rows_per_trigger is not None:
            return ReadMaxRows(self.max_rows_per_trigger)
        return ReadAllAvailable()

    def create_enumerator(self) -> SequenceEnumerator:
        return SequenceEnumerator(self.lengths, self.rows_per_second)

    def create_reader(self, schema: StructType) -> SplitReader:
        return SequenceReader()
