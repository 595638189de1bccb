"""What ``flinkish mirror`` shows while it runs: a live table on a terminal, plain lines otherwise.

Read, at most once a second while the query runs (not only per committed batch: an epoch of the
snapshot may take a while):

* the source's metadata -- what ``flinkish inspect`` reads: its newest checkpoint, written when an
  epoch is planned, before Spark runs it, and the registry it names -- and Spark's commit log
  (which epoch is committed). So per table: its state (joining, snapshot, streaming) and its
  snapshot chunks committed, read by the running epoch, planned in all (a chunk is a split of
  length 1: the checkpoint counts chunks, not their rows); and the running epoch and its age;
* from Spark's observed metrics of each committed batch (``df.observe``, see
  :func:`flinkish_spark.mirror.pipeline.start_query`) the rows (data rows only: the stream's
  internal rows, a table's schema row ``s`` and re-snapshot markers, are not counted), the
  changes and the commit time of the newest change; the batch's duration gives rows/s;
* the query's status: no data available while every table streams is **caught up** (the source
  is idle: everything up to the database's current position is committed). Spark's event of an
  idle trigger names the batch that has not run yet and carries no observed metrics: it is not a
  batch here (the real one, when it runs, reports the same id).

The lag is ``now - commit time of the newest change the targets hold`` (it grows while the
database is idle: it is the age of the newest change, not a queue length). Rows and changes are
counted for all tables together here; per table they are the routing sink's figures of each
committed epoch (:mod:`flinkish_spark.mirror.counts`, for ``flinkish mirror status`` and the
metrics). Reading the metadata is best effort: a progress view never stops a mirror.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from flinkish_spark.mirror.config import MirrorConfig
from flinkish_spark.mirror.status import NOT_FOLLOWED

OBSERVED = "flinkish_mirror"
_MAX_TABLE_ROWS = 15


@dataclass
class TableProgress:
    #: the registry's state (joining, snapshot, streaming), ``copied`` for a table whose snapshot is read
    #: while the source reads no changes (``--stop-after-snapshot``), ``left`` for a dropped table,
    #: ``not followed`` for a matching table without a usable key (``note`` says why and what to do)
    state: str = "joining"
    chunks_done: int = 0  # snapshot chunks read in committed epochs
    chunks_running: int = 0  # read by the epoch that runs now
    chunks_left: int = 0  # planned, in no epoch yet
    note: str = ""

    @property
    def chunks(self) -> str:
        """``done/planned``, with ``+N`` for the chunks the running epoch reads; ``-`` without a snapshot."""
        total = self.chunks_done + self.chunks_running + self.chunks_left
        if not total:
            return "-"
        return f"{self.chunks_done}/{total}" + (f" +{self.chunks_running}" if self.chunks_running else "")

    @property
    def snapshotted(self) -> bool:
        return self.state in ("streaming", "copied")


@dataclass(frozen=True)
class Running:
    """The epoch Spark runs now (planned, not committed): its source checkpoint id and since when."""

    ckpt: int
    since: float  # epoch seconds


def progress_after(query: Any, newest: int | None) -> list[Any]:
    """The query's progress events of batches after ``newest`` (None: every event Spark keeps), oldest first.

    Spark's ``recentProgress`` costs two py4j calls per event it keeps (100 by default): up to a second per look
    on a loaded driver, where the pipeline's main loop also acts on Ctrl-C. ``lastProgress`` costs two: the
    newest event alone says whether anything is new and, when it is of the next batch, is all there is."""
    last = getattr(query, "lastProgress", None) if newest is not None else None
    if newest is not None and last is not None:
        batch = int(last.batchId)
        if batch <= newest:
            return []
        if batch == newest + 1:
            return [last]
    return sorted((p for p in list(getattr(query, "recentProgress", None) or [])
                   if newest is None or int(p.batchId) > newest), key=lambda p: int(p.batchId))


def is_batch(p: Any) -> bool:
    """Whether a progress event is of a batch Spark ran: it carries the mirror's observed metrics. An idle trigger's
    event (no new data: at most one per noDataProgressEventInterval) names the batch that has not run yet and carries
    none; when that batch runs, its own event has the same id."""
    return (getattr(p, "observedMetrics", None) or {}).get(OBSERVED) is not None


@dataclass
class MirrorState:
    """What the committed batches, the metadata and the query's status say (this run)."""

    epoch: int | None = None
    epoch_at: float | None = None
    rows: int = 0
    changes: int = 0
    last_commit_us: int | None = None
    rate: float | None = None  # rows/s of the newest committed batch that read rows
    last_batch_rows: int | None = None  # data rows of the newest committed batch
    idle: bool = False  # the query's status: no new data at its last trigger
    #: nothing new to mirror: the query found no data, or its newest committed batch had no rows; until a batch
    #: with rows commits (an epoch that runs meanwhile may carry only the WAL's own progress)
    quiet: bool = False
    running: Running | None = None
    started: float = field(default_factory=time.time)
    tables: dict[str, TableProgress] = field(default_factory=dict)
    #: the newest committed batch taken. Batch ids only grow within a query and the events come oldest first (see
    #: :func:`progress_after`): a high-water mark says what was seen, in constant space for a mirror that runs for
    #: months (a set of the ids seen held 2.6 million a month at a 1 s trigger)
    newest_batch: int | None = None

    @property
    def snapshotted(self) -> int:
        return sum(1 for t in self.tables.values() if t.snapshotted)

    @property
    def followed(self) -> list[TableProgress]:
        return [t for t in self.tables.values() if t.state not in ("left", NOT_FOLLOWED)]

    @property
    def not_followed(self) -> dict[str, str]:
        """Matching tables left out for want of a key -> the source's warning (what to do)."""
        return {name: t.note for name, t in self.tables.items() if t.state == NOT_FOLLOWED}

    @property
    def phase(self) -> str:
        """``starting``, ``snapshot`` (a table's snapshot is read), ``streaming`` or ``caught up`` (every table
        streams and the source is idle)."""
        followed = self.followed
        if not followed:
            return "starting"
        if self.snapshotted < len(followed):
            return "snapshot"
        return "caught up" if self.quiet else "streaming"

    def lag_s(self, now: float | None = None) -> float | None:
        if self.last_commit_us is None:
            return None
        return max(0.0, (now or time.time()) - self.last_commit_us / 1e6)

    def elapsed_s(self, now: float | None = None) -> float:
        return max(0.0, (now or time.time()) - self.started)

    def update(self, query: Any) -> bool:
        """Take in the progress events not seen yet, and the query's status; whether a batch was committed."""
        new = False
        for p in progress_after(query, self.newest_batch):
            batch = int(p.batchId)
            if self.newest_batch is not None and batch <= self.newest_batch:
                continue  # taken already: one event per batch id is taken
            if not is_batch(p):
                # An idle trigger's event: taking it as the batch it names hid the real batch's rows and changes
                # (``changes 0`` for an epoch of changes). The query's status says it is idle.
                continue
            self.newest_batch = batch
            new = True
            self._take(p)
        status = getattr(query, "status", None)
        if isinstance(status, dict):
            # Before the first trigger the status also says no data ("Initializing sources"): a restart with a
            # backlog is not caught up until a trigger has looked at the source and found nothing.
            self.idle = (status.get("isDataAvailable") is False and not status.get("isTriggerActive")
                         and not str(status.get("message") or "").startswith("Initializing"))
            self.quiet = self.quiet or self.idle
        return new

    def _take(self, p: Any) -> None:
        if self.epoch is None or p.batchId >= self.epoch:
            self.epoch, self.epoch_at = int(p.batchId), time.time()
        metrics = (getattr(p, "observedMetrics", None) or {}).get(OBSERVED)
        if metrics is None:
            return
        m = observed_values(metrics)
        rows = int(m.get("rows") or 0)
        self.rows += rows
        self.changes += int(m.get("changes") or 0)
        self.last_batch_rows = rows
        self.quiet = rows == 0
        took_ms = (getattr(p, "durationMs", None) or {}).get("triggerExecution")
        if rows and took_ms:
            self.rate = rows / max(took_ms / 1000.0, 0.001)
        ts = m.get("last_commit_us")
        if ts is not None and (self.last_commit_us is None or int(ts) > self.last_commit_us):
            self.last_commit_us = int(ts)

    def take_metadata(self, latest: Any, committed: int | None, tables: Sequence[Any] | None,
                      not_followed: dict[str, str] | None = None) -> None:
        """The source's newest checkpoint ``latest``, the id of the checkpoint Spark's last committed batch names
        (``committed``, None: none yet) and the registry entries of ``latest`` (None: not a multi-table source
        yet): each table's state and chunks, and the running epoch; ``not_followed``: the tables the source leaves
        out for want of a key -> its warning."""
        from flinkish_spark.connectors.cdc.splits import table_of_chunk

        if latest is None or tables is None:
            return
        running = latest.ckpt_id != committed and latest.parent_id == committed
        if not running:
            self.running = None
        elif self.running is None or self.running.ckpt != latest.ckpt_id:
            self.running = Running(latest.ckpt_id, latest.created_ms / 1000.0)
        counts: dict[int, list[int]] = {}  # tid -> [done, running, left]
        for s in latest.splits:
            if not _is_table_chunk(s.split_id):
                continue
            slot = counts.setdefault(table_of_chunk(s.split_id), [0, 0, 0])
            if s.finished and running and s.finished_in == latest.ckpt_id:
                slot[1] += 1
            elif s.finished and (committed is None or s.finished_in is None or s.finished_in <= committed):
                slot[0] += 1
            else:
                slot[2] += 1
        left_out = not_followed or {}
        for name in set(self.tables) - {e.name for e in tables} - set(left_out):
            if self.tables[name].state != NOT_FOLLOWED:
                self.tables[name].state = "left"
            else:
                del self.tables[name]  # dropped, or excluded, while left out: nothing to show
        for name, text in left_out.items():
            self.tables[name] = TableProgress(NOT_FOLLOWED, note=str(text))
        for e in tables:
            before = self.tables.get(e.name)
            if e.tid in counts:
                done, now, left = counts[e.tid]
            elif before is not None and e.state == "streaming":
                # finished chunks leave the checkpoints once the snapshot is over: keep what was counted
                done, now, left = before.chunks_done + before.chunks_running + before.chunks_left, 0, 0
            else:
                done = now = left = 0
            state = e.state
            # A table stays 'snapshot' in the registry when no change split follows (startup=snapshot): its
            # snapshot is read once every chunk of it is committed.
            if state == "snapshot" and done and not (now or left):
                state = "copied"
            self.tables[e.name] = TableProgress(state, done, now, left)


