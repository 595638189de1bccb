"""The checkpoint metadata model: what one source records for one epoch.

Flink stores, per operator, its subtask states plus (since FLIP-147) whether the
operator has finished; a FLIP-27 source adds its enumerator (coordinator) state.
Here a *source checkpoint* is the same for one flinkish source and one epoch:

* one :class:`SplitRecord` per known split, with the position the epoch starts
  at and the position it ends at, and a ``finished`` flag;
* the enumerator's opaque state and whether it will ever hand out more splits.

Finished splits are kept compactly (id and final position only, no payload),
so the size of a checkpoint is O(live splits) plus a small fixed cost per
finished split, and never grows with the number of epochs.

All types are frozen: a checkpoint, once written, never changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SourceStatus = Literal["RUNNING", "PARTIALLY_FINISHED", "FINISHED"]


@dataclass(frozen=True)
class SplitRecord:
    """One split's progress in one epoch.

    ``start`` is the position at the beginning of the epoch, ``position`` the
    position at its end (exclusive: the next record to read). ``end`` is the
    split's known end, or ``None`` while it is unbounded. ``finished_in`` is
    the id of the checkpoint in which the split finished.
    """

    split_id: str
    start: int
    position: int
    end: int | None = None
    finished: bool = False
    finished_in: int | None = None
    payload: str | None = None

    @property
    def rows_in_epoch(self) -> int:
        return self.position - self.start

    def compact(self) -> "SplitRecord":
        """The form kept for a split that finished in an earlier epoch."""
        return SplitRecord(
            split_id=self.split_id,
            start=self.position,
            position=self.position,
            end=self.end,
            finished=True,
            finished_in=self.finished_in,
            payload=None,
        )


@dataclass(frozen=True)
class SourceCheckpoint:
    """Everything a source needs to plan, replay and resume one epoch."""

    uid: str
    kind: str
    ckpt_id: int
    parent_id: int | None
    created_ms: int
    config: str
    enumerator_state: bytes
    no_more_splits: bool
    splits: tuple[SplitRecord, ...] = field(default=())

    @property
    def status(self) -> SourceStatus:
        finished = sum(1 for s in self.splits if s.finished)
        if self.no_more_splits and finished == len(self.splits):
            return "FINISHED"
        if finished:
            return "PARTIALLY_FINISHED"
        return "RUNNING"

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"

    @property
    def live_splits(self) -> tuple[SplitRecord, ...]:
        return tuple(s for s in self.splits if not s.finished)

    def split_map(self) -> dict[str, SplitRecord]:
        return {s.split_id: s for s in self.splits}

    def splits_finished_here(self) -> tuple[SplitRecord, ...]:
        """Splits that reached their end in this epoch (their last rows are read here)."""
        return tuple(s for s in self.splits if s.finished and s.finished_in == self.ckpt_id)
