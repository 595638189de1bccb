"""The enumerator part that owns a CDC source's change split, whatever the database (driver).

A source reads its snapshot chunks, then one ``changes-<g>`` split in log order. What is the same for
PostgreSQL's slot and MySQL's binary log, through the dialect (:class:`.dialect.ChangeLogDialect`):

* **Extent**: the next range ends at ``change_target(position, maxRowsPerTrigger)``, a transaction boundary
  the dialect fixed when planned, so every replay of the range reads the same transactions; a drain reads up
  to ``change_target(position, None)``.
* **A lost position** (a dropped slot, a purged binary log) is checked at every planning
  (``position_lost``): ``onSlotLost=fail`` stops with the dialect's error; ``resnapshot`` starts a new
  generation (new chunks, a new change split; the old splits end where they are).
* **Completion**: the change split's committed position is handed to ``release`` (PostgreSQL advances its slot).
* **Where the change split starts**: a split's position begins at 0. A log whose positions mean something
  without a slot (MySQL) records its start in the split's payload (:func:`change_split`, :func:`change_start`);
  0 then stands for it, in the enumerator and in the reader (:class:`.tables_reader.TablesReaderCore`).
* **Pieces**: a range may be read by several tasks at once when the dialect names interior transaction
  boundaries of it (``range_cuts``; MySQL: a binary log repeats its table maps in every transaction, so a
  reader can start at any transaction boundary; PostgreSQL: none, a slot has one reader). The planning records
  them in the enumerator's state (``pieces``: the split, the range and its cuts), which is in the checkpoint
  that names the range, and :func:`epoch_pieces` cuts the epoch's range there when Spark asks for its
  partitions -- from that checkpoint alone, so a replay reads the same pieces in the same partitions. The
  stream's order holds across them: every row of a piece has a ``_lsn`` at or after its start and before the
  next piece's start, and a transaction is never cut, so ``(_lsn, _seq)`` -- the order the sinks apply an
  epoch's changes in -- is the log's order whatever task read a row.

Subclasses provide ``_start`` (the first planning of a generation) and may check more at each planning
(:meth:`ChangeSplitEnumerator._check_planning`).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any, Collection, Sequence

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.cdc.dialect import ChangeLogDialect
from flinkish_spark.connectors.cdc.host import ChangeSourceHost
from flinkish_spark.connectors.cdc.splits import changes_id, split_generation
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.planning import ReadRange
from flinkish_spark.source.split import Split, SplitExtent


def change_split(generation: int, start: int | None = None) -> Split:
    """The change split of ``generation``; ``start``: the log position its position 0 stands for (None: the
    dialect's own, e.g. a slot's)."""
    return Split(changes_id(generation), None if start is None else json.dumps({"start": start}))


def change_start(split: Split, position: int) -> int:
    """``position`` of the change split ``split`` as a log position (0: where the split starts)."""
    if position or not split.payload:
        return position
    return int(json.loads(split.payload).get("start", 0))


def epoch_pieces(ranges: Sequence[ReadRange], state: bytes | None) -> list[ReadRange]:
    """``ranges`` (an epoch's, :func:`flinkish_spark.source.planning.read_ranges`) with the change range cut into
    the pieces the enumerator's ``state`` of the same checkpoint names (see the module docstring); a range the
    record does not name exactly (its split, start and end) stays whole."""
    record = json.loads(state).get("pieces") if state else None
    if not record:
        return list(ranges)
    out: list[ReadRange] = []
    for r in ranges:
        if (r.split_id, r.start, r.end) != (record["split"], record["start"], record["end"]):
            out.append(r)
            continue
        bounds = [r.start, *(int(c) for c in record["cuts"]), r.end]
        out += [ReadRange(r.split_id, r.payload, a, b) for a, b in zip(bounds, bounds[1:])]
    return out


class ChangeSplitEnumerator(SplitEnumerator):
    """Owns the change split (see the module docstring)."""

    source: ChangeSourceHost
    dialect: ChangeLogDialect

    def __init__(self, source: ChangeSourceHost) -> None:
        self.source = source
        self.generation = 0
        self.started = False
        self.snapshot_done = False
        self.changes_discovered = False
        #: the pieces of the change range this planning made (see the module docstring; None: one piece)
        self.pieces: dict[str, Any] | None = None

    # state ----------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        # "pieces" is not restored: it describes the range of the checkpoint it is written with, nothing later
        return {"generation": self.generation, "started": self.started, "snapshot_done": self.snapshot_done,
                "changes_discovered": self.changes_discovered, **({"pieces": self.pieces} if self.pieces else {})}

    def snapshot_state(self) -> bytes:
        return json.dumps(self._state()).encode()

    def restore(self, state: bytes) -> None:
        if state:
            d = json.loads(state)
            self.generation = int(d.get("generation", 0))
            self.started = bool(d.get("started", False))
            self.snapshot_done = bool(d.get("snapshot_done", False))
            self.changes_discovered = bool(d.get("changes_discovered", False))

    # planning ---------------------------------------------------------------------------------

    @property
    def uses_slot(self) -> bool:
        """Whether changes are read (a slot or the log's position is held), not a snapshot only."""
        return self.source.startup != "snapshot"

    @abstractmethod
    def _start(self, known: Collection[str]) -> list[Split]:
        """The first planning of the current generation (chunks, and the change split with startup=changes)."""

    def _change_split(self) -> Split:
        """The change split handed out once the snapshot is read (a subclass may give it its start)."""
        return change_split(self.generation)

    def _check_planning(self) -> None:
        """More to check at each planning while changes are read (default: nothing)."""

    def discover(self, known: Collection[str]) -> list[Split]:
        src = self.source
        self.pieces = None  # a new planning: only its own range may be cut
        if not self.started:
            return self._start(known)
        if self.uses_slot:
            lost = self.dialect.position_lost()
            if lost is not None:
                if src.on_slot_lost == "fail":
                    raise lost
                self.generation += 1  # a new snapshot; the old splits end where they are
                self.snapshot_done = self.changes_discovered = False
                return self._start(known)
            self._check_planning()
        if src.startup != "snapshot" and self.snapshot_done and not self.changes_discovered:
            self.changes_discovered = True
            return [self._change_split()]
        return []

    def extent(self, split: Split, position: int) -> SplitExtent:
        if split_generation(split.split_id) < self.generation:
            return SplitExtent(position, position)  # superseded by a new snapshot after a lost position
        if split.split_id.startswith("snapshot-"):
            return SplitExtent(1, 1)  # a chunk is read whole, in one epoch
        at = change_start(split, position)
        target = self.dialect.change_target(at, self.source.max_rows_per_trigger)
        self._record_pieces(split, position, at, target)
        return SplitExtent(target if target > at else position, None)

    def _record_pieces(self, split: Split, position: int, at: int, target: int) -> None:
        """The pieces of the range ``[position, target)`` of ``split`` (``at``: ``position`` as a log position),
        as the dialect cut it when it planned it (see the module docstring)."""
        self.pieces = None
        if target <= at:
            return
        cuts = sorted({int(c) for c in self.dialect.range_cuts(at, target) if at < c < target})
        if cuts:
            self.pieces = {"split": split.split_id, "start": position, "end": target, "cuts": cuts}

    def drain_position(self, split: Split, position: int) -> int:
        if split_generation(split.split_id) < self.generation:
            return position
        if split.split_id.startswith("snapshot-"):
            return 1  # the drain epoch reads the rest of the snapshot
        at = change_start(split, position)
        target = self.dialect.change_target(at, None)
        self._record_pieces(split, position, at, target)
        return target if target > at else position

    def no_more_splits(self) -> bool:
        if not self.started:
            return False
        return self.source.startup == "snapshot" or self.changes_discovered

    # notifications ------------------------------------------------------------------------------

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        gen_chunks = [s for s in checkpoint.splits if s.split_id.startswith(f"snapshot-{self.generation}-")]
        if self.started and all(s.finished for s in gen_chunks):
            self.snapshot_done = True
        if not self.uses_slot:
            return
        change = next((s for s in checkpoint.splits if s.split_id == changes_id(self.generation)), None)
        if change is not None and change.position > 0:
            self.dialect.release(change.position)
