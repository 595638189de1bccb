"""A range read while its epoch is planned (the driver) and handed to the tasks spread by a key: no shuffle.

For a source whose one range must be read by one reader (a replication slot) but whose rows are worked on per key
(a table) downstream, :func:`spread_rows` reads the range in the driver's source process as a task would, and
cuts its rows into ``n`` partitions by ``crc32(key) mod n``; each :class:`RowsPartition` carries its rows (Arrow
IPC) to its task, which yields them (:func:`partition_rows`). What that saves against one reading task and a
shuffle by key: the stage between them (the sink tasks waited for the read to end, then for the shuffle), and,
where the source kept the messages it fetched to bound the range, a second fetch of the range.

Guarantees:

* **The same rows.** The partitions hold exactly the rows the range's read gives -- the read is the task's own
  (:meth:`~flinkish_spark.source.reader.SplitReader.read` of the source's reader) -- each key's rows in one
  partition, in read order; rows without a key in partition 0.
* **Replays.** Spark plans a replayed epoch again (after a restart: in a new driver process), and the driver
  reads the range again: a range's read is a pure function of the checkpoint, so the partitions hold the same
  rows (a row's partition depends on its key alone).
* **Bounded memory.** Past ``budget`` bytes of rows the read is given up (None): the range is then planned as
  one task that reads it itself, as without the spread.
"""

from __future__ import annotations

import zlib
from typing import Iterable, Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

#: The most bytes of rows (Arrow IPC) an epoch's range read in the driver holds (:func:`spread_rows`'s budget).
SPREAD_BUDGET_BYTES = 64 << 20


class RowsPartition(InputPartition):
    """One Spark task whose rows the driver read when it planned the epoch ``ckpt_id`` (Arrow IPC stream)."""

    ckpt_id: int
    ipc: bytes

    def __init__(self, ckpt_id: int, index: int, ipc: bytes) -> None:
        super().__init__(("rows", ckpt_id, index))
        self.ckpt_id = ckpt_id
        self.ipc = ipc


def spread_rows(batches: Iterable[pa.RecordBatch], key: str, n: int, ckpt_id: int,
                budget: int | None = None) -> list[RowsPartition] | None:
    """``batches`` (one range's rows, one schema) cut into ``n`` partitions by ``key``; None past ``budget`` bytes
    (default :data:`SPREAD_BUDGET_BYTES`)."""
    budget = SPREAD_BUDGET_BYTES if budget is None else budget
    sinks: list[pa.BufferOutputStream] = []
    writers: list[pa.ipc.RecordBatchStreamWriter] = []
    counts = [0] * n
    buckets: dict[str | None, int] = {}
    for batch in batches:
        if not writers:
            sinks = [pa.BufferOutputStream() for _ in range(n)]
            writers = [pa.ipc.new_stream(s, batch.schema) for s in sinks]
        rows: list[list[int]] = [[] for _ in range(n)]
        for i, k in enumerate(batch.column(key).to_pylist()):
            b = buckets.get(k)
            if b is None:
                b = buckets[k] = 0 if k is None else zlib.crc32(k.encode()) % n
            rows[b].append(i)
        for b, idx in enumerate(rows):
            if idx:
                writers[b].write_batch(batch if len(idx) == batch.num_rows else batch.take(pa.array(idx, pa.int32())))
                counts[b] += len(idx)
        if sum(s.tell() for s in sinks) > budget:
            for w in writers:
                w.close()
            return None
    for w in writers:
        w.close()
    return [RowsPartition(ckpt_id, i, s.getvalue().to_pybytes()) for i, s in enumerate(sinks) if counts[i]]


def partition_rows(partition: RowsPartition) -> Iterator[pa.RecordBatch]:
    """The rows of ``partition``, as the driver read them."""
    yield from pa.ipc.open_stream(partition.ipc)
