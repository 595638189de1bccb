"""Spark's own checkpoint logs as tests read them: which batches Spark has committed."""

from __future__ import annotations

import json
import os


def _batch_ids(folder: str) -> list[int]:
    """The batch ids of one of Spark's logs (a file per batch, named by its id), sorted."""
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


def committed_batches(checkpoint_location: str | os.PathLike[str]) -> list[int]:
    """The batch ids in Spark's commit log under ``checkpoint_location``, sorted (empty before
    the first commit)."""
    return _batch_ids(os.path.join(os.fspath(checkpoint_location), "commits"))


def planned_offsets(checkpoint_location: str | os.PathLike[str]) -> list[str]:
    """The source offsets (one JSON text per source) of the last batch in Spark's offset log under
    ``checkpoint_location``, committed or not ([] before the first)."""
    folder = os.path.join(os.fspath(checkpoint_location), "offsets")
    planned = _batch_ids(folder)
    if not planned:
        return []
    with open(os.path.join(folder, str(planned[-1]))) as f:
        return f.read().splitlines()[2:]  # after the version line and the batch's own metadata


def write_batch(checkpoint_location: str | os.PathLike[str], batch: int, offsets: list[dict],
                committed: bool = True) -> None:
    """Spark's offset log entry of ``batch`` (its sources' end offsets, as Spark writes them) and, when
    ``committed``, its commit log entry: the state a query leaves, without running one."""
    root = os.fspath(checkpoint_location)
    for folder in ("offsets", "commits"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    with open(os.path.join(root, "offsets", str(batch)), "w") as f:
        f.write("v1\n" + json.dumps({"batchWatermarkMs": 0}) + "".join("\n" + json.dumps(o) for o in offsets))
    if committed:
        with open(os.path.join(root, "commits", str(batch)), "w") as f:
            f.write('v1\n{"nextBatchWatermarkMs":0}')
