"""Spark's own checkpoint logs as tests read them: which batches Spark has committed."""

from __future__ import annotations

import os


def committed_batches(checkpoint_location: str | os.PathLike[str]) -> list[int]:
    """The batch ids in Spark's commit log under ``checkpoint_location``, sorted (empty before
    the first commit)."""
    folder = os.path.join(os.fspath(checkpoint_location), "commits")
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []
