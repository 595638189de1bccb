"""Wiring a :class:`TwoPhaseCommitSink` into ``writeStream.format(...)``.

Spark 4.3 runs a Python stream writer's ``write`` on executors and its
``commit(messages, batchId)`` / ``abort`` on the driver, each time from a fresh
writer made by the :class:`TwoPhaseCommitDataSource` that ``start()`` created (one
instance per run of the query, while the write side gets a new instance per batch).
The per-run ``run_id`` made in ``__init__`` therefore identifies the committing run.

Common sink options: ``uid`` (required), ``checkpoint`` (metadata root; default
``<checkpointLocation>/flinkish``), ``leaseTimeout`` (seconds, default 5), plus the
storage options ``endpointUrl``, ``region``, ``storageOptions``.
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
from flinkish_spark.options import STORAGE_OPTIONS, Options
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.lease import Lease
from flinkish_spark.sink.protocol import PrepareContext, TwoPhaseCommitSink
from flinkish_spark.operator import operator_settings, parse_uid
from flinkish_spark.faults import crash_point

# Options Spark itself passes to a stream writer.
SPARK_WRITER_OPTIONS = ("checkpointLocation", "queryName", "path")
COMMON_SINK_OPTIONS = ("uid", "checkpoint", "leaseTimeout", "retainDecisions", *STORAGE_OPTIONS, *SPARK_WRITER_OPTIONS)
DEFAULT_RETAIN = 10
QUERY_FILE = "_query.json"


@dataclass
class PreparedMessage(WriterCommitMessage):
    committable: Any
    partition_id: int
    attempt: int


def spark_query_id(location: str) -> str | None:
    """The id Spark keeps in ``<checkpointLocation>/metadata``; None where it cannot be read here.

    Only local checkpoint locations are read (HDFS or s3a:// ones need Hadoop's
    file systems, which the Python side does not have).
    """
    path = location[len("file:"):] if location.startswith("file:") else location
    if "://" in path:
        return None
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
            value = json.loads(f.readline()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def _without_metadata(schema: StructType) -> list[tuple[str, str, bool]]:
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]


def task_context(uid: str, epoch: int | None = None) -> PrepareContext:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return PrepareContext(uid, epoch if epoch is not None else -1, 0, 0)
    if epoch is None:
        raw = ctx.getLocalProperty("streaming.sql.batchId")
        epoch = int(raw) if raw is not None else -1
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
        self.configure(opts)
        self.io.check_writable_root(self.checkpoint_root, "option 'checkpoint'")
        # start() makes this instance on the driver: a renamed sink fails before any batch.
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

    def lease(self) -> Lease:
        return Lease(self.io, join(self.decision_log().directory, "_lease.json"), self.run_id, f"sink uid {self.uid!r}", self.lease_timeout)

    def check_schema(self, schema: StructType) -> None:
        """Refuse to write a schema other than the one this sink uid started with."""
        path = join(self.decision_log().directory, "_schema.json")
        try:
            recorded = StructType.fromJson(json.loads(self.io.read_bytes(path)))
        except FileNotFoundError:
            return
        # Column metadata (e.g. the primary key a source marks) is no part of what is written.
        if _without_metadata(recorded) != _without_metadata(schema):
            raise CheckpointMismatchError(
                f"sink uid {self.uid!r} was started with the schema {recorded.simpleString()}, but the "
                f"query now writes {schema.simpleString()}. Write to a new path with a new uid, or "
                "restore the old schema."
            )

    def record_schema(self, schema: StructType) -> None:
        path = join(self.decision_log().directory, "_schema.json")
        if not self.io.exists(path):
            self.io.write_bytes(path, schema.json().encode())
        query = join(self.decision_log().directory, QUERY_FILE)
        location = self.raw_options.get("checkpointLocation")
        if location and not self.io.exists(query):
            record = {"checkpointLocation": location, "queryId": spark_query_id(location)}
            self.io.write_bytes(query, json.dumps(record).encode())

    def check_same_query(self) -> None:
        """Refuse to continue a decision log that belongs to an earlier incarnation of the query.

        Spark numbers epochs from 0 again when its checkpointLocation is deleted or replaced.
        This sink would then take the new epochs for replays of committed ones and skip
        them: silently lost rows. Spark's query id (``<checkpointLocation>/metadata``)
        tells the two apart.
        """
        location = self.raw_options.get("checkpointLocation")
        current = spark_query_id(location) if location else None
        if current is None:
            return
        try:
            recorded = json.loads(self.io.read_bytes(join(self.decision_log().directory, QUERY_FILE)))
        except FileNotFoundError:
            return
        except ValueError:
            return  # a damaged control file costs this check, never a row
        previous = recorded.get("queryId") if isinstance(recorded, dict) else None
        if previous and previous != current:
            decided, _ = self.decision_log().epochs()
            raise CheckpointMismatchError(
                f"sink uid {self.uid!r} committed epochs up to {decided[-1] if decided else '?'} for the "
                f"streaming query {previous}, but the checkpointLocation {location} now belongs to the "
                f"query {current}: it was deleted or replaced, so Spark restarts at epoch 0 and this sink "
                "would skip those epochs as already committed. Restore the old checkpointLocation, or "
                "give the sink a new 'uid' (and 'path') or a new 'checkpoint' for a fresh start."
            )

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
        # Runs on the driver before any task of the batch: refuse bad state before writing.
        self.check_schema(schema)
        self.check_same_query()
        decided = self.decision_log().check_pending()
        return TwoPhaseCommitStreamWriter(self, schema, frozenset(decided))


class TwoPhaseCommitStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, source: TwoPhaseCommitDataSource, schema: StructType, decided: frozenset[int] = frozenset()) -> None:
        self.source = source
        self.schema = schema
        # Epochs with a recorded decision (a replay after a crash past the decision): their commit
        # uses the recorded committables, so tasks prepare nothing -- as transactional() does.
        # Writing them again would waste the work, and into a keyed PostgreSQL table it would
        # wait on (or collide with) the decided rows.
        self.decided = decided

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedMessage:
        ctx = task_context(self.source.uid)
        if ctx.epoch in self.decided:
            for _ in iterator:  # Spark's input is consumed, not written
                pass
            return PreparedMessage(None, ctx.partition_id, ctx.attempt)
        committable = self.source.sink(self.schema).prepare(iterator, ctx)
        return PreparedMessage(committable, ctx.partition_id, ctx.attempt)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        src = self.source
        src.lease().renew()
        src.record_schema(self.schema)
        prepared = [m.committable for m in messages if isinstance(m, PreparedMessage)]
        log = src.decision_log()
        commit_epoch(src.sink(self.schema), log, batchId, prepared, src.run_id)
        log.retain(src.retain, batchId)
        crash_point("sink.after_commit")  # committed, Spark's commit log not yet written

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
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
