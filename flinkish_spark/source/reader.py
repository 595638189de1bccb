"""The executor-side half of a split source (Flink's SplitReader).

A reader is created from a pickled copy of the source on each executor and
must not rely on anything set on the driver after the query started: the
split, the start and the end position are all it gets -- and the epoch's
checkpoint id (:meth:`SplitReader.begin_epoch`), to read what was fixed
when the epoch was planned.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

import pyarrow as pa

from flinkish_spark.source.split import Split


class SplitReader(ABC):
    @abstractmethod
    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Yield the records of ``split`` from position ``start`` (inclusive) to ``end`` (exclusive).

        The same (split, start, end) must always yield the same records: a
        replayed epoch re-reads exactly the same range. Batches may have any
        column types castable to the source schema; the adapter casts them.
        """

    def begin_epoch(self, ckpt_id: int) -> None:
        """The ranges :meth:`read` is given next belong to the epoch planned in checkpoint ``ckpt_id``.

        A reader whose rows depend on what was fixed when the epoch was planned (the multi-table
        source: each table's key) reads it from that checkpoint, so that every read of the epoch
        yields the same rows. Default: nothing."""

    def close(self) -> None:
        """The task has read all its ranges: release what :meth:`read` kept open across them (a connection)."""
