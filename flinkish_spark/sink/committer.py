"""The driver side of two-phase commit: decide, commit, recognise replays, recover.

For one epoch (the *target* epoch: Spark's batch id plus the incarnation's offset, see
:mod:`flinkish_spark.sink.incarnation`) with the committables its tasks prepared:

0. one listing of the decision log; an undecided epoch below a decided one is refused
   (Spark replays only its last batch: its checkpoint was reset);
1. if the epoch is marked done: a replay of a committed epoch -> abort the replay's
   prepared output; outcome ``ALREADY_COMMITTED``;
2. otherwise record the decision (put-if-absent). If a decision already exists, it is
   the one in force (a crash after deciding): commit *its* committables, abort ours
   (recover-and-commit, outcome ``RECOVERED``);
3. commit the decided committables with the sink (retrying ``RETRY_LATER``), then
   mark the epoch done, the marker recording when and the sink's figures of the decided
   committables (:meth:`~flinkish_spark.sink.protocol.EpochCommitter.figures`);
4. remove what no decided committable names (recover-and-abort of failed attempts);
5. delete the records of done epochs beyond the newest ``retain`` (from the same listing).

Crash points (see flinkish_spark.faults): ``sink.before_decision``,
``sink.after_decision``, ``sink.before_done``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from flinkish_spark.errors import CommitFailedError, CommitRetryExhaustedError
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.incarnation import check_not_behind
from flinkish_spark.sink.protocol import EpochCommitter
from flinkish_spark.faults import crash_point

EpochOutcome = Literal["COMMITTED", "RECOVERED", "ALREADY_COMMITTED"]


@dataclass(frozen=True)
class CommitResult:
    epoch: int
    outcome: EpochOutcome
    committables: int


def commit_epoch(
    sink: EpochCommitter[Any],
    log: DecisionLog,
    epoch: int,
    prepared: list[Any],
    run_id: str,
    retries: int = 5,
    retain: int = 0,
) -> CommitResult:
    ours = [c for c in prepared if c is not None]
    encoded = [sink.encode(c) for c in ours]
    decided, done = log.epochs()
    if epoch in done:
        decision = log.read(epoch)
        outcome: EpochOutcome = "ALREADY_COMMITTED"
        kept = set(decision.committables) if decision is not None else set()
    else:
        if epoch not in decided:
            try:
                check_not_behind(log, epoch, decided)
            except Exception:
                sink.abort(ours, epoch)  # invisible output that will never be committed
                raise
        crash_point("sink.before_decision")
        decision, recorded_now = log.record(epoch, encoded, run_id)
        crash_point("sink.after_decision")
        kept = set(decision.committables)
        decided_now = [sink.decode(b) for b in decision.committables]
        _commit(sink, decided_now, epoch, log, retries)
        crash_point("sink.before_done")
        log.mark_done(epoch, _figures(sink, decided_now))
        outcome = "COMMITTED" if recorded_now else "RECOVERED"
    extra = [c for c, b in zip(ours, encoded) if b not in kept]
    if extra:
        sink.abort(extra, epoch)
    sink.cleanup(epoch, [sink.decode(b) for b in kept])
    if retain > 0:
        log.retain(retain, epoch, (sorted({*decided, epoch}), {*done, epoch}))
    return CommitResult(epoch, outcome, len(kept))


def _figures(sink: EpochCommitter[Any], committables: list[Any]) -> Any:
    """The sink's figures of the decided committables; a figure never fails a commit (None: not recorded)."""
    try:
        return sink.figures(committables)
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def _commit(sink: EpochCommitter[Any], committables: list[Any], epoch: int, log: DecisionLog, retries: int) -> None:
    delay = 0.5
    for attempt in range(retries + 1):
        outcome = sink.commit(committables, epoch)
        if outcome in ("COMMITTED", "ALREADY_COMMITTED"):
            return
        if outcome == "FAILED":
            raise CommitFailedError(
                f"sink uid {log.uid!r} failed to commit epoch {epoch}; its decision is recorded in "
                f"{log.path(epoch)}, so a restart retries the commit. Fix the target and restart."
            )
        if attempt < retries:
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise CommitRetryExhaustedError(
        f"sink uid {log.uid!r} answered 'retry later' {retries + 1} times for epoch {epoch}; "
        "the decision is recorded and a restart retries the commit"
    )
