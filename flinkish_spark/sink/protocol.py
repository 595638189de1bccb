"""The two-phase-commit sink protocol (Flink's TwoPhaseCommitSinkFunction / Sink V2 Committer).

Implement :class:`TwoPhaseCommitSink` for any transactional target:

* :meth:`~TwoPhaseCommitSink.prepare` runs on executors, once per task attempt: write
  the task's rows *invisibly* (staging files, an open transaction, an unfinished
  upload) and return a picklable *committable* that describes them (or ``None``).
* :meth:`~TwoPhaseCommitSink.commit` runs on the driver with every committable of one
  epoch, after the framework durably recorded the decision to commit them. It must be
  idempotent: it may run again for the same epoch after a crash (recover-and-commit).
  It answers with a :data:`CommitOutcome`.
* :meth:`~TwoPhaseCommitSink.abort` removes prepared output that will never be committed
  (failed epochs, replays whose epoch was already decided).
* :meth:`~TwoPhaseCommitSink.cleanup` removes leftovers of an epoch that no committable
  names (failed task attempts, attempts of a crashed run) -- the recover-and-abort step.
  It must never remove a file that a committed version of the target names.
* :meth:`~EpochCommitter.figures` (optional) sums what an epoch's committables carry (rows per table): the
  framework records it with the epoch's ``.done`` marker, once per epoch, from the decided committables.
* :meth:`~EpochCommitter.last_committed_epoch` answers from the *target* which epoch of the
  sink uid it holds last (its idempotence record). The framework asks it when the sink's
  metadata is missing or belongs to another Spark query (a deleted checkpointLocation), so
  that epochs already in the target are never taken for new ones
  (:mod:`flinkish_spark.sink.incarnation`).

The framework (:mod:`flinkish_spark.sink.committer`) owns the decision log, replay
detection, fencing and retries; a sink only moves its own data.

:class:`EpochCommitter` is the driver half alone (commit, abort, cleanup, encode, decode):
what :func:`~flinkish_spark.sink.committer.commit_epoch` needs. A sink whose prepare is not
a per-task function -- e.g. :mod:`flinkish_spark.connectors.spark_files`, where Spark's own
``DataFrameWriter`` job prepares a whole epoch -- implements only that half.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, Iterator, Literal, Mapping, TypeVar

import pyarrow as pa

CommitOutcome = Literal["COMMITTED", "ALREADY_COMMITTED", "RETRY_LATER", "FAILED"]
C = TypeVar("C")


@dataclass(frozen=True)
class PrepareContext:
    """Where a prepare call runs: the sink uid, the epoch, the Spark partition and attempt."""

    uid: str
    epoch: int
    partition_id: int
    attempt: int


class EpochCommitter(ABC, Generic[C]):
    """The driver side of a two-phase-commit sink: make an epoch's prepared output visible or remove it."""

    @abstractmethod
    def commit(self, committables: list[C], epoch: int) -> CommitOutcome:
        """Make the prepared output of ``epoch`` visible. Idempotent."""

    @abstractmethod
    def abort(self, committables: list[C], epoch: int) -> None:
        """Remove prepared output that will not be committed. Idempotent."""

    def cleanup(self, epoch: int, keep: list[C]) -> None:
        """Remove prepared output of ``epoch`` that no committable in ``keep`` names (default: none).

        Never a file that a committed version of the target names, whatever ``keep`` says."""

    def figures(self, committables: list[C]) -> Mapping[str, Any] | None:
        """What an epoch with these (decided) committables carries, for a status -- e.g. rows per table (the
        routing sinks: :mod:`flinkish_spark.connectors.lakehouse.figures`); JSON-able, recorded with the epoch's
        ``.done`` marker. Default None: no figures."""
        return None

    def last_committed_epoch(self) -> int | None:
        """The last epoch of this sink uid that the target holds, -1 for none; None when the
        target cannot tell (the default: then only the sink's metadata guards against a reset)."""
        return None

    def encode(self, committable: C) -> bytes:
        """Serialise a committable for the decision log (default: pickle)."""
        return pickle.dumps(committable)

    def decode(self, data: bytes) -> C:
        result: Any = pickle.loads(data)
        return result


class TwoPhaseCommitSink(EpochCommitter[C]):
    """An :class:`EpochCommitter` whose prepare runs on executors, once per task attempt."""

    @abstractmethod
    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> C | None:
        """Write ``batches`` invisibly; return what commit needs, or None when nothing was written."""
