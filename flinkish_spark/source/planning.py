"""Pure planning of the next epoch of a split source (no I/O, no Spark).

Given the splits of the previous checkpoint, newly discovered splits, what each
split has available now, and an admission budget, decide every split's end
position for the next epoch and which splits finish in it. Also turn a
checkpoint into the read ranges of its epoch.

These functions are deterministic: the same inputs always give the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.source.split import Split, SplitExtent


@dataclass(frozen=True)
class Budget:
    """Admission control for one epoch; ``None`` means unlimited."""

    max_units: int | None = None  # records (rows) across all splits
    max_splits: int | None = None  # splits advanced (files)


@dataclass(frozen=True)
class ReadRange:
    split_id: str
    payload: str | None
    start: int
    end: int


def plan_epoch(
    previous: Sequence[SplitRecord],
    discovered: Sequence[Split],
    extents: Mapping[str, SplitExtent],
    budget: Budget,
    ckpt_id: int,
    keep_finished: bool = True,
) -> tuple[tuple[SplitRecord, ...], bool]:
    """Return the split records of checkpoint ``ckpt_id`` and whether anything changed.

    ``extents`` has an entry for every live split (previous live + discovered).
    Splits that finished earlier keep their compact record (``keep_finished``) or are left out. Order is stable:
    previous splits first, then discovered ones in discovery order, which also
    decides who goes first under a budget (oldest first).
    """
    live: list[tuple[str, str | None, int]] = []  # (id, payload, position)
    for rec in previous:
        if not rec.finished:
            live.append((rec.split_id, rec.payload, rec.position))
    for split in discovered:
        live.append((split.split_id, split.payload, 0))

    wants = {sid: max(0, extents[sid].available - pos) for sid, _, pos in live}
    grants = _allocate([sid for sid, _, _ in live], wants, budget, {sid: extents[sid].share for sid, _, _ in live})

    changed = bool(discovered)
    new_live: dict[str, SplitRecord] = {}
    for sid, payload, pos in live:
        ext = extents[sid]
        new_pos = pos + grants.get(sid, 0)
        finished = ext.end is not None and new_pos >= ext.end
        if new_pos != pos or finished:
            changed = True
        new_live[sid] = SplitRecord(
            split_id=sid,
            start=pos,
            position=new_pos,
            end=ext.end,
            finished=finished,
            finished_in=ckpt_id if finished else None,
            payload=payload,  # kept for this epoch's read; dropped by compact() after
        )

    records: list[SplitRecord] = []
    for rec in previous:
        if not rec.finished:
            records.append(new_live[rec.split_id])
        elif keep_finished:
            records.append(rec.compact())
    for split in discovered:
        records.append(new_live[split.split_id])
    return tuple(records), changed


def _allocate(order: list[str], wants: Mapping[str, int], budget: Budget,
              shares: Mapping[str, float] | None = None) -> dict[str, int]:
    """Share the budget among splits that have records: oldest first, then evenly. Against ``max_splits`` a
    split counts its :attr:`~flinkish_spark.source.split.SplitExtent.share` (1 unless ``shares`` says less)."""
    candidates = [sid for sid in order if wants[sid] > 0]
    if budget.max_splits is not None:
        taken: list[str] = []
        used = 0.0
        for sid in candidates:
            if used >= budget.max_splits - 1e-9:
                break
            taken.append(sid)
            used += (shares or {}).get(sid, 1.0)
        candidates = taken
    if budget.max_units is None:
        return {sid: wants[sid] for sid in candidates}
    remaining = max(0, budget.max_units)
    grants = {sid: 0 for sid in candidates}
    active = list(candidates)
    # Water-filling: every active split gets an equal share; what a split cannot
    # use goes to the others in the next round. Leftover units go oldest first.
    while remaining > 0 and active:
        share = remaining // len(active)
        if share == 0:
            for sid in active[:remaining]:
                grants[sid] += 1
            break
        still = []
        for sid in active:
            give = min(share, wants[sid] - grants[sid])
            grants[sid] += give
            remaining -= give
            if grants[sid] < wants[sid]:
                still.append(sid)
        active = still
    return grants


def read_ranges(checkpoint: SourceCheckpoint) -> list[ReadRange]:
    """The ranges the epoch of ``checkpoint`` reads; finished-earlier splits never appear."""
    return [
        ReadRange(s.split_id, s.payload, s.start, s.position)
        for s in checkpoint.splits
        if s.position > s.start
    ]
