"""Per-table counts of a mirror, exact under ``kill -9``: what ``flinkish mirror status``, the metrics
(``--metrics-port``) and :func:`flinkish_spark.mirror_status` show.

Where the figures come from: the routing sink's tasks count each table's rows while they split the
stream -- snapshot rows, changes, truncates, the newest source commit time (``_commit_ts``) of its
changes (:mod:`flinkish_spark.connectors.lakehouse.figures`); the sink's commit sums them over the
*decided* committables and records the sum, with the time the epoch was visible, in the epoch's
``.done`` marker (:meth:`~flinkish_spark.sink.decisions.DecisionLog.read_done`). So an epoch's figures
are durable exactly when its rows are visible, once per epoch however often Spark replays it, and a
restart that commits a decided epoch records that decision's figures.

The record, ``<checkpoint>/sources/<uid>/_mirror_status.json`` (a small JSON file, replaced; readers
and retention ignore it), holds the sums and the newest epoch folded in (:attr:`Record.epoch`, the
sink's target epoch). :func:`fold` adds the done epochs after it, in order, each once. The pipeline
process folds and writes it at its start and after each committed batch
(:class:`flinkish_spark.mirror.metrics.Recorder`); a reader (:func:`current`) folds in memory the
epochs the record does not hold yet. A kill between an epoch's commit and the record's write
(crash point ``mirror.before_status_record``) loses nothing: the next fold -- ``mirror status``, or
the restart -- takes the epoch from its marker.

Not exact (:attr:`Record.exact` false, and the status says so): epochs whose marker holds no
figures (committed by an older flinkish), and epochs the decision log's retention removed
(``retainDecisions``, 10 done epochs) before a fold took them: a gap in the epoch numbers. The
pipeline folds after every batch, so only a record that could not be written for 10 epochs in a row
(the metadata store refusing writes) misses any.

Lag, both from the epoch's ``visible_ms`` (when its ``.done`` marker was written: every table of the
epoch visible) minus a source commit time:

* per table, for its newest epoch with changes: minus the newest commit time of *its* changes in that
  epoch -- how long its newest change took to be visible;
* mirror-wide (as before per-table figures existed), for the newest epoch with changes: minus the
  newest commit time of any change in it. The source reads one WAL in order, so every table then
  holds every change committed up to that time: this is how far behind the targets are. A table's
  figure of the same epoch is larger by the time between its last change and the epoch's newest
  one, which is no backlog; ``max(flinkish_mirror_table_lag_seconds)`` is the largest per table.

Both are frozen while nothing changes (the last change's lag, not its age): the age is now minus
the last change's commit time, also exported.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.connectors.lakehouse.figures import Figures
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog, Done

RECORD = "_mirror_status.json"


@dataclass(frozen=True)
class TableCounts:
    snapshot_rows: int = 0  # rows read by the table's snapshots (all of them: a re-snapshot reads again)
    changes: int = 0  # inserts, updates, deletes and truncates applied
    last_epoch: int | None = None  # the newest committed epoch with rows of the table
    last_commit_us: int | None = None  # source commit time of its newest change visible in its target
    lag_s: float | None = None  # visible - that commit time, for its newest epoch with changes


@dataclass(frozen=True)
class Record:
    """What the folds recorded, cumulated over the mirror's runs."""

    epoch: int | None = None  # the newest sink epoch folded in (None: none yet)
    committed_ms: int | None = None  # when that epoch was visible in the targets
    last_commit_us: int | None = None  # source commit time of the newest change visible in the targets
    lag_s: float | None = None  # visible - source commit time of its newest change, newest epoch with changes
    rows: int = 0  # data rows: snapshot rows and changes (truncates are changes, not rows)
    changes: int = 0
    exact: bool = True  # every epoch's per-table figures were folded in (see the module docstring)
    tables: dict[str, TableCounts] = field(default_factory=dict)
    runs: int = 0  # pipeline process starts: restarts = runs - 1
    errors: int = 0  # runs that ended failed
    last_error: str | None = None
    updated_ms: int = 0
    #: read from a record of an older flinkish, which counted Spark batches: the done epochs there now are
    #: counted in it already (see :func:`fold`)
    legacy: bool = False

    def to_json(self) -> bytes:
        d = asdict(self)
        d.pop("legacy")
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Record":
        d = json.loads(data)
        d["tables"] = {k: TableCounts(**{f: v for f, v in t.items() if f in TableCounts.__dataclass_fields__})
                       for k, t in d.get("tables", {}).items()}
        if "epoch" not in d and d.get("batch") is not None:
            d["legacy"] = True
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def with_done(self, done: Done) -> "Record":
        """This record with epoch ``done.epoch``'s figures folded in (once: an epoch not after :attr:`epoch`
        is ignored)."""
        if self.epoch is not None and done.epoch <= self.epoch:
            return self
        gap = done.epoch > (0 if self.epoch is None else self.epoch + 1)
        by_table = None if done.figures is None else done.figures.get("tables")
        if not isinstance(by_table, dict):
            return replace(self, epoch=done.epoch, exact=False, committed_ms=done.visible_ms or self.committed_ms,
                           updated_ms=_now_ms())
        visible = done.visible_ms
        tables = dict(self.tables)
        rows = changes = 0
        newest = -1
        for name, raw in by_table.items():
            f = Figures.from_json(raw)
            t = tables.get(name, TableCounts())
            touched = f.snapshot_rows or f.changes or f.truncates
            t = replace(t, snapshot_rows=t.snapshot_rows + f.snapshot_rows, changes=t.changes + f.changes + f.truncates,
                        last_epoch=done.epoch if touched else t.last_epoch)
            if f.commit_us >= 0 and (t.last_commit_us is None or f.commit_us >= t.last_commit_us):
                t = replace(t, last_commit_us=f.commit_us, lag_s=_lag(visible, f.commit_us, t.lag_s))
            tables[name] = t
            rows += f.snapshot_rows + f.changes
            changes += f.changes + f.truncates
            newest = max(newest, f.commit_us)
        later = newest >= 0 and (self.last_commit_us is None or newest >= self.last_commit_us)
        return replace(self, epoch=done.epoch, committed_ms=visible or self.committed_ms, tables=tables,
                       rows=self.rows + rows, changes=self.changes + changes, exact=self.exact and not gap,
                       last_commit_us=newest if later else self.last_commit_us,
                       lag_s=_lag(visible, newest, self.lag_s) if later else self.lag_s, updated_ms=_now_ms())


