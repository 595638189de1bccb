"""The decision log of a two-phase-commit sink: one immutable record per (sink uid, epoch).

Layout below the sink's metadata root::

    <root>/sinks/<uid>/decisions/<epoch, 12 digits>.parquet   the decision: what to commit
    <root>/sinks/<uid>/decisions/<epoch, 12 digits>.done      made visible: when, and the sink's figures of the
                                                               epoch (JSON, :class:`Done`; empty from older versions)
    <root>/sinks/<uid>/_lease.json                             fencing (see lease.py)
    <root>/sinks/<uid>/_schema.json                            the schema the sink was started with
    <root>/sinks/<uid>/_query.json                             the incarnation: Spark query id, checkpointLocation,
                                                               epoch offset (see incarnation.py)

Guarantees:

* a decision is written with put-if-absent before any output of its epoch becomes
  visible; once written it is never changed -- a replay of the epoch commits the
  recorded committables, never new ones;
* the ``.done`` marker is written only after the sink made every committable visible, once (put-if-absent);
  it records when (``visible_ms``) and what the decided committables carried (the sink's
  :meth:`~flinkish_spark.sink.protocol.EpochCommitter.figures`, e.g. rows per table): so a status that
  folds each epoch's figures in by epoch counts every visible epoch exactly once;
* recording costs O(1) object-store requests per epoch, whatever the number of writers
  (one row per committable in one file).

Decision files use the versioned Parquet conventions of the source checkpoints
(``flinkish.format_version`` in the footer; see docs/metadata-format.md).
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.checkpoint.serde import FORMAT_VERSION, KIND_KEY, MAGIC_KEY, read_format_version
from flinkish_spark.errors import AlreadyExistsError, CorruptMetadataError, ForeignMetadataError
from flinkish_spark.io.fileio import FileIO

DECISION_FILE_KIND = b"sink-decision"
_SCHEMA = pa.schema([pa.field("committable", pa.binary(), nullable=False)])


@dataclass(frozen=True)
class Decision:
    uid: str
    epoch: int
    run_id: str
    created_ms: int
    committables: tuple[bytes, ...]


@dataclass(frozen=True)
class Done:
    """What an epoch's ``.done`` marker records (a marker written before it recorded anything: both None)."""

    epoch: int
    visible_ms: int | None  # when every committable of the epoch was visible (epoch ms)
    figures: Mapping[str, Any] | None  # the sink's figures of the decided committables


def encode_done(visible_ms: int, figures: Mapping[str, Any] | None) -> bytes:
    return json.dumps({"visible_ms": visible_ms, "figures": figures}, separators=(",", ":")).encode()


def decode_done(epoch: int, data: bytes) -> Done:
    """A marker's content; an empty or unreadable one is a marker all the same (the epoch is visible)."""
    try:
        d = json.loads(data) if data else {}
        raw = d.get("visible_ms")
        figures = d.get("figures")
        return Done(epoch, None if raw is None else int(raw), figures if isinstance(figures, dict) else None)
    except (ValueError, TypeError, AttributeError):
        return Done(epoch, None, None)


def encode_decision(d: Decision) -> bytes:
    table = pa.table({"committable": pa.array(list(d.committables), pa.binary())}, schema=_SCHEMA)
    buf = io.BytesIO()
    writer = pq.ParquetWriter(buf, _SCHEMA, compression="zstd", store_schema=False)
    writer.write_table(table)
    writer.add_key_value_metadata(
        {
            MAGIC_KEY: str(FORMAT_VERSION).encode(),
            KIND_KEY: DECISION_FILE_KIND,
            b"flinkish.uid": d.uid.encode(),
            b"flinkish.epoch": str(d.epoch).encode(),
            b"flinkish.run_id": d.run_id.encode(),
            b"flinkish.created_ms": str(d.created_ms).encode(),
        }
    )
    writer.close()
    return buf.getvalue()


