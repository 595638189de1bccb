"""Read-only views of a checkpoint metadata root, for people (tables) and machines (JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO


@dataclass(frozen=True)
class SourceEpoch:
    """One checkpoint of a source. ``rows_in_epoch`` / ``position_total`` are the splits' positions as the source
    counts them (rows for most sources). For ``flinkish.postgres`` positions are not rows: a snapshot chunk is a
    split of length 1 and the change split's position is a WAL position (LSN), so its figures are ``lsn`` (where
    the change stream stands, as PostgreSQL prints it: ``X/Y``), ``wal_bytes_in_epoch`` and ``chunks_in_epoch``.
    For ``flinkish.mysql`` ``rows_in_epoch`` is the changes of the epoch's binary log range as planned
    (``changes_in_epoch``; 0 when not counted: a range planned without ``maxRowsPerTrigger`` counts its row events,
    ``row_events_in_epoch``, each of one or many rows) -- a position is a file+offset key, whose distance counts
    nothing -- beside ``chunks_in_epoch``, ``binlog`` and ``gtid`` (the range record the enumerator keeps in its state)."""

    uid: str
    kind: str
    ckpt_id: int
    status: str
    splits_finished: int
    splits_total: int
    rows_in_epoch: int
    position_total: int
    created_ms: int
    lsn: str | None = None
    wal_bytes_in_epoch: int | None = None
    chunks_in_epoch: int | None = None
    binlog: str | None = None  # flinkish.mysql: the change split's binary log position, "file #<n> at <offset>"
    changes_in_epoch: int | None = None  # flinkish.mysql: the epoch's range's changes (None: not counted)
    row_events_in_epoch: int | None = None  # flinkish.mysql, planned without a limit: row events (rows uncounted)
    gtid: str | None = None  # flinkish.mysql: the server's GTID state at the change split's position

    @classmethod
    def of(cls, c: SourceCheckpoint) -> "SourceEpoch":
        postgres: dict[str, Any] = {}
        if c.kind == "flinkish.postgres":
            from flinkish_spark.connectors.postgres.pgoutput import format_lsn

            changes = [s for s in c.splits if s.split_id.startswith("changes-")]
            postgres = {"lsn": format_lsn(max(s.position for s in changes)) if changes else None,
                        "wal_bytes_in_epoch": sum(s.rows_in_epoch for s in changes),
                        "chunks_in_epoch": sum(s.rows_in_epoch for s in c.splits if s.split_id.startswith("snapshot-"))}
        elif c.kind == "flinkish.mysql":
            postgres = _mysql_figures(c)
        return cls(
            uid=c.uid,
            kind=c.kind,
            ckpt_id=c.ckpt_id,
            status=c.status,
            splits_finished=sum(1 for s in c.splits if s.finished),
            splits_total=len(c.splits),
            rows_in_epoch=(int(postgres.get("changes_in_epoch") or 0) if c.kind == "flinkish.mysql"
                           else sum(s.rows_in_epoch for s in c.splits)),
            position_total=sum(s.position for s in c.splits),
            created_ms=c.created_ms,
            **postgres,
        )

    @property
    def read_in_epoch(self) -> str:
        """What the epoch read, in the source's units: rows, or snapshot chunks and WAL bytes."""
        if self.kind == "flinkish.mysql":
            if self.changes_in_epoch is None:
                if self.row_events_in_epoch is not None:  # rows not counted when planned: Spark's progress has them
                    return f"{self.chunks_in_epoch} chunks, {self.row_events_in_epoch} row events"
                return f"{self.chunks_in_epoch} chunks"
            return f"{self.chunks_in_epoch} chunks, {self.changes_in_epoch} changes"
        if self.kind != "flinkish.postgres":
            return f"{self.rows_in_epoch} rows"
        return f"{self.chunks_in_epoch} chunks, {self.wal_bytes_in_epoch} B of WAL"

    @property
    def position(self) -> str:
        """Where the source stands: the rows read in all, or the change stream's LSN."""
        if self.kind == "flinkish.mysql":
            return (f"binlog {self.binlog}" + (f", GTID {self.gtid}" if self.gtid else "")) if self.binlog else "-"
        if self.kind != "flinkish.postgres":
            return str(self.position_total)
        return f"LSN {self.lsn}" if self.lsn else "-"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _mysql_figures(c: SourceCheckpoint) -> dict[str, Any]:
    """A ``flinkish.mysql`` checkpoint's figures. Positions are binary log keys (file number << 32 | offset; 0: the
    change split's start, recorded in its payload); the range record in the enumerator's state
    (``connectors/mysql/dialect.RangeRecord``) gives the changes and the GTID state where it names this range."""
    from flinkish_spark.connectors.cdc.change_split import change_start
    from flinkish_spark.source.split import Split

    changes = [s for s in c.splits if s.split_id.startswith("changes-")]
    at = max((s.position for s in changes), default=0)
    out: dict[str, Any] = {"binlog": f"file #{at >> 32} at {at & 0xFFFFFFFF}" if at else None,
                           "chunks_in_epoch": sum(s.rows_in_epoch for s in c.splits if s.split_id.startswith("snapshot-"))}
    try:
        planned = json.loads(c.enumerator_state or b"{}").get("range") or {}
    except ValueError:
        planned = {}
    for s in changes:
        if not planned or s.position != planned.get("end") or not s.position:
            continue
        out["gtid"] = planned.get("gtid")
        start = change_start(Split(s.split_id, s.payload), s.start)
        if start == s.position:
            out["changes_in_epoch"] = 0  # the range ended here in an earlier epoch: this one read no change
        elif start == planned.get("start"):
            out["changes_in_epoch"] = planned.get("changes")
            if planned.get("changes") is None and planned.get("events") is not None:
                out["row_events_in_epoch"] = planned.get("events")
    return out


