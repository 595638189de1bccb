"""The driver-side half of a split source (Flink's SplitEnumerator).

It lives in Spark's long-lived Python worker on the driver. It discovers
splits, says how far each can be read, and knows when it will never produce
another split. Its state is stored with every checkpoint the source writes
and handed back through :meth:`SplitEnumerator.restore` on restart.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Collection

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.source.split import Split, SplitExtent


class SplitEnumerator(ABC):
    #: Whether checkpoints keep a (compact) record of every split that ever finished. Such a
    #: record makes ``discover(known)`` name it, so an enumerator that finds splits by listing
    #: (files) never hands one out twice. An enumerator that knows from its own state which
    #: splits it has handed out (a database's snapshot chunks) sets False: a split that
    #: finished in an earlier epoch then leaves the checkpoint, whose size stays O(live splits).
    keep_finished_splits: bool = True

    @abstractmethod
    def discover(self, known: Collection[str]) -> list[Split]:
        """Return splits not in ``known`` (ids of every split ever seen, finished included)."""

    @abstractmethod
    def extent(self, split: Split, position: int) -> SplitExtent:
        """How far ``split`` can be read now, given that it was read up to ``position``."""

    @abstractmethod
    def no_more_splits(self) -> bool:
        """True once :meth:`discover` will never return a new split (a bounded source)."""

    def drain_position(self, split: Split, position: int) -> int:
        """Where a stop with drain ends ``split``, read up to ``position`` so far.

        Default: where it is (drain ends the input now). A source whose "now" lies ahead of
        what it has planned (a change stream: the current WAL position) returns that, and
        the drain epoch reads up to it.
        """
        return position

    def drain_ready(self) -> bool:
        """Whether a stop with drain may end the input now (default: yes).

        A source with work it must plan before its input may end -- a table's snapshot that waits
        for a moment when it can be read exactly -- says no; the query then runs normal epochs
        (the drain request stays) until it says yes.
        """
        return True

    def snapshot_state(self) -> bytes:
        """Opaque state stored with each checkpoint (default: none)."""
        return b""

    def restore(self, state: bytes) -> None:
        """Restore from :meth:`snapshot_state` output of the checkpoint Spark resumes from."""

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        """``checkpoint``'s epoch is committed by the sink and will never be replayed.

        Called once or more per checkpoint (make it idempotent), in checkpoint order.
        The place for work that must wait until data is safely out: deleting or
        archiving input files, acknowledging messages.
        """
