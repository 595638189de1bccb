"""A mirror's status from its metadata: one implementation for ``flinkish mirror status``, the Prometheus exporter
(``--metrics-port``) and Python (:func:`mirror_status`).

Read only, without Spark, for a mirror that runs or is stopped; each figure says where it comes from:

* per table: its state (the registry the source's newest checkpoint names: ``joining``, ``snapshot``,
  ``streaming``; ``not followed`` for a matching table without a usable key, from the source's
  ``not-followed.json``, with the reason and the statement that makes it followed), the rows its
  snapshots read, the changes applied, its newest committed epoch with rows and its lag (:mod:`flinkish_spark.mirror.counts`: the record the pipeline process writes, with the
  epochs committed since folded in from the sink's ``.done`` markers -- exact also right after a
  ``kill -9``);
* the newest committed epoch: the sink's decision log (``sinks/<uid>_sink``), and when it was decided;
* the lag: for the newest epoch that had changes, when it was visible in the targets minus the source
  commit time of its newest change (``_commit_ts``); per table the same with the table's newest change
  (the difference: docs/mirror.md, "Metrics and status");
* the replication slot: ``pg_current_wal_lsn() - restart_lsn`` (WAL the server keeps for it) and
  ``pg_current_wal_lsn() - confirmed_flush_lsn`` (WAL not confirmed yet), asked from the source database
  (:func:`flinkish_spark.inspect.postgres_slots`; best effort: an unreachable server is a note);
* runs (restarts = runs - 1) and failed runs, with the last failure's line.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO

#: the state of a matching table the mirror leaves out (no usable key): in the table, --json and the metrics
NOT_FOLLOWED = "not followed"


@dataclass(frozen=True)
class TableStatus:
    name: str  # schema.table
    state: str  # joining, snapshot, streaming (the registry's); not followed (matching, without a usable key)
    snapshot_rows: int  # rows read by its snapshots
    changes: int  # inserts, updates, deletes and truncates applied
    last_epoch: int | None = None  # the newest committed epoch with rows of the table
    last_commit_ms: int | None = None  # source commit time of its newest change visible in its target
    lag_s: float | None = None  # visible in its target - that commit time, for its newest epoch with changes
    note: str = ""  # a table not followed: why, and the statement that makes it followed


@dataclass(frozen=True)
class MirrorStatus:
    """What :func:`mirror_status` read. Counts are None/0 before the first recorded batch."""

    uid: str
    running: bool  # the source's lease was renewed in the last 30 s
    tables: tuple[TableStatus, ...]
    rows: int  # data rows of every recorded batch (snapshot rows and changes)
    changes: int
    counts_exact: bool  # every epoch's per-table counts were folded in (see mirror.counts)
    last_epoch: int | None  # the sink's newest committed epoch
    last_epoch_ms: int | None  # when it was decided (epoch ms)
    last_commit_ms: int | None  # source commit time of the newest change visible in the targets
    lag_s: float | None  # visible in the targets - source commit time of the newest change, newest epoch with changes
    slot: str | None
    slot_retained_bytes: int | None  # pg_current_wal_lsn() - restart_lsn
    slot_confirmed_lag_bytes: int | None  # pg_current_wal_lsn() - confirmed_flush_lsn
    slot_confirmed_lsn: str | None
    slot_note: str
    runs: int  # pipeline process starts recorded
    errors: int  # runs that ended failed
    last_error: str | None
    read_ms: int  # when this status was read

    @property
    def restarts(self) -> int:
        return max(0, self.runs - 1)

    def table_states(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tables:
            out[t.state] = out.get(t.state, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["restarts"] = self.restarts
        return d


def _uid(io: FileIO, root: str, uid: str | None) -> str:
    from flinkish_spark.inspect import source_uids

    uids = source_uids(io, root)
    if not uids:
        raise ConfigError(f"mirror status: no flinkish checkpoint at {root} (no sources/ folder there): pass the "
                          "mirror's --checkpoint")
    if uid is not None:
        if uid not in uids:
            raise ConfigError(f"mirror status: no mirror uid {uid!r} under {root}; there: {', '.join(uids)}")
        return uid
    mirrors = [u for u in uids if f"{u}_sink" in io.list_names(f"{root}/sinks")] or uids
    if len(mirrors) > 1:
        raise ConfigError(f"mirror status: {len(mirrors)} mirrors under {root} ({', '.join(mirrors)}): pass --uid")
    return mirrors[0]


def mirror_status(checkpoint: str, uid: str | None = None, storage_options: Mapping[str, str] | None = None,
                  slot: bool = True, io: FileIO | None = None, record: Any = None) -> MirrorStatus:
    """The status of the mirror whose metadata root is ``checkpoint`` (its ``--checkpoint``); ``uid``: its
    ``--uid`` (default: the one mirror there). ``slot=False`` skips asking the source database. ``record``: the
    counts to show (a :class:`~flinkish_spark.mirror.counts.Record`: the pipeline process passes its own, current
    one); default: read from the metadata."""
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.connectors.cdc import registry
    from flinkish_spark.connectors.cdc.patterns import read_not_followed
    from flinkish_spark.inspect import postgres_slots, running_source_uids, sink_epochs
    from flinkish_spark.io.fileio import storage_options_from
    from flinkish_spark.mirror import counts

    root = checkpoint.rstrip("/")
    if io is None:
        io = FileIO.for_url(root, storage_options_from(dict(storage_options or {}), root), what="--checkpoint")
    uid = _uid(io, root, uid)
    store = SourceCheckpointStore(io, root, uid, kind="")
    latest = store.latest()
    reg = None if latest is None else registry.of_state(io, store.directory, latest.enumerator_state)
    if record is None:
        record = counts.current(io, root, uid)
    tables = tuple(_table(record, e.name, e.state) for e in (reg.entries if reg else ()))
    tables += tuple(TableStatus(name, NOT_FOLLOWED, 0, 0, note=why)
                    for name, why in sorted(read_not_followed(io, store.directory).items()))
    committed = [e for e in sink_epochs(io, root, last=2) if e.uid == f"{uid}_sink" and e.state == "committed"]
    last = max(committed, key=lambda e: e.epoch) if committed else None
    found = next((s for s in postgres_slots(io, root) if s.uid == uid), None) if slot else None
    return MirrorStatus(
        uid=uid, running=uid in running_source_uids(io, root), tables=tables, rows=record.rows,
        changes=record.changes, counts_exact=record.exact, last_epoch=None if last is None else last.epoch,
        last_epoch_ms=None if last is None else last.created_ms,
        last_commit_ms=None if record.last_commit_us is None else record.last_commit_us // 1000,
        lag_s=record.lag_s, slot=None if found is None else found.slot,
        slot_retained_bytes=None if found is None else found.wal_held_back_bytes,
        slot_confirmed_lag_bytes=None if found is None else found.confirmed_lag_bytes,
        slot_confirmed_lsn=None if found is None else found.confirmed_lsn,
        slot_note="" if found is None else found.note, runs=record.runs, errors=record.errors,
        last_error=record.last_error, read_ms=int(time.time() * 1000))


def _table(record: Any, name: str, state: str) -> TableStatus:
    t = record.tables.get(name)
    if t is None:
        return TableStatus(name, state, 0, 0)
    return TableStatus(name, state, t.snapshot_rows, t.changes, t.last_epoch,
                       None if t.last_commit_us is None else t.last_commit_us // 1000, t.lag_s)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def render(status: MirrorStatus, console: Any = None) -> None:
    """Print ``status`` as ``flinkish mirror status`` does: a few lines, then a rich table per table."""
    from rich.console import Console
    from rich.table import Table

    s = status
    console = console or Console()
    states = ", ".join(f"{n} {k}" for k, n in sorted(s.table_states().items())) or "no tables yet"
    lag = "-" if s.lag_s is None else f"{s.lag_s:.1f}s"
    console.print(f"mirror {s.uid}: {'running' if s.running else 'not running'}; tables: {states}")
    console.print(f"last committed epoch {s.last_epoch if s.last_epoch is not None else '-'} "
                  f"({_when(s.last_epoch_ms)}); newest change visible committed {_when(s.last_commit_ms)}, lag {lag}")
    console.print(f"rows {s.rows} (changes {s.changes}); runs {s.runs} (restarts {s.restarts}), errors {s.errors}"
                  + (f"; last error: {s.last_error}" if s.last_error else ""))
    if s.slot is not None:
        console.print(f"slot {s.slot}: retains {_bytes(s.slot_retained_bytes)} of WAL, confirmed "
                      f"{s.slot_confirmed_lsn or '-'} ({_bytes(s.slot_confirmed_lag_bytes)} behind)"
                      + (f"; {s.slot_note}" if s.slot_note else ""))
    table = Table()
    # the newest change's commit time per table: in --json (and the metrics); a table name is never cut
    for col in ("table", "state", "rows snapshotted", "changes applied", "last epoch", "lag"):
        left = col in ("table", "state")
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    for t in s.tables:
        table.add_row(t.name, t.state, str(t.snapshot_rows), str(t.changes),
                      "-" if t.last_epoch is None else str(t.last_epoch), "-" if t.lag_s is None else f"{t.lag_s:.1f}s")
    console.print(table)
    for t in s.tables:
        if t.note:
            console.print(f"warning: {t.note}")
    if not s.counts_exact:
        console.print("note: the counts miss some epochs (committed by an older flinkish, or their records were "
                      "removed before they were counted: docs/mirror.md, 'Metrics and status')")


def to_json_text(status: MirrorStatus) -> str:
    return json.dumps(status.to_json(), indent=2, sort_keys=True)
