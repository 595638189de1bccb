"""Exactly-once ``foreachBatch``: :func:`transactional` wraps a two-phase-commit sink.

Spark's ``foreachBatch`` is at-least-once: after a crash between the user's write and
Spark's commit log, the same ``batch_id`` runs again. The function returned by
:func:`transactional` records every batch's decision in the decision log, so

* a batch whose commit is done is skipped (its replay prepares nothing);
* a batch that was decided but not fully committed is completed from the recorded
  decision (recover-and-commit), without recomputing the DataFrame;
* otherwise the DataFrame is prepared on the executors (``mapInArrow``), decided and
  committed, exactly as the ``writeStream.format(...)`` adapter does.

Before the first batch of a run prepares anything, the incarnation is resolved
(:mod:`flinkish_spark.sink.incarnation`): a Spark checkpoint that was deleted or replaced
under epochs the decision log or the target holds is refused, or -- with
``continue_after_epoch=N`` -- its batches are numbered after epoch N in the target.

:func:`transactional_with` is the same with a driver-side prepare (a whole Spark job per
batch instead of one call per task): :func:`flinkish_spark.files_sink` is built on it.

Example::

    sink = ParquetSink.at("s3://bucket/out", uid="orders", schema=df.schema)
    df.writeStream.foreachBatch(transactional(sink, uid="orders", checkpoint="s3://bucket/meta")).start()
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa

from flinkish_spark.checkpoint.layout import UID_PATTERN, join
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.sink import incarnation
from flinkish_spark.sink.committer import CommitResult, commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.incarnation import Incarnation, check_not_behind
from flinkish_spark.sink.lease import DEFAULT_TIMEOUT_S, Lease
from flinkish_spark.sink.protocol import EpochCommitter, TwoPhaseCommitSink
from flinkish_spark.faults import crash_point


def transactional(
    sink: TwoPhaseCommitSink[Any],
    uid: str,
    checkpoint: str,
    storage_options: Mapping[str, str] | None = None,
    lease_timeout: float = DEFAULT_TIMEOUT_S,
    on_commit: Callable[[CommitResult], None] | None = None,
    continue_after_epoch: int | None = None,
) -> Callable[[Any, int], None]:
    """Return a ``foreachBatch`` function that applies each batch to ``sink`` exactly once.

    ``continue_after_epoch``: only after Spark's checkpointLocation was deleted or replaced
    while ``sink`` holds epochs of ``uid`` (the first batch is refused otherwise, naming the
    epoch): number this query's batches after that epoch in the target."""
    return transactional_with(
        sink, lambda df, epoch: _prepare_on_executors(df, sink, uid, epoch),
        uid, checkpoint, storage_options, lease_timeout, on_commit, continue_after_epoch,
    )


def transactional_with(
    committer: EpochCommitter[Any],
    prepare: Callable[[Any, int], list[Any]],
    uid: str,
    checkpoint: str,
    storage_options: Mapping[str, str] | None = None,
    lease_timeout: float = DEFAULT_TIMEOUT_S,
    on_commit: Callable[[CommitResult], None] | None = None,
    continue_after_epoch: int | None = None,
) -> Callable[[Any, int], None]:
    """Like :func:`transactional`, with a driver-side ``prepare(df, epoch) -> committables``.

    For sinks whose prepare is a whole Spark job started from the driver (Spark's own
    ``DataFrameWriter``: :func:`flinkish_spark.files_sink`) instead of one call per task.
    ``prepare`` is called only for batches without a decision, so a replay of a decided or
    committed batch never recomputes its DataFrame; decision, commit and recovery are
    :func:`~flinkish_spark.sink.committer.commit_epoch`'s, as for every other sink.
    """
    if not isinstance(uid, str) or not UID_PATTERN.match(uid):
        raise ConfigError(f"transactional(): uid must be 1-128 letters, digits, '_', '-' or '.', got {uid!r}")
    if continue_after_epoch is not None and (not isinstance(continue_after_epoch, int) or continue_after_epoch < 0):
        raise ConfigError(f"transactional(): continue_after_epoch must be an epoch number >= 0, got {continue_after_epoch!r}")
    root = checkpoint.rstrip("/")
    io = FileIO.for_url(root, storage_options_from(dict(storage_options or {}), root), what="checkpoint")
    io.check_writable_root(root, "checkpoint")
    log = DecisionLog(io, root, uid)
    run_id = uuid.uuid4().hex
    # Made on first use, in the process that runs the batches (the driver's Python process; under
    # Spark Connect the server's Python process this function is pickled to -- a Lease holds locks
    # and does not pickle). That process is the run: its pid tells a dead run on this host.
    leases: list[Lease] = []
    # Resolved at a run's first batch, per Spark query id: the function may serve several runs
    # (a notebook starting it again after deleting the checkpointLocation).
    resolved: dict[str | None, Incarnation] = {}

    def apply(df: Any, batch_id: int) -> None:
        if not leases:
            leases.append(Lease(io, join(log.directory, "_lease.json"), run_id, f"foreachBatch sink uid {uid!r}",
                                lease_timeout, pid_is_liveness=True))
        leases[0].renew()
        query_id = _query_id(df)
        current = resolved.get(query_id)
        if current is None:
            current = resolved[query_id] = incarnation.resolve(
                io, log, committer.last_committed_epoch, query_id, None, continue_after_epoch,
                "continue_after_epoch", first_batch=batch_id)
        epoch = current.epoch(batch_id)
        prepared: list[Any] = []
        decided, done = log.epochs()
        if epoch not in decided:
            check_not_behind(log, epoch, decided)  # before any task writes
            prepared = prepare(df, epoch)
        result = commit_epoch(committer, log, epoch, prepared, run_id, retain=10)
        if on_commit is not None:
            on_commit(result)
        crash_point("sink.after_commit")  # the target committed, Spark's commit log not yet

    return apply


def _query_id(df: Any) -> str | None:
    """The id of the streaming query running this batch (Spark keeps it across restarts from
    the same checkpointLocation); None where it cannot be read (Spark Connect)."""
    try:
        value = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # noqa: BLE001 - no SparkContext here (Spark Connect): no id
        return None
    return str(value) if value else None


def _prepare_on_executors(df: Any, sink: TwoPhaseCommitSink[Any], uid: str, epoch: int) -> list[Any]:
    from flinkish_spark.sink.datasource import task_context

    def prepare_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        committable = sink.prepare(batches, task_context(uid, epoch))
        payload = [] if committable is None else [sink.encode(committable)]
        yield pa.RecordBatch.from_pydict({"committable": pa.array(payload, pa.binary())})

    rows = df.mapInArrow(prepare_partition, "committable binary").collect()
    return [sink.decode(bytes(r.committable)) for r in rows]
