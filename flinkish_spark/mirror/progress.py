"""What ``flinkish mirror`` shows while it runs: a live table on a terminal, plain lines otherwise.

Read, per committed batch (Spark's progress events, ``query.recentProgress``):

* from the source's checkpoint of the batch -- the metadata ``flinkish inspect`` reads -- the
  followed tables and their state (the registry: joining, snapshot, streaming) and each table's
  snapshot chunks read and left (a chunk is a split of length 1: the checkpoint counts chunks,
  not their rows);
* from Spark's observed metrics of the batch (``df.observe``, see
  :func:`flinkish_spark.mirror.pipeline.start_query`) the rows, the changes and the commit time
  of the newest change in it.

So the figures are those of committed epochs: the lag is ``now - commit time of the newest
change the targets hold`` (it grows while the database is idle: it is the age of the newest
change, not a queue length). Rows and changes are counted for all tables together: a per-table
count would need a per-table aggregate in every batch, or the sinks to report it. Reading
the metadata is best effort: a progress view never stops a mirror.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from flinkish_spark.mirror.config import MirrorConfig

OBSERVED = "flinkish_mirror"
_MAX_TABLE_ROWS = 15


@dataclass
class TableProgress:
    #: the registry's state (joining, snapshot, streaming), ``copied`` for a table whose snapshot is read
    #: while the source reads no changes (``--stop-after-snapshot``), ``left`` for a dropped table
    state: str = "joining"
    chunks_done: set[str] = field(default_factory=set)  # ids of the snapshot chunks read (committed)
    chunks_left: int = 0  # planned, not read yet (in the newest checkpoint)

    @property
    def chunks(self) -> str:
        total = len(self.chunks_done) + self.chunks_left
        return f"{len(self.chunks_done)}/{total}" if total else "-"

    @property
    def snapshotted(self) -> bool:
        return self.state in ("streaming", "copied")


@dataclass
class MirrorState:
    """What the committed batches so far say (this run)."""

    epoch: int | None = None
    epoch_at: float | None = None
    rows: int = 0
    changes: int = 0
    last_commit_us: int | None = None
    tables: dict[str, TableProgress] = field(default_factory=dict)
    seen_batches: set[int] = field(default_factory=set)
    _registry_name: str | None = None
    _tids: dict[int, str] = field(default_factory=dict)

    @property
    def snapshotted(self) -> int:
        return sum(1 for t in self.tables.values() if t.snapshotted)

    def lag_s(self, now: float | None = None) -> float | None:
        if self.last_commit_us is None:
            return None
        return max(0.0, (now or time.time()) - self.last_commit_us / 1e6)

    def update(self, query: Any) -> bool:
        """Take in the progress events not seen yet; whether anything new came."""
        new = False
        for p in list(getattr(query, "recentProgress", None) or []):
            batch = int(p.batchId)
            if batch in self.seen_batches:
                continue
            self.seen_batches.add(batch)
            new = True
            self._take(p)
        return new

    def _take(self, p: Any) -> None:
        if self.epoch is None or p.batchId >= self.epoch:
            self.epoch, self.epoch_at = int(p.batchId), time.time()
        metrics = (getattr(p, "observedMetrics", None) or {}).get(OBSERVED)
        if metrics is not None:
            m = metrics.asDict() if hasattr(metrics, "asDict") else dict(metrics)
            self.rows += int(m.get("rows") or 0)
            self.changes += int(m.get("changes") or 0)
            ts = m.get("last_commit_us")
            if ts is not None and (self.last_commit_us is None or int(ts) > self.last_commit_us):
                self.last_commit_us = int(ts)
        try:
            self._read_checkpoint(p)
        except Exception:  # noqa: BLE001 - best effort (see the module docstring)
            pass

    def _read_checkpoint(self, p: Any) -> None:
        from flinkish_spark.checkpoint.store import SourceCheckpointStore
        from flinkish_spark.connectors.postgres.source import registry
        from flinkish_spark.connectors.postgres.source.splits import table_of_chunk
        from flinkish_spark.finish.controller import flinkish_offsets
        from flinkish_spark.io.fileio import FileIO, storage_options_from

        offs = flinkish_offsets(p)
        if not offs or offs[0].ckpt < 0 or offs[0].root is None:
            return
        off, root = offs[0], offs[0].root
        io = FileIO.for_url(root, storage_options_from(off.storage_options(), root), what="metadata root")
        store = SourceCheckpointStore(io, root, off.uid, kind="")
        ckpt = store.read(off.ckpt)
        reg = registry.of_state(io, store.directory, ckpt.enumerator_state)
        if reg is None:
            return
        if reg.file_name != self._registry_name:
            self._registry_name = reg.file_name
            self._tids = {e.tid: e.name for e in reg.entries}
            for name in set(self.tables) - {e.name for e in reg.entries}:
                self.tables[name].state = "left"
        # A table stays 'snapshot' in the registry when no change split follows (startup=snapshot):
        # its snapshot is read once no chunk of it is left unfinished.
        reading = {table_of_chunk(s.split_id) for s in ckpt.splits if _is_table_chunk(s.split_id) and not s.finished}
        for e in reg.entries:
            state = "copied" if e.state == "snapshot" and e.tid not in reading else e.state
            progress = self.tables.setdefault(e.name, TableProgress())
            progress.state, progress.chunks_left = state, 0
        # A chunk is a split of length 1 (its rows are not counted in the checkpoint): count chunks.
        for s in ckpt.splits:
            table = self._tids.get(table_of_chunk(s.split_id)) if _is_table_chunk(s.split_id) else None
            if table is not None:
                progress = self.tables.setdefault(table, TableProgress("snapshot"))
                if s.finished:
                    progress.chunks_done.add(s.split_id)
                else:
                    progress.chunks_left += 1


def _is_table_chunk(split_id: str) -> bool:
    return split_id.startswith("snapshot-") and "-t" in split_id


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


class Progress:
    """Plain lines: one per committed batch with news, and notes. For pipes, logs, CI."""

    def __init__(self, config: MirrorConfig) -> None:
        self.config = config
        self.state = MirrorState()

    @staticmethod
    def for_stdout(config: MirrorConfig) -> "Progress":
        return LiveProgress(config) if sys.stdout.isatty() else Progress(config)

    def summary(self) -> str:
        s = self.state
        followed = [t for t in s.tables.values() if t.state != "left"]
        return (f"epoch {s.epoch if s.epoch is not None else '-'}: tables snapshotted {s.snapshotted}/{len(followed)}, "
                f"rows {s.rows} (changes {s.changes}), lag {_age(s.lag_s())}")

    def update(self, query: Any) -> None:
        if self.state.update(query):
            print(self.summary(), flush=True)

    def note(self, text: str) -> None:
        print(f"flinkish mirror: {text}", flush=True)

    def close(self) -> None:
        pass


class LiveProgress(Progress):
    """A rich live view: the summary and one line per table (state, snapshot chunks read / planned)."""

    def __init__(self, config: MirrorConfig, console: Any = None) -> None:
        super().__init__(config)
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console()
        self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
        self.live.start()

    def _render(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        s = self.state
        table = Table()
        for col in ("table", "state", "snapshot chunks read"):
            table.add_column(col, justify="right" if col.startswith("snapshot") else "left")
        items = sorted(s.tables.items())
        for name, t in items[:_MAX_TABLE_ROWS]:
            table.add_row(name, t.state, t.chunks)
        if len(items) > _MAX_TABLE_ROWS:
            table.add_row(f"... {len(items) - _MAX_TABLE_ROWS} more", "", "")
        return Group(Text(f"{self.config.name} -- {self.summary()}", style="bold"), table)

    def update(self, query: Any) -> None:
        self.state.update(query)
        self.live.update(self._render())  # the lag moves with the clock: redraw every poll

    def note(self, text: str) -> None:
        self.console.print(f"flinkish mirror: {text}")

    def close(self) -> None:
        if self.live.is_started:
            self.live.stop()