@dataclass(frozen=True)
class SinkEpoch:
    """One epoch of a two-phase-commit sink: ``committed`` (visible) or ``decided`` (a restart commits it)."""

    uid: str
    epoch: int
    state: str
    committables: int
    created_ms: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sink_epochs(io: FileIO, root: str, last: int = 5) -> list[SinkEpoch]:
    """The newest ``last`` epochs of every two-phase-commit sink under ``root``."""
    from flinkish_spark.sink.decisions import DecisionLog

    out: list[SinkEpoch] = []
    for uid in io.list_names(join(root, "sinks")):
        log = DecisionLog(io, root, uid)
        decided, done = log.epochs()
        for epoch in decided[-last:]:
            d = log.read(epoch)
            if d is not None:
                state = "committed" if epoch in done else "decided"
                out.append(SinkEpoch(uid, epoch, state, len(d.committables), d.created_ms))
    return out


def sink_targets(io: FileIO, root: str) -> dict[str, dict[str, Any]]:
    """What each sink recorded about its target (``sinks/<uid>/_target.json``, e.g. the
    commit mode ``flinkish.postgres`` chose), by sink uid; the URL in it is masked."""
    out: dict[str, dict[str, Any]] = {}
    for uid in io.list_names(join(root, "sinks")):
        try:
            record = json.loads(io.read_bytes(join(root, "sinks", uid, "_target.json")))
        except (FileNotFoundError, ValueError):
            continue
        if isinstance(record, dict):
            out[uid] = record
    return out


def source_uids(io: FileIO, root: str) -> list[str]:
    return io.list_names(join(root, "sources"))


def recent_epochs(io: FileIO, root: str, last: int = 5) -> list[SourceEpoch]:
    """The newest ``last`` checkpoints of every source under ``root``, oldest first per source."""
    uids = source_uids(io, root)
    if not io.exists(root):
        raise ConfigError(f"{root} does not exist: pass the metadata root (the sources' 'checkpoint' option)")
    out: list[SourceEpoch] = []
    for uid in uids:
        store = SourceCheckpointStore(io, root, uid, kind="")
        for ckpt_id in store.ids()[-last:]:
            from flinkish_spark.checkpoint.serde import decode_source_checkpoint

            path = store.path(ckpt_id)
            out.append(SourceEpoch.of(decode_source_checkpoint(io.read_bytes(path), path)))
    return out