def observed_values(metrics: Any) -> dict[str, Any]:
    """An observed metric of a progress event as ``{name: value}``. A Spark Connect client's events carry it as
    ``Row(values=[...], schema={"fields": [{"name": ...}, ...]})`` (pyspark 4 parses the event's JSON so), a
    Classic driver's as a Row of the named fields."""
    m = metrics.asDict() if hasattr(metrics, "asDict") else dict(metrics)
    schema = m.get("schema")
    if set(m) == {"values", "schema"} and isinstance(schema, dict):
        return {f.get("name"): v for f, v in zip(schema.get("fields") or [], m.get("values") or [])}
    return m


def _is_table_chunk(split_id: str) -> bool:
    return split_id.startswith("snapshot-") and "-t" in split_id


class Metadata:
    """Reads what :meth:`MirrorState.take_metadata` takes: the source's newest checkpoint and its registry under
    the mirror's ``--checkpoint``, and the checkpoint Spark's last committed batch names (its local commit log).
    A look lists the source's folder; a checkpoint and a registry file are read once each."""

    def __init__(self, config: MirrorConfig) -> None:
        self.config = config
        self._store: Any = None
        self._latest: Any = None
        self._tables: tuple[bytes, Any] | None = None  # (enumerator state, its registry's entries)

    def read(self) -> tuple[Any, int | None, Sequence[Any] | None, dict[str, str]]:
        from flinkish_spark.checkpoint.store import SourceCheckpointStore
        from flinkish_spark.connectors.cdc import registry
        from flinkish_spark.connectors.cdc.patterns import read_not_followed
        from flinkish_spark.io.fileio import FileIO, storage_options_from
        from flinkish_spark.mirror.finished import committed_offset

        if self._store is None:
            root = self.config.checkpoint.rstrip("/")
            options = storage_options_from(dict(self.config.source_extra), root)
            self._store = SourceCheckpointStore(FileIO.for_url(root, options, what="--checkpoint"), root,
                                                self.config.uid, kind="")
        committed = committed_offset(self.config.spark_checkpoint, self.config.uid)
        ids = self._store.ids()
        if not ids:
            return None, None, None, {}
        if self._latest is None or self._latest.ckpt_id != ids[-1]:
            self._latest = self._store.read(ids[-1])
        state = self._latest.enumerator_state
        if self._tables is None or self._tables[0] != state:
            reg = registry.of_state(self._store.io, self._store.directory, state)
            self._tables = (state, None if reg is None else reg.entries)
        ckpt = committed.ckpt if committed is not None and committed.ckpt >= 0 else None
        return self._latest, ckpt, self._tables[1], read_not_followed(self._store.io, self._store.directory)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


