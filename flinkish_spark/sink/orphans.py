"""Find and remove staged output that a crash left behind in a ``flinkish.parquet`` path.

A staged file is an orphan when no commit will ever make it visible:

* its epoch is done (committed) and the file is not what was committed (a failed
  attempt, a replay), or
* its epoch has no decision and a later epoch is decided (Spark moved past it).

Staged files of the newest epochs without a decision may belong to a running or
crashed query that will redo them on restart: they are reported as ``pending`` and
only removed with ``include_pending=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flinkish_spark.connectors.parquet_sink import STAGING, decode_committable
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog

OrphanState = Literal["orphan", "pending", "decided"]


@dataclass(frozen=True)
class StagedEntry:
    epoch: int
    path: str
    state: OrphanState


def scan(data_io: FileIO, path: str, log: DecisionLog) -> list[StagedEntry]:
    decided, done = log.epochs()
    last_decided = decided[-1] if decided else -1
    staging = f"{path.rstrip('/')}/{STAGING}/{log.uid}"
    out: list[StagedEntry] = []
    for full in data_io.find(staging):
        rel = full.split(f"{STAGING}/{log.uid}/", 1)[-1]
        epoch_text = rel.split("/", 1)[0]
        if not epoch_text.isdigit():
            continue
        epoch = int(epoch_text)
        state: OrphanState
        if epoch in done:
            state = "orphan"
        elif epoch in decided:
            decision = log.read(epoch)
            names: set[str] = set()
            if decision is not None:
                for raw in decision.committables:
                    names.update(data_io.strip(f.staged) for f in decode_committable(raw).files)
            state = "decided" if full in names else "orphan"
        elif epoch < last_decided:
            state = "orphan"
        else:
            state = "pending"
        out.append(StagedEntry(epoch, data_io.url(full), state))
    return out


def remove(data_io: FileIO, entries: list[StagedEntry], include_pending: bool = False) -> list[StagedEntry]:
    doomed = [e for e in entries if e.state == "orphan" or (include_pending and e.state == "pending")]
    data_io.delete_many([e.path for e in doomed])
    return doomed
