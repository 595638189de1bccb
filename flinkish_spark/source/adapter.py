"""The adapter from an enumerator/reader pair to Spark's ``DataSourceStreamReader``.

Protocol (write-ahead metadata, DESIGN.md section 4.1):

* ``initialOffset`` writes nothing and always returns the same *genesis* offset,
  so a replay of batch 0 plans exactly what the first run planned.
* ``latestOffset(start, limit)`` decides the next epoch -- new positions, newly
  discovered splits, splits that end in it -- writes that as one immutable
  checkpoint file, and only then returns an offset that names the file.
  When nothing changed it returns ``start`` itself, so no empty epoch is made.
* ``partitions(start, end)`` is a pure function of the file ``end`` names (whose
  parent must be ``start``): a replay after a crash plans the same ranges.
  Splits that finished in an earlier epoch never get a partition.
* A call ``latestOffset(start)`` means the batch that ended at ``start`` has been
  committed by the sink: Spark runs micro-batches one after another and only
  plans the next one after the previous one is in its commit log. That is the
  "checkpoint complete" notification for ``start``'s checkpoint: cleanup of
  finished input and retention of old metadata happen there. (``commit(end)``
  lags one batch behind and is only a second, idempotent, notification.)

The driver-side state (enumerator, caches) lives in Spark's long-lived Python
worker on the driver. The copy of this object that Spark pickles for executors
carries only the source and schema: ``read`` needs nothing else.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.errors import CheckpointMismatchError, UnsupportedFormatVersionError
from flinkish_spark.sink.lease import Lease
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.planning import Budget, plan_epoch, read_ranges
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split, SplitExtent
from flinkish_spark.testing.crash import crash_point

if TYPE_CHECKING:
    from flinkish_spark.source.datasource import SplitDataSource

OFFSET_VERSION = 1
GENESIS = -1


@dataclass
class SplitPartition(InputPartition):
    """One Spark task: read ``split_id`` from ``start`` to ``end`` (epoch ``ckpt_id``)."""

    split_id: str
    payload: str | None
    start: int
    end: int
    ckpt_id: int

    def __init__(self, split_id: str, payload: str | None, start: int, end: int, ckpt_id: int) -> None:
        super().__init__((split_id, start, end))
        self.split_id = split_id
        self.payload = payload
        self.start = start
        self.end = end
        self.ckpt_id = ckpt_id


class SplitStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, source: "SplitDataSource", schema: StructType) -> None:
        self.source = source
        self.schema = schema
        self._reset_driver_state()
        self._split_reader: SplitReader | None = None
        self._arrow_schema: pa.Schema | None = None

    # -- pickling: executors get the source and the schema, nothing else ----------------

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.source = state["source"]
        self.schema = state["schema"]
        self._reset_driver_state()
        self._split_reader = None
        self._arrow_schema = None

    def _reset_driver_state(self) -> None:
        self._store: SourceCheckpointStore | None = None
        self._enumerator: SplitEnumerator | None = None
        self._enumerator_at: int | None = None
        self._cache: dict[int, SourceCheckpoint] = {}
        self._notified_through = GENESIS
        self._available_now = False
        self._caps: dict[str, int] | None = None
        self._lease: Lease | None = None

    # -- offsets ------------------------------------------------------------------------

    def _offset(self, ckpt: SourceCheckpoint | None) -> dict:
        if ckpt is None:
            return {"v": OFFSET_VERSION, "uid": self.source.uid, "ckpt": GENESIS}
        return {"v": OFFSET_VERSION, "uid": self.source.uid, "ckpt": ckpt.ckpt_id, "status": ckpt.status}

    def _ckpt_id(self, offset: dict) -> int:
        if not isinstance(offset, dict) or "ckpt" not in offset:
            raise CheckpointMismatchError(
                f"source uid {self.source.uid!r}: Spark's offset log holds {offset!r}, which is not a "
                "flinkish offset. The checkpointLocation belongs to a different query or source."
            )
        if int(offset.get("v", 0)) > OFFSET_VERSION:
            raise UnsupportedFormatVersionError(
                f"source uid {self.source.uid!r}: the offset log was written with offset version "
                f"{offset.get('v')}, this flinkish_spark reads up to {OFFSET_VERSION}; upgrade it"
            )
        if offset.get("uid") != self.source.uid:
            raise CheckpointMismatchError(
                f"Spark's checkpointLocation holds offsets of source uid {offset.get('uid')!r}, but "
                f"this source has uid {self.source.uid!r}. A source's uid must stay the same across "
                "restarts; restore the old uid or start with a new checkpointLocation."
            )
        return int(offset["ckpt"])

    def _fence(self) -> None:
        """Hold this uid's lease for the run (heartbeat thread); fail if another live run has it."""
        if self._lease is None:
            lease = Lease(
                self.source.io,
                join(self.store.directory, "_lease.json"),
                uuid.uuid4().hex,
                f"source uid {self.source.uid!r}",
                self.source.lease_timeout,
            )
            lease.acquire()
            lease.start_heartbeat()
            self._lease = lease
        self._lease.check()

    def stop(self) -> None:
        # Spark calls this only when it ends the runner gracefully (usually it kills the
        # process): then release the lease so that a restart need not wait for it to expire.
        if self._lease is not None and self._lease.held:
            self._lease.stop_heartbeat()
            holder = self._lease.read()
            if holder is not None and holder.run_id == self._lease.run_id:
                self.source.io.delete(self._lease.path)

    @property
    def store(self) -> SourceCheckpointStore:
        if self._store is None:
            self._store = self.source.checkpoint_store()
        return self._store

    def _load(self, ckpt_id: int) -> SourceCheckpoint | None:
        if ckpt_id == GENESIS:
            return None
        ckpt = self._cache.get(ckpt_id)
        if ckpt is None:
            ckpt = self.store.read(ckpt_id)
            self._remember(ckpt)
        return ckpt

    def _remember(self, ckpt: SourceCheckpoint) -> None:
        # The last two checkpoints are all latestOffset/partitions/commit ever need.
        self._cache[ckpt.ckpt_id] = ckpt
        for old in sorted(self._cache)[:-2]:
            del self._cache[old]

    def _enumerator_for(self, prev: SourceCheckpoint | None) -> SplitEnumerator:
        key = GENESIS if prev is None else prev.ckpt_id
        if self._enumerator is None or self._enumerator_at != key:
            enumerator = self.source.create_enumerator()
            if prev is not None:
                enumerator.restore(prev.enumerator_state)
            self._enumerator = enumerator
            self._enumerator_at = key
        return self._enumerator

    # -- Spark's driver-side calls --------------------------------------------------------

    def initialOffset(self) -> dict:
        return self._offset(None)

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.source.default_read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._caps = None

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._fence()
        prev = self._load(self._ckpt_id(start))
        self._checkpoint_complete(prev)
        enumerator = self._enumerator_for(prev)
        previous = prev.splits if prev is not None else ()

        frozen = self._available_now and self._caps is not None
        discovered: list[Split] = [] if frozen else enumerator.discover({s.split_id for s in previous})
        extents: dict[str, SplitExtent] = {}
        for rec in previous:
            if not rec.finished:
                extents[rec.split_id] = enumerator.extent(Split(rec.split_id, rec.payload), rec.position)
        for split in discovered:
            extents[split.split_id] = enumerator.extent(split, 0)
        if self._available_now:
            if self._caps is None:
                # Trigger.AvailableNow: what is available now is the target; nothing later.
                self._caps = {sid: ext.available for sid, ext in extents.items()}
            extents = {
                sid: SplitExtent(min(ext.available, self._caps.get(sid, 0)), ext.end)
                for sid, ext in extents.items()
            }

        ckpt_id = self.store.allocate_id()
        records, changed = plan_epoch(previous, discovered, extents, self._budget(limit), ckpt_id)
        no_more = enumerator.no_more_splits()
        if no_more != (prev.no_more_splits if prev is not None else False):
            changed = True
        if not changed:
            return start
        ckpt = SourceCheckpoint(
            uid=self.source.uid,
            kind=self.source.name(),
            ckpt_id=ckpt_id,
            parent_id=None if prev is None else prev.ckpt_id,
            created_ms=int(time.time() * 1000),
            config=self.source.config_json(self.schema),
            enumerator_state=enumerator.snapshot_state(),
            no_more_splits=no_more,
            splits=records,
        )
        crash_point("source.before_metadata_write")
        self.store.write(ckpt)
        crash_point("source.after_metadata_write")
        self._remember(ckpt)
        self._enumerator_at = ckpt.ckpt_id
        return self._offset(ckpt)

    def _budget(self, limit: ReadLimit) -> Budget:
        if isinstance(limit, ReadMaxRows):
            return Budget(max_units=limit.max_rows)
        if isinstance(limit, ReadMaxFiles):
            return Budget(max_splits=limit.max_files)
        return Budget()  # ReadAllAvailable, and ReadMinRows / ReadMaxBytes: read what is there

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        start_id, end_id = self._ckpt_id(start), self._ckpt_id(end)
        if start_id == end_id:
            return []
        self._fence()
        ckpt = self._load(end_id)
        assert ckpt is not None
        expected_parent = None if start_id == GENESIS else start_id
        if ckpt.parent_id != expected_parent:
            raise CheckpointMismatchError(
                f"source uid {self.source.uid!r}: checkpoint {end_id} continues checkpoint "
                f"{ckpt.parent_id}, but Spark asks for the range from {start_id}. The metadata in "
                f"{self.store.directory} does not belong to this checkpointLocation."
            )
        crash_point("source.partitions")
        return [SplitPartition(r.split_id, r.payload, r.start, r.end, ckpt.ckpt_id) for r in read_ranges(ckpt)]

    def commit(self, end: dict) -> None:
        self._checkpoint_complete(self._load(self._ckpt_id(end)))

    def _checkpoint_complete(self, ckpt: SourceCheckpoint | None) -> None:
        if ckpt is None or ckpt.ckpt_id <= self._notified_through:
            return
        self._enumerator_for(ckpt).on_checkpoint_complete(ckpt)
        self.store.retain(self.source.retain, ckpt.ckpt_id)
        self._notified_through = ckpt.ckpt_id

    # -- executors ------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SplitPartition)
        if self._split_reader is None:
            self._split_reader = self.source.create_reader(self.schema)
            from pyspark.sql.pandas.types import to_arrow_schema

            self._arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        target = self._arrow_schema
        assert target is not None
        split = Split(partition.split_id, partition.payload)
        for batch in self._split_reader.read(split, partition.start, partition.end):
            yield conform(batch, target)
            crash_point("source.read")


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """Select and cast ``batch`` to exactly ``target`` (Spark checks the schema strictly)."""
    if batch.schema.equals(target):
        return batch
    arrays = []
    names = batch.schema.names
    for field in target:
        if field.name in names:
            col = batch.column(names.index(field.name))
            arrays.append(col if col.type == field.type else col.cast(field.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)