def _rate(rows_per_s: float | None) -> str:
    return "-" if rows_per_s is None else f"{rows_per_s:,.0f}"


class Progress:
    """Plain lines: one per committed batch, one when the mirror is caught up, and notes. For pipes, logs, CI."""

    #: how often the metadata is read (seconds): the running epoch's chunks, the tables' states
    LOOK_EVERY_S = 1.0

    def __init__(self, config: MirrorConfig, metadata: Any = None) -> None:
        self.config = config
        self.state = MirrorState()
        self.metadata = metadata if metadata is not None else Metadata(config)
        self._looked = 0.0
        self._phase = self.state.phase
        self._left_out: dict[str, str] = {}

    @staticmethod
    def for_stdout(config: MirrorConfig) -> "Progress":
        return LiveProgress(config) if sys.stdout.isatty() else Progress(config)

    def summary(self) -> str:
        """``epoch N: tables snapshotted S/T, rows R (changes C), X rows/s, lag L, elapsed E``."""
        s = self.state
        return (f"epoch {s.epoch if s.epoch is not None else '-'}: tables snapshotted {s.snapshotted}/"
                f"{len(s.followed)}, rows {s.rows} (changes {s.changes}), {_rate(s.rate)} rows/s, "
                f"lag {_age(s.lag_s())}, elapsed {_age(s.elapsed_s())}")

    def look(self, query: Any, force: bool = False) -> bool:
        """Take in the query's events and status and (at most every :attr:`LOOK_EVERY_S`) the metadata; whether a
        batch was committed since the last look."""
        new = self.state.update(query)
        if force or new or time.monotonic() - self._looked >= self.LOOK_EVERY_S:
            self._looked = time.monotonic()
            try:
                self.state.take_metadata(*self.metadata.read())
            except Exception:  # noqa: BLE001 - best effort (see the module docstring)
                pass
        return new

    def _warn_left_out(self) -> None:
        """A note for each table newly left out (the source's warning: why, and what to do)."""
        now = self.state.not_followed
        for name, text in sorted(now.items()):
            if self._left_out.get(name) != text:
                self.note(f"warning: {text}")
        self._left_out = now

    def update(self, query: Any) -> None:
        if self.look(query):
            print(self.summary(), flush=True)
        self._warn_left_out()
        phase = self.state.phase
        if phase != self._phase:
            self._phase = phase
            if phase == "caught up":
                print(f"caught up: every table streams and the source is idle (lag {_age(self.state.lag_s())})",
                      flush=True)

    def note(self, text: str) -> None:
        print(f"flinkish mirror: {text}", flush=True)

    def close(self) -> None:
        pass


