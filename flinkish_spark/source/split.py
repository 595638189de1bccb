"""Splits: the immutable unit of work of a source (a file, a shard, a generator lane)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    """An immutable description of a split.

    ``split_id`` is unique within its source and stable across restarts (a file's
    path, a shard number). ``payload`` is optional extra text the reader needs
    (e.g. JSON); it is stored while the split is live and dropped once it finished.
    Progress is not part of the split: the checkpoint stores it as an int position.
    """

    split_id: str
    payload: str | None = None


@dataclass(frozen=True)
class SplitExtent:
    """What the enumerator knows, on the driver, about how far a split can be read now.

    ``available`` is the position up to which records exist now (exclusive).
    ``end`` is the split's final position when known (a bounded split); a split
    whose position reaches ``end`` is finished and never read again.
    ``share``: what the split counts for against a budget of splits (``maxFilesPerTrigger``, a
    snapshot's chunks per epoch): 1 unless the enumerator knows it is smaller than its siblings
    (a chunk of a table of a few rows counts its rows' share of a full chunk).
    """

    available: int
    end: int | None = None
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.available < 0:
            raise ValueError(f"available must be >= 0, got {self.available}")
        if self.end is not None and self.available > self.end:
            raise ValueError(f"available ({self.available}) is past the end ({self.end})")
