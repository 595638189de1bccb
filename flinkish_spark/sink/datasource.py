"""Wiring a :class:`TwoPhaseCommitSink` into ``writeStream.format(...)``.

Spark 4.3 runs a Python stream writer's ``write`` on executors and its
``commit(messages, batchId)`` / ``abort`` on the driver, each time from a fresh
writer made by the :class:`TwoPhaseCommitDataSource` that ``start()`` created (one
instance per run of the query, while the write side gets a new instance per batch).
The per-run ``run_id`` made in ``__init__`` therefore identifies the committing run.

Before any task of a batch writes, ``streamWriter`` (on the driver) renews the sink's
lease -- a second live run of the query is fenced there -- and resolves the incarnation
(:mod:`flinkish_spark.sink.incarnation`): the offset that maps Spark's batch ids to the
target's epochs, or a refusal when Spark's checkpoint was reset under epochs the target
already holds. Tasks and the commit see target epochs only.

Common sink options: ``uid`` (required), ``checkpoint`` (metadata root; default
``<checkpointLocation>/flinkish``), ``leaseTimeout`` (seconds, default 5),
``continueAfterEpoch`` (after a reset: number this query's epochs after that target epoch),
``keepSparkCheckpoint`` (keep a copy of Spark's local checkpoint with the metadata, which
:func:`~flinkish_spark.sink.spark_checkpoint.restore_spark_checkpoint` puts into a new machine's empty
folder; default: when ``checkpoint`` is not local), plus the storage options ``endpointUrl``,
``region``, ``storageOptions``.
"""

from __future__ import annotations

import json
import os
import uuid
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.errors import CheckpointMismatchError, ConfigError
from flinkish_spark.io.fileio import FileIO, protocol_of, storage_options_from
from flinkish_spark.options import STORAGE_OPTIONS, Options
from flinkish_spark.sink import incarnation
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.incarnation import QUERY_FILE, Incarnation
from flinkish_spark.sink.lease import HEARTBEATS_PER_TIMEOUT, Lease, driver_jvm
from flinkish_spark.sink.protocol import PrepareContext, TwoPhaseCommitSink
from flinkish_spark.sink.spark_checkpoint import SparkCheckpointCopy, copy_wanted
from flinkish_spark.operator import operator_settings, parse_uid
from flinkish_spark.faults import crash_point

# Options Spark itself passes to a stream writer.
SPARK_WRITER_OPTIONS = ("checkpointLocation", "queryName", "path")
COMMON_SINK_OPTIONS = ("uid", "checkpoint", "leaseTimeout", "retainDecisions", "continueAfterEpoch",
                       "keepSparkCheckpoint", *STORAGE_OPTIONS, *SPARK_WRITER_OPTIONS)
DEFAULT_RETAIN = 10


@dataclass
class PreparedMessage(WriterCommitMessage):
    committable: Any
    partition_id: int
    attempt: int


def spark_query_id(location: str, options: dict[str, str] | None = None) -> str | None:
    """The id Spark keeps in ``<checkpointLocation>/metadata``; None where it cannot be read here.

    Local and ``s3a://`` checkpoint locations are read (the latter through fsspec with the
    sink's storage options); HDFS ones need Hadoop's file systems, which the Python side
    does not have.
    """
    path = location[len("file:"):] if location.startswith("file:") else location
    try:
        if "://" in path:
            if protocol_of(path) != "s3":
                return None
            io = FileIO.for_url(path, storage_options_from(options or {}, path))
            first = io.read_bytes(f"{path.rstrip('/')}/metadata").decode().splitlines()[0]
        else:
            with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
                first = f.readline()
        value = json.loads(first).get("id")
    except (OSError, ValueError, AttributeError, IndexError):
        return None
    return str(value) if value else None


def _without_metadata(schema: StructType) -> list[tuple[str, str, bool]]:
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]


def _cdc_stream_shape(schema: StructType) -> bool:
    """Whether ``schema`` is one of the two shapes of the multi-table CDC stream: a row per change (``row``, JSON)
    or a table's rows packed (``batch``, Arrow IPC; the sources' ``rowFormat=arrow``). Routing sinks read either,
    so a restart may switch between them -- an upgraded ``flinkish mirror`` packs the rows of a mirror its older
    version started with JSON rows."""
    names = set(schema.fieldNames())
    return {"_table", "_op", "_schema_id"} <= names and ("row" in names) != ("batch" in names)