def _lag(visible_ms: int | None, commit_us: int, before: float | None) -> float | None:
    return before if visible_ms is None else max(0.0, visible_ms / 1000 - commit_us / 1e6)


def _now_ms() -> int:
    return int(time.time() * 1000)


def fold(record: Record, log: DecisionLog) -> Record:
    """``record`` with every done epoch of the sink's decision ``log`` after :attr:`Record.epoch` folded in, in
    order: one listing, one read of each new ``.done`` marker. An older flinkish's record (``legacy``) counted
    the epochs done now already: it continues after the newest."""
    _, done = log.epochs()
    if record.legacy:
        return replace(record, legacy=False, epoch=max(done, default=record.epoch))
    out = record
    for epoch in sorted(e for e in done if record.epoch is None or e > record.epoch):
        marker = log.read_done(epoch)
        if marker is not None:  # None: removed meanwhile by retention -- the next epoch's fold marks the gap
            out = out.with_done(marker)
    return out


def path(root: str, uid: str) -> str:
    return join(root, "sources", uid, RECORD)


def read(io: FileIO, root: str, uid: str) -> Record | None:
    """The record of mirror ``uid`` under ``root`` (None: none yet, or unreadable)."""
    try:
        return Record.from_json(io.read_bytes(path(root, uid)))
    except (FileNotFoundError, ValueError, TypeError, KeyError):
        return None


def sink_log(io: FileIO, root: str, uid: str) -> DecisionLog:
    """The decision log of mirror ``uid``'s routing sink (its uid: ``<uid>_sink``)."""
    return DecisionLog(io, root, f"{uid}_sink")


def current(io: FileIO, root: str, uid: str) -> Record:
    """The counts of mirror ``uid`` now: its record with the epochs committed since its last write folded in
    (in memory: a reader never writes the record)."""
    return fold(read(io, root, uid) or Record(), sink_log(io, root, uid))


def write(io: FileIO, root: str, uid: str, record: Record) -> None:
    io.write_bytes(path(root, uid), record.to_json())