def running_source_uids(io: FileIO, root: str, fresh_s: float = 30.0) -> list[str]:
    """Source uids under ``root`` whose lease was renewed in the last ``fresh_s`` seconds."""
    import json
    import time

    out = []
    for uid in source_uids(io, root):
        try:
            lease = json.loads(io.read_bytes(join(root, "sources", uid, "_lease.json")))
        except (FileNotFoundError, ValueError):
            continue
        if time.time() - int(lease.get("renewed_ms", 0)) / 1000 < fresh_s:
            out.append(uid)
    return out


def postgres_tables(io: FileIO, root: str) -> dict[str, dict[str, int]]:
    """Per multi-table ``flinkish.postgres`` source uid: how many tables are joining, in their snapshot, streaming,
    and ``not followed`` (matching, but without a usable key: :func:`postgres_not_followed` says which)."""
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.connectors.cdc import registry
    from flinkish_spark.connectors.cdc.patterns import read_not_followed

    out: dict[str, dict[str, int]] = {}
    for uid in source_uids(io, root):
        store = SourceCheckpointStore(io, root, uid, kind="")
        latest = store.latest()
        if latest is None or latest.kind not in ("flinkish.postgres", "flinkish.mysql"):  # the CDC core's registry
            continue
        tables = registry.of_state(io, store.directory, latest.enumerator_state)
        if tables is not None:
            counts: dict[str, int] = {}
            for e in tables.entries:
                counts[e.state] = counts.get(e.state, 0) + 1
            left_out = read_not_followed(io, store.directory)
            if left_out:
                counts["not followed"] = len(left_out)
            out[uid] = counts
    return out


def postgres_not_followed(io: FileIO, root: str) -> dict[str, dict[str, str]]:
    """Per multi-table ``flinkish.postgres`` source uid: the matching tables it leaves out for want of a key ->
    the warning (why, and the ALTER TABLE that gets the table followed without a restart)."""
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.connectors.cdc.patterns import read_not_followed

    out: dict[str, dict[str, str]] = {}
    for uid in source_uids(io, root):
        left_out = read_not_followed(io, SourceCheckpointStore(io, root, uid, kind="").directory)
        if left_out:
            out[uid] = left_out
    return out


@dataclass(frozen=True)
class PostgresSlot:
    """The replication slot of a ``flinkish.postgres`` source and the WAL it holds back (best effort):
    ``wal_held_back_bytes`` is ``pg_current_wal_lsn() - restart_lsn`` (WAL the server keeps for the slot),
    ``confirmed_lag_bytes`` is ``pg_current_wal_lsn() - confirmed_flush_lsn`` (WAL not confirmed yet)."""

    uid: str
    slot: str
    confirmed_lsn: str | None
    wal_held_back_bytes: int | None
    note: str = ""
    confirmed_lag_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def postgres_slots(io: FileIO, root: str) -> list[PostgresSlot]:
    """Slots of the PostgreSQL sources under ``root``; connects with the URL their descriptor records."""
    import json

    from flinkish_spark.connectors.postgres.slot import MARKER_FILE, Ownership

    out: list[PostgresSlot] = []
    for uid in source_uids(io, root):
        directory = join(root, "sources", uid)
        if not io.exists(join(directory, MARKER_FILE)):
            continue
        owned = Ownership.read(io, directory)
        assert owned is not None
        try:
            from flinkish_spark.connectors.postgres.connection import connect, parse_url
            from flinkish_spark.connectors.postgres.slot import wal_held_back

            options = json.loads(io.read_bytes(join(directory, "_source.json")))["options"]
            with connect(parse_url(options["url"], options.get("passwordEnv")), autocommit=True) as conn:
                held = wal_held_back(conn, owned.slot)
                lag = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                                   "FROM pg_replication_slots WHERE slot_name = %s", (owned.slot,)).fetchone()
            if held is None:
                out.append(PostgresSlot(uid, owned.slot, None, None, "no such slot (dropped: finished, or lost)"))
            else:
                out.append(PostgresSlot(uid, owned.slot, held[0], held[1],
                                        confirmed_lag_bytes=None if lag is None or lag[0] is None else int(lag[0])))
        except Exception as exc:  # noqa: BLE001 - inspect is best effort; say why
            out.append(PostgresSlot(uid, owned.slot, None, None, f"cannot reach the server: {exc}"))
    return out