class LiveProgress(Progress):
    """A rich live view, redrawn every poll: the phase and the figures, the running epoch, and one line per table
    (state, snapshot chunks committed / planned and those the running epoch reads)."""

    def __init__(self, config: MirrorConfig, console: Any = None, metadata: Any = None) -> None:
        super().__init__(config, metadata)
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console()
        self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
        self.live.start()

    def headline(self) -> str:
        s = self.state
        running = ""
        if s.running is not None:
            reading = sum(t.chunks_running for t in s.tables.values())
            running = (f"; epoch running for {_age(max(0.0, time.time() - s.running.since))}"
                       + (f", reading {reading} chunks" if reading else ""))
        return f"{self.config.name} -- {s.phase}{running}\n{self.summary()}"

    def _render(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        s = self.state
        table = Table()
        for col in ("table", "state", "snapshot chunks (+ in this epoch)"):
            table.add_column(col, justify="right" if col.startswith("snapshot") else "left")
        items = sorted(s.tables.items())
        for name, t in items[:_MAX_TABLE_ROWS]:
            table.add_row(name, t.state, t.chunks if t.state != NOT_FOLLOWED else "no key")
        if len(items) > _MAX_TABLE_ROWS:
            table.add_row(f"... {len(items) - _MAX_TABLE_ROWS} more", "", "")
        return Group(Text(self.headline(), style="bold"), table)

    def update(self, query: Any) -> None:
        self.look(query)
        self._warn_left_out()
        self.live.update(self._render())  # the lag and the epoch's age move with the clock: redraw every poll

    def note(self, text: str) -> None:
        self.console.print(f"flinkish mirror: {text}")

    def close(self) -> None:
        if self.live.is_started:
            self.live.stop()