def decode_decision(data: bytes, path: str) -> Decision:
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        md = dict(pf.metadata.metadata or {})
        table = pf.read()
    except (pa.ArrowException, OSError):
        raise CorruptMetadataError(
            f"{path} is not a readable commit record ({len(data)} bytes, truncated or damaged). "
            "If no output of this epoch is visible, delete the record and restart to redo the epoch."
        ) from None
    read_format_version(md, path)
    if md.get(KIND_KEY) != DECISION_FILE_KIND:
        raise ForeignMetadataError(f"{path} is flinkish metadata of kind {md.get(KIND_KEY)!r}, not a commit record")
    try:
        return Decision(
            uid=md[b"flinkish.uid"].decode(),
            epoch=int(md[b"flinkish.epoch"]),
            run_id=md[b"flinkish.run_id"].decode(),
            created_ms=int(md[b"flinkish.created_ms"]),
            committables=tuple(table.column("committable").to_pylist()),
        )
    except (KeyError, ValueError) as exc:
        raise CorruptMetadataError(f"{path}: commit record field missing or invalid ({exc!r})") from None


class DecisionLog:
    def __init__(self, io: FileIO, root: str, uid: str) -> None:
        self.io = io
        self.uid = uid
        self.directory = join(root, "sinks", uid)
        self.decisions = join(self.directory, "decisions")

    def path(self, epoch: int) -> str:
        return join(self.decisions, f"{epoch:012d}.parquet")

    def done_path(self, epoch: int) -> str:
        return join(self.decisions, f"{epoch:012d}.done")

    def read(self, epoch: int) -> Decision | None:
        path = self.path(epoch)
        try:
            data = self.io.read_bytes(path)
        except FileNotFoundError:
            return None
        decision = decode_decision(data, path)
        if decision.uid != self.uid or decision.epoch != epoch:
            raise CorruptMetadataError(f"{path} records uid {decision.uid!r} epoch {decision.epoch}, not {self.uid!r} {epoch}")
        return decision

    def record(self, epoch: int, committables: list[bytes], run_id: str) -> tuple[Decision, bool]:
        """Record the decision for ``epoch``; return (the decision in force, whether it is ours)."""
        decision = Decision(self.uid, epoch, run_id, int(time.time() * 1000), tuple(committables))
        try:
            self.io.write_exclusive(self.path(epoch), encode_decision(decision))
            return decision, True
        except AlreadyExistsError:
            existing = self.read(epoch)
            assert existing is not None
            return existing, False

    def is_done(self, epoch: int) -> bool:
        return self.io.small_file_exists(self.done_path(epoch))

    def mark_done(self, epoch: int, figures: Mapping[str, Any] | None = None) -> None:
        """The epoch is visible: its marker, with the time now and the sink's ``figures`` of it."""
        try:
            self.io.write_exclusive(self.done_path(epoch), encode_done(int(time.time() * 1000), figures))
        except AlreadyExistsError:
            pass  # a repeated commit of a done epoch: the first marker stands

    def read_done(self, epoch: int) -> Done | None:
        """The epoch's ``.done`` marker (None: not done, or removed by retention)."""
        try:
            return decode_done(epoch, self.io.read_bytes(self.done_path(epoch)))
        except FileNotFoundError:
            return None

    def epochs(self) -> tuple[list[int], set[int]]:
        """(epochs with a decision, epochs marked done), from one listing."""
        decided: list[int] = []
        done: set[int] = set()
        for name in self.io.list_names(self.decisions):
            stem, _, ext = name.partition(".")
            if stem.isdigit() and len(stem) == 12:
                if ext == "parquet":
                    decided.append(int(stem))
                elif ext == "done":
                    done.add(int(stem))
        return sorted(decided), done

    def check_pending(self) -> list[int]:
        """Read every decided-but-not-done epoch (the ones a restart recovers); a damaged record raises here.

        Returns every epoch that has a decision (done or not)."""
        decided, done = self.epochs()
        for epoch in decided:
            if epoch not in done:
                self.read(epoch)
        return decided

    def retain(self, keep: int, through_epoch: int, listing: tuple[list[int], set[int]] | None = None) -> None:
        """Delete records of done epochs older than the newest ``keep`` (Spark replays only the last);
        ``listing``: what :meth:`epochs` answered, when the caller has it already."""
        decided, done = self.epochs() if listing is None else listing
        old = [e for e in decided if e in done and e <= through_epoch][:-keep] if keep > 0 else []
        self.io.delete_many([self.path(e) for e in old] + [self.done_path(e) for e in old])
