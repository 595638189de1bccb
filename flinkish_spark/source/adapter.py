"""The adapter from an enumerator/reader pair to Spark's ``DataSourceStreamReader``.

Protocol (write-ahead metadata, DESIGN.md section 4.1):

* ``initialOffset`` writes nothing and always returns the same *genesis* offset,
  so a replay of batch 0 plans exactly what the first run planned.
* ``latestOffset(start, limit)`` decides the next epoch -- new positions, newly
  discovered splits, splits that end in it -- writes that as one immutable
  checkpoint file, and only then returns an offset that names the file.
  When nothing changed it returns ``start`` itself, so no empty epoch is made.
* ``partitions(start, end)`` is a pure function of the file ``end`` names (whose
  parent must be ``start``): a replay after a crash plans the same ranges. (Which tasks
  read them may differ: a source that spreads a range it just bounded -- :mod:`.spread_read`
  -- plans its replay as one task; every task layout reads the same rows.)
  Splits that finished in an earlier epoch never get a partition.
* A call ``latestOffset(start)`` means the batch that ended at ``start`` has been
  committed by the sink: Spark runs micro-batches one after another and only
  plans the next one after the previous one is in its commit log. That is the
  "checkpoint complete" notification for ``start``'s checkpoint: cleanup of
  finished input and retention of old metadata happen there. (``commit(end)``
  lags one batch behind and is only a second, idempotent, notification.)

Finishing (FLIP-147, see :mod:`flinkish_spark.finish`): a FINISHED source never plans
another row. ``latestOffset`` also honours stop requests (no drain: return the same
checkpoint marked ``stop``; drain: one epoch that ends every split where it is) and, with
``watermarkColumn``, emits the end-of-input marker once every source under the root has
ended. On the first call of a run the checkpoint Spark resumes from is checked against
the query (Flink's VertexFinishedStateChecker): a FINISHED source whose configuration
changed fails before anything is written.

The driver-side state (enumerator, caches) lives in Spark's long-lived Python
worker on the driver. The copy of this object that Spark pickles for executors
carries only the source and schema: ``read`` needs nothing else.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

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
from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.errors import CheckpointMismatchError, UnsupportedFormatVersionError
from flinkish_spark.finish.stop_request import StopRequest, read_request
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.finish.watermark import END_OF_INPUT_TS
from flinkish_spark.sink.lease import Lease
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.offset import GENESIS, OFFSET_VERSION, EndOfInput, SourceOffset
from flinkish_spark.source.planning import Budget, ReadRange, plan_epoch
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split, SplitExtent
from flinkish_spark.source import spread_read
from flinkish_spark.source.spread_read import RowsPartition, partition_rows, spread_rows
from flinkish_spark.faults import crash_point

_log = logging.getLogger(__name__)


class SourceHost(Protocol):
    """What the stream reader needs from the :class:`~flinkish_spark.source.datasource.SplitDataSource`
    that made it. A protocol, so the reader (lower layer) does not import the data source (upper layer)."""

    uid: str
    io: FileIO
    checkpoint_root: str
    lease_timeout: float
    retain: int
    watermark_column: str | None
    raw_options: dict[str, str]

    def name(self) -> str: ...
    def config_json(self, schema: StructType) -> str: ...
    def write_descriptor(self) -> None: ...
    def checkpoint_store(self) -> SourceCheckpointStore: ...
    def create_enumerator(self) -> SplitEnumerator: ...
    def create_reader(self, schema: StructType) -> SplitReader: ...
    def default_read_limit(self) -> ReadLimit: ...
    def group_ranges(self, ranges: list[ReadRange]) -> list[list[ReadRange]]: ...
    def epoch_ranges(self, checkpoint: SourceCheckpoint) -> list[ReadRange]: ...
    def spread(self, r: ReadRange) -> tuple[int, str] | None: ...

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


@dataclass
class SplitsPartition(InputPartition):
    """One Spark task that reads several ranges one after the other (epoch ``ckpt_id``).

    For a source whose splits are many and small (a table's snapshot chunks): one task per
    core instead of one per split saves each further split a task, a Python worker round
    trip and an output file, and changes nothing else -- an epoch is read whole or replayed whole.
    """

    ranges: tuple[tuple[str, str | None, int, int], ...]  # (split_id, payload, start, end)
    ckpt_id: int

    def __init__(self, ranges: tuple[tuple[str, str | None, int, int], ...], ckpt_id: int) -> None:
        super().__init__(tuple((r[0], r[2], r[3]) for r in ranges))
        self.ranges = ranges
        self.ckpt_id = ckpt_id


@dataclass
class EndOfInputPartition(InputPartition):
    """The one-row partition that carries the end-of-input watermark marker."""

    ckpt_id: int

    def __init__(self, ckpt_id: int) -> None:
        super().__init__(("end-of-input", ckpt_id))
        self.ckpt_id = ckpt_id


class SplitStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, source: SourceHost, schema: StructType) -> None:
        self.source = source
        self.schema = schema
        self._reset_driver_state()
        # Built in the driver as the query starts. pyarrow imports pandas at its first array (0.25-0.3 s on a
        # 2-core machine): paid here, not in the first epoch's latestOffset (whose checkpoint file is that array).
        pa.array([0])
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
        self._restore_checked = False

    # -- offsets ------------------------------------------------------------------------

    def _offset(self, ckpt: SourceCheckpoint | None, **extra: Any) -> dict:
        src = self.source
        status = None if ckpt is None else ckpt.status
        eoi: EndOfInput | None = "pending" if (ckpt is not None and ckpt.finished and src.watermark_column) else None
        off = SourceOffset(
            uid=src.uid,
            ckpt=GENESIS if ckpt is None else ckpt.ckpt_id,
            status=status,
            root=src.checkpoint_root,
            endpoint_url=src.raw_options.get("endpointUrl"),
            region=src.raw_options.get("region"),
            eoi=eoi,
        )
        return off.with_(**extra).to_json() if extra else off.to_json()

    def _parse(self, offset: dict) -> SourceOffset:
        parsed = SourceOffset.from_json(offset)
        if parsed is None:
            raise CheckpointMismatchError(
                f"source uid {self.source.uid!r}: Spark's offset log holds {offset!r}, which is not a "
                "flinkish offset. The checkpointLocation belongs to a different query or source."
            )
        if parsed.version > OFFSET_VERSION:
            raise UnsupportedFormatVersionError(
                f"source uid {self.source.uid!r}: the offset log was written with offset version "
                f"{parsed.version}, this flinkish_spark reads up to {OFFSET_VERSION}; upgrade it"
            )
        if parsed.uid != self.source.uid:
            raise CheckpointMismatchError(
                f"Spark's checkpointLocation holds offsets of source uid {parsed.uid!r}, but "
                f"this source has uid {self.source.uid!r}. A source's uid must stay the same across "
                "restarts (was it renamed, or removed and another one added?); restore the old uid "
                "or start with a new checkpointLocation."
            )
        return parsed

    def _ckpt_id(self, offset: dict) -> int:
        return self._parse(offset).ckpt

    def _check_restore(self, ckpt_id: int) -> None:
        """First call of a run: compare the checkpoint Spark resumes from with this query.

        Runs before the lease is taken, so a mismatch writes nothing at all.
        """
        if self._restore_checked:
            return
        self._restore_checked = True
        if ckpt_id == GENESIS:
            self._check_fresh_start()
            return
        ckpt = self._load(ckpt_id)
        if ckpt is None or not ckpt.finished:
            return
        recorded, current = json.loads(ckpt.config), json.loads(self.source.config_json(self.schema))
        changes = [
            f"{key}: {recorded.get(key)!r} -> {current.get(key)!r}"
            for key in sorted(set(recorded) | set(current))
            if recorded.get(key) != current.get(key)
        ]
        if changes:
            raise CheckpointMismatchError(
                f"source uid {self.source.uid!r} is FINISHED in checkpoint {ckpt.ckpt_id}, but its "
                f"configuration changed ({'; '.join(changes)}). A finished source is never read "
                "again, so the change would be silently ignored. Restore the old configuration, "
                "give the changed source a new uid, or start with a new checkpointLocation."
            )

    def _check_fresh_start(self) -> None:
        """Spark starts this source from the beginning: its metadata must not say otherwise.

        A checkpoint with a parent is only ever written after Spark logged and committed
        that parent, so finding one means Spark's checkpointLocation was deleted or
        replaced while this source's metadata was kept: starting over would read every
        split again. (Checkpoints without a parent may be orphans of a crash before
        Spark's first offset log entry: those are fine.)
        """
        latest = self.store.latest()
        if latest is not None and latest.parent_id is not None:
            raise CheckpointMismatchError(
                f"source uid {self.source.uid!r} has checkpoints up to {latest.ckpt_id} in "
                f"{self.store.directory}, but Spark starts the query from the beginning: its "
                "checkpointLocation was deleted or replaced while the flinkish metadata was kept, "
                "and the input would be read again. Keep the two together: restore the "
                "checkpointLocation, or start afresh with a new 'checkpoint' (or a new uid)."
            )

    def _fence(self) -> None:
        """Hold this uid's lease for the run (heartbeat thread); fail if another live run has it."""
        if self._lease is None:
            lease = Lease(
                self.source.io,
                join(self.store.directory, "_lease.json"),
                uuid.uuid4().hex,
                f"source uid {self.source.uid!r}",
                self.source.lease_timeout,
                pid_is_liveness=True,  # the heartbeat runs in this long-lived driver-side worker
            )
            lease.acquire()
            lease.start_heartbeat()
            self._lease = lease
            self.source.write_descriptor()
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
        start_off = self._parse(start)
        self._check_restore(start_off.ckpt)
        self._fence()
        prev = self._load(start_off.ckpt)
        self._checkpoint_complete(prev)
        if prev is not None and prev.finished:
            return self._finished_offset(start, start_off)
        request = self._stop_request()
        if request is not None and not request.drain:
            # Stop without drain: no new epoch; the offset says so, so that the driver's
            # finish controller ends the query once this (empty) batch is committed.
            return start if start_off.stop == request.id else self._offset(prev, stop=request.id)
        if request is not None and request.drain and self._enumerator_for(prev).drain_ready():
            return self._drain(prev, request)
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
                sid: SplitExtent(min(ext.available, self._caps.get(sid, 0)), ext.end, ext.share)
                for sid, ext in extents.items()
            }

        ckpt_id = self.store.allocate_id()
        records, changed = plan_epoch(previous, discovered, extents, self._budget(limit), ckpt_id,
                                      enumerator.keep_finished_splits)
        no_more = enumerator.no_more_splits()
        if no_more != (prev.no_more_splits if prev is not None else False):
            changed = True
        if not changed:
            # A stop marker of an earlier run must not stay in the offsets of this one.
            return start if start_off.stop is None else self._offset(prev)
        return self._write(prev, enumerator.snapshot_state(), no_more, records, ckpt_id)

    def _write(
        self,
        prev: SourceCheckpoint | None,
        state: bytes,
        no_more: bool,
        records: tuple[SplitRecord, ...],
        ckpt_id: int,
        **extra: Any,
    ) -> dict:
        ckpt = SourceCheckpoint(
            uid=self.source.uid,
            kind=self.source.name(),
            ckpt_id=ckpt_id,
            parent_id=None if prev is None else prev.ckpt_id,
            created_ms=int(time.time() * 1000),
            config=self.source.config_json(self.schema),
            enumerator_state=state,
            no_more_splits=no_more,
            splits=records,
        )
        crash_point("source.before_metadata_write")
        self.store.write(ckpt)
        crash_point("source.after_metadata_write")
        self._remember(ckpt)
        self._enumerator_at = ckpt.ckpt_id
        return self._offset(ckpt, **extra)

    def _stop_request(self) -> StopRequest | None:
        assert self._lease is not None
        req = read_request(self.source.io, self.source.checkpoint_root, self.source.uid)
        if req is None or req.state != "requested" or req.run_id != self._lease.run_id:
            return None  # none, done, or meant for an earlier run of the query
        return req

    def _drain(self, prev: SourceCheckpoint | None, request: StopRequest) -> dict:
        """Stop with drain: end every split where it is; the source is FINISHED from here on."""
        ckpt_id = self.store.allocate_id()
        enumerator = self._enumerator_for(prev)
        records = []
        for rec in prev.splits if prev is not None else ():
            if rec.finished:
                if enumerator.keep_finished_splits:
                    records.append(rec.compact())
                continue
            end = max(rec.position, enumerator.drain_position(Split(rec.split_id, rec.payload), rec.position))
            records.append(SplitRecord(rec.split_id, rec.position, end, end, True, ckpt_id, rec.payload))
        state = enumerator.snapshot_state()
        return self._write(prev, state, True, tuple(records), ckpt_id, stop=request.id)

    def _finished_offset(self, start: dict, start_off: SourceOffset) -> dict:
        """A FINISHED source reads nothing, except once the end-of-input marker."""
        if start_off.eoi == "pending" and self.source.watermark_column and self._all_sources_finished():
            return start_off.with_(eoi="emitted").to_json()
        return start

    def _all_sources_finished(self) -> bool:
        """Whether every source under this metadata root has ended (FLIP-147's "all inputs")."""
        root, io = self.source.checkpoint_root, self.source.io
        for uid in io.list_names(join(root, "sources")):
            if uid == self.source.uid:
                continue
            other = SourceCheckpointStore(io, root, uid, kind="")
            ids = other.ids()
            if not ids:
                continue
            from flinkish_spark.checkpoint.serde import decode_source_checkpoint

            path = other.path(ids[-1])
            if not decode_source_checkpoint(io.read_bytes(path), path).finished:
                return False
        return True

    def _budget(self, limit: ReadLimit) -> Budget:
        if isinstance(limit, ReadMaxRows):
            return Budget(max_units=limit.max_rows)
        if isinstance(limit, ReadMaxFiles):
            return Budget(max_splits=limit.max_files)
        return Budget()  # ReadAllAvailable, and ReadMinRows / ReadMaxBytes: read what is there

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        start_off, end_off = self._parse(start), self._parse(end)
        start_id, end_id = start_off.ckpt, end_off.ckpt
        if start_id == end_id:
            if end_off.eoi == "emitted" and start_off.eoi != "emitted":
                return [EndOfInputPartition(end_id)]
            return []
        self._check_restore(end_id)
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
        out: list[InputPartition] = []
        # A pure function of the checkpoint: a source may cut a range into pieces its state names, the same pieces
        # at every replay (SplitDataSource.epoch_ranges).
        for group in self.source.group_ranges(self.source.epoch_ranges(ckpt)):
            spread = self.source.spread(group[0]) if len(group) == 1 else None
            rows = None if spread is None else self._spread_read(group[0], ckpt.ckpt_id, *spread)
            if rows is not None:
                out.extend(rows)
            elif len(group) == 1:
                r = group[0]
                out.append(SplitPartition(r.split_id, r.payload, r.start, r.end, ckpt.ckpt_id))
            elif group:
                out.append(SplitsPartition(tuple((r.split_id, r.payload, r.start, r.end) for r in group), ckpt.ckpt_id))
        return out

    def _spread_read(self, r: ReadRange, ckpt_id: int, tasks: int, key: str) -> list[RowsPartition] | None:
        """The range ``r`` read here, its rows in ``tasks`` partitions by ``key`` (:mod:`.spread_read`); None
        past the budget (the range is then one task's)."""
        reader = self.source.create_reader(self.schema)
        target = self._target()
        reader.begin_epoch(ckpt_id)
        try:
            def rows() -> Iterator[pa.RecordBatch]:
                for batch in reader.read(Split(r.split_id, r.payload), r.start, r.end):
                    yield conform(batch, target)
                    crash_point("source.spread_read")
            spread = spread_rows(rows(), key, tasks, ckpt_id)
        finally:
            reader.close()
        if spread is None:
            _log.warning("source uid %r: epoch %d's range of %s holds more than %d MiB of rows: read by one task, its "
                         "per-key work there (a lower maxRowsPerTrigger keeps epochs spread)", self.source.uid, ckpt_id,
                         r.split_id, spread_read.SPREAD_BUDGET_BYTES >> 20)
        return spread

    def _target(self) -> pa.Schema:
        if self._arrow_schema is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            self._arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        return self._arrow_schema

    def commit(self, end: dict) -> None:
        self._checkpoint_complete(self._load(self._ckpt_id(end)))

    def _checkpoint_complete(self, ckpt: SourceCheckpoint | None) -> None:
        if ckpt is None or ckpt.ckpt_id <= self._notified_through:
            return
        self._enumerator_for(ckpt).on_checkpoint_complete(ckpt)
        self.store.retain(self.source.retain, ckpt.ckpt_id)
        self._notified_through = ckpt.ckpt_id

    # -- executors ------------------------------------------------------------------------

    def _end_of_input_batch(self) -> pa.RecordBatch:
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")
        column = self.source.watermark_column
        arrays = [
            pa.array([END_OF_INPUT_TS], f.type) if f.name == column else pa.nulls(1, f.type) for f in target
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=target)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, EndOfInputPartition):
            yield self._end_of_input_batch()
            return
        if isinstance(partition, RowsPartition):
            for batch in partition_rows(partition):
                yield batch
                crash_point("source.read")
            return
        if isinstance(partition, SplitsPartition):
            ranges = list(partition.ranges)
        else:
            assert isinstance(partition, SplitPartition)
            ranges = [(partition.split_id, partition.payload, partition.start, partition.end)]
        if self._split_reader is None:
            self._split_reader = self.source.create_reader(self.schema)
        target = self._target()
        self._split_reader.begin_epoch(partition.ckpt_id)
        try:
            for split_id, payload, start, end in ranges:
                for batch in self._split_reader.read(Split(split_id, payload), start, end):
                    yield conform(batch, target)
                    crash_point("source.read")
        finally:
            self._split_reader.close()


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