def task_context(uid: str, epoch: int | None = None, offset: int = 0) -> PrepareContext:
    """Where a task runs; ``epoch`` defaults to Spark's batch id plus the incarnation's ``offset``."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return PrepareContext(uid, epoch if epoch is not None else -1, 0, 0)
    if epoch is None:
        raw = ctx.getLocalProperty("streaming.sql.batchId")
        epoch = int(raw) + offset if raw is not None else -1
    return PrepareContext(uid, epoch, ctx.partitionId(), ctx.attemptNumber())


class TwoPhaseCommitDataSource(DataSource):
    KIND: ClassVar[str] = ""
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        opts = Options(options, f"{self.name()} sink", COMMON_SINK_OPTIONS + self.EXTRA_OPTIONS)
        uid = parse_uid(opts)
        self.run_id = uuid.uuid4().hex
        root = opts.get("checkpoint")
        if not root:
            location = opts.get("checkpointLocation")
            if not location:
                raise ConfigError(
                    f"{opts.component}: set the option 'checkpoint' (metadata root URL) or the query's "
                    "checkpointLocation, from which it defaults to <checkpointLocation>/flinkish"
                )
            root = join(location.rstrip("/"), "flinkish")
        settings = operator_settings(opts, uid, root)
        self.uid, self.checkpoint_root, self.io = settings.uid, settings.checkpoint_root, settings.io
        self.lease_timeout, self.raw_options = settings.lease_timeout, settings.raw_options
        self.retain = opts.integer("retainDecisions", DEFAULT_RETAIN, minimum=2) or DEFAULT_RETAIN
        self.continue_after = opts.integer("continueAfterEpoch", None, minimum=0)
        location = opts.get("checkpointLocation")
        keep = opts.boolean("keepSparkCheckpoint", copy_wanted(location, self.checkpoint_root, None))
        self.spark_copy = (SparkCheckpointCopy.of_sink(self.io, self.decision_log().directory, location)
                           if location and copy_wanted(location, self.checkpoint_root, keep) else None)
        self.configure(opts)
        self.io.check_writable_root(self.checkpoint_root, "option 'checkpoint'")
        # Spark makes this instance on the driver before each batch's tasks: a renamed sink fails before they write.
        self.check_uid_unchanged()

    @classmethod
    def name(cls) -> str:
        return cls.KIND

    @abstractmethod
    def configure(self, opts: Options) -> None: ...

    @abstractmethod
    def sink(self, schema: StructType) -> TwoPhaseCommitSink[Any]: ...

    def decision_log(self) -> DecisionLog:
        return DecisionLog(self.io, self.checkpoint_root, self.uid)

    def lease(self) -> Lease | None:
        """The sink's lease, held by the driver JVM (the run: see :func:`~flinkish_spark.sink.lease.driver_jvm`);
        None where that JVM cannot be found -- then :meth:`commit_lease` alone fences."""
        jvm = driver_jvm()
        if jvm is None:
            return None
        return Lease(self.io, self.lease_path(), jvm.run_id, f"sink uid {self.uid!r}", self.lease_timeout, live_pid=jvm.pid)

    def commit_lease(self) -> Lease:
        """The lease as the commit renews it: the driver JVM's, else this DataSource's run id (the
        commit side keeps the one DataSource ``start()`` made; the planning side gets a new one per batch)."""
        return self.lease() or Lease(self.io, self.lease_path(), self.run_id, f"sink uid {self.uid!r}", self.lease_timeout)

    def lease_path(self) -> str:
        return join(self.decision_log().directory, "_lease.json")

    def check_schema(self, schema: StructType) -> None:
        """Refuse to write a schema other than the one this sink uid started with."""
        path = join(self.decision_log().directory, "_schema.json")
        try:
            recorded = StructType.fromJson(json.loads(self.io.read_bytes(path)))
        except FileNotFoundError:
            return
        # Column metadata (e.g. the primary key a source marks) is no part of what is written.
        if _without_metadata(recorded) != _without_metadata(schema) and not (
                _cdc_stream_shape(recorded) and _cdc_stream_shape(schema)):
            raise CheckpointMismatchError(
                f"sink uid {self.uid!r} was started with the schema {recorded.simpleString()}, but the "
                f"query now writes {schema.simpleString()}. Write to a new path with a new uid, or "
                "restore the old schema."
            )

    def record_schema(self, schema: StructType) -> None:
        path = join(self.decision_log().directory, "_schema.json")
        if not self.io.exists(path):
            self.io.write_bytes(path, schema.json().encode())

    def incarnation(self, schema: StructType) -> Incarnation:
        """The incarnation this run writes as (see :mod:`flinkish_spark.sink.incarnation`).

        Spark numbers epochs from 0 again when its checkpointLocation is deleted or replaced;
        Spark's query id (``<checkpointLocation>/metadata``) and, when the sink's metadata is
        gone or belongs to another query, the target's own record tell that apart.
        """
        location = self.raw_options.get("checkpointLocation")
        return incarnation.resolve(
            self.io, self.decision_log(), lambda: self.sink(schema).last_committed_epoch(),
            spark_query_id(location, self.raw_options) if location else None, location, self.continue_after,
            "continueAfterEpoch")

    def check_uid_unchanged(self) -> None:
        """Refuse a sink uid that is new to a query whose checkpoint another sink uid wrote.

        Spark's commit log says which epochs are done, the decision log of the sink uid
        says what they committed: with a renamed uid, a replayed epoch would commit twice.
        """
        location = self.raw_options.get("checkpointLocation")
        if not location or self.io.exists(join(self.decision_log().directory, QUERY_FILE)):
            return
        sinks = join(self.checkpoint_root, "sinks")
        for other in self.io.list_names(sinks):
            if other == self.uid:
                continue
            try:
                recorded = json.loads(self.io.read_bytes(join(sinks, other, QUERY_FILE)))
            except (FileNotFoundError, ValueError):
                continue
            if recorded.get("checkpointLocation") == location:
                raise CheckpointMismatchError(
                    f"sink uid {self.uid!r} is new, but the query's checkpointLocation {location} was "
                    f"written with sink uid {other!r}. A sink's uid must stay the same across "
                    f"restarts: restore the uid {other!r}, or give the renamed sink a new checkpointLocation."
                )

    def streamWriter(self, schema: StructType, overwrite: bool) -> "TwoPhaseCommitStreamWriter":
        # Runs on the driver before any task of the batch (and again before its commit):
        # refuse bad state, and a second live run, before anything is written.
        self.check_schema(schema)
        current = self.incarnation(schema)  # a refusal writes nothing, not even the lease
        lease = self.lease()
        if lease is not None:
            lease.renew()
        decided = self.decision_log().check_pending()
        return TwoPhaseCommitStreamWriter(self, schema, frozenset(decided), current.epoch_offset, lease)


class TwoPhaseCommitStreamWriter(DataSourceStreamArrowWriter):
    """Tasks and the driver's commit of one batch; every epoch here is the target's (batch id + offset)."""

    def __init__(self, source: TwoPhaseCommitDataSource, schema: StructType, decided: frozenset[int] = frozenset(),
                 epoch_offset: int = 0, lease: Lease | None = None) -> None:
        self.source = source
        self.schema = schema
        # Epochs with a recorded decision (a replay after a crash past the decision): their commit
        # uses the recorded committables, so tasks prepare nothing -- as transactional() does.
        # Writing them again would waste the work, and into a keyed PostgreSQL table it would
        # wait on (or collide with) the decided rows. Target epochs, as the decision log keeps them.
        self.decided = decided
        self.epoch_offset = epoch_offset
        self._lease = lease  # the driver's: the commit renews the one streamWriter held

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lease": None}  # executors need no lease

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedMessage:
        ctx = task_context(self.source.uid, offset=self.epoch_offset)  # the target epoch, as in ``decided``
        if ctx.epoch in self.decided:
            for _ in iterator:  # Spark's input is consumed, not written
                pass
            return PreparedMessage(None, ctx.partition_id, ctx.attempt)
        committable = self.source.sink(self.schema).prepare(iterator, ctx)
        crash_point("sink.after_prepare")  # this task's files are written; the epoch's other tasks' may not be
        return PreparedMessage(committable, ctx.partition_id, ctx.attempt)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        src = self.source
        epoch = batchId + self.epoch_offset
        # The commit worker's streamWriter renewed the lease a moment ago: that renewal stands.
        (self._lease or src.commit_lease()).renew(unless_renewed_within_s=src.lease_timeout / HEARTBEATS_PER_TIMEOUT)
        src.record_schema(self.schema)
        if src.spark_copy is not None:
            src.spark_copy.before_decision(batchId)  # every decided epoch's offsets are on the store
        prepared = [m.committable for m in messages if isinstance(m, PreparedMessage)]
        commit_epoch(src.sink(self.schema), src.decision_log(), epoch, prepared, src.run_id, retain=src.retain)
        if src.spark_copy is not None:
            src.spark_copy.after_commit(batchId)  # before Spark's own commits/<batchId>
        crash_point("sink.after_commit")  # committed, Spark's commit log not yet written

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        batchId += self.epoch_offset
        sink = self.source.sink(self.schema)
        log = self.source.decision_log()
        decision = log.read(batchId)
        decided = set(decision.committables) if decision is not None else set()
        # Never abort what a recorded decision names: a restart commits it.
        doomed = [
            m.committable
            for m in messages
            if isinstance(m, PreparedMessage) and m.committable is not None and sink.encode(m.committable) not in decided
        ]
        sink.abort(doomed, batchId)
        if decision is None:
            sink.cleanup(batchId, [])
