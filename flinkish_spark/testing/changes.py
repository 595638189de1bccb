"""Change streams for tests of the keyed lakehouse sinks (Delta, Iceberg), and the model they are checked against.

A change is (key, op, value, lsn, partition, row): ``partition`` is the Spark task that
carries it in its epoch, ``row`` its place in that task. The model applies an epoch's
changes one by one in the documented order (``_lsn``, a snapshot read's null first, then
partition, then row) to a dict, as a reader expects the table to be afterwards.
"""

from __future__ import annotations

import collections
import datetime as dt
import random
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from flinkish_spark.sink.protocol import PrepareContext

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType()), StructField("n", IntegerType()),
                     StructField("_op", StringType()), StructField("_lsn", LongType()),
                     StructField("_commit_ts", TimestampType())])
EPOCH0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Change:
    key: int
    op: str
    value: str | None
    lsn: int | None
    part: int = 0
    row: int = 0

    @property
    def ts(self) -> dt.datetime | None:
        return None if self.lsn is None else EPOCH0 + dt.timedelta(seconds=self.lsn)

    def row_dict(self) -> dict[str, Any]:
        n = None if self.value is None else len(self.value)
        return {"id": self.key, "v": self.value, "n": n}


def batch(changes: list[Change]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "id": pa.array([c.key for c in changes], pa.int64()),
        "v": pa.array([c.value for c in changes], pa.string()),
        "n": pa.array([None if c.value is None else len(c.value) for c in changes], pa.int32()),
        "_op": pa.array([c.op for c in changes], pa.string()),
        "_lsn": pa.array([c.lsn for c in changes], pa.int64()),
        "_commit_ts": pa.array([c.ts for c in changes], pa.timestamp("us", tz="UTC")),
    })


def prepare(sink: Any, epoch: int, changes: list[Change]) -> list[Any]:
    """Each task's committable (tasks = the changes' partitions, rows in their given order)."""
    by_part: dict[int, list[Change]] = collections.defaultdict(list)
    for c in changes:
        by_part[c.part].append(c)
    out = []
    for part in sorted(by_part):
        rows = sorted(by_part[part], key=lambda c: c.row)
        out.append(sink.prepare(iter([batch(rows)]), PrepareContext(sink.uid, epoch, part, 0)))
    return out


def run_epoch(sink: Any, epoch: int, changes: list[Change]) -> str:
    prepared = prepare(sink, epoch, changes)
    outcome = sink.commit([c for c in prepared if c is not None], epoch)
    sink.cleanup(epoch, [c for c in prepared if c is not None])
    return outcome


def ordered(changes: list[Change]) -> list[Change]:
    return sorted(changes, key=lambda c: (-1 if c.lsn is None else c.lsn, c.part, c.row))


class Model:
    """What the table must hold after each epoch.

    With a transform (a routing sink's ``transforms``, written here in Python, independently of its SQL): ``keep``
    the filter on the source row, ``computed`` the computed columns (of the change), ``exclude`` the columns the
    target never gets. A snapshot row not kept is skipped; an insert or update not kept is a delete of its key."""

    def __init__(self, mode: str, deletes: str, track: tuple[str, ...] | None = None,
                 keep: Callable[[dict[str, Any]], bool] | None = None,
                 computed: dict[str, Callable[[Change], Any]] | None = None, exclude: tuple[str, ...] = ()) -> None:
        """``track`` (history): the tracked columns -- a change of only others updates the current version."""
        self.mode, self.deletes, self.track = mode, deletes, track
        self.rows: dict[int, dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self.keep, self.computed, self.exclude = keep, computed or {}, exclude

    def _transformed(self, c: Change) -> Change | None:
        """``c`` as the target gets it (None: skipped)."""
        if self.keep is None or c.op == "d" or self.keep(c.row_dict()):
            return c
        return None if c.op == "r" else Change(c.key, "d", None, c.lsn, c.part, c.row)

    def _row(self, c: Change) -> dict[str, Any]:
        row = {k: v for k, v in c.row_dict().items() if k not in self.exclude}
        return {**row, **{name: None if c.op == "d" else f(c) for name, f in self.computed.items()}}

    def apply(self, changes: list[Change]) -> None:
        for c in (t for t in map(self._transformed, ordered(changes)) if t is not None):
            if self.mode == "history":
                self._history(c)
            elif c.op == "d":
                if self.deletes == "true":
                    self.rows.pop(c.key, None)
                elif self.deletes == "soft" and c.key in self.rows:
                    # a key the target lacks (never live: a filtered row's update, a delete never seen) gets no
                    # row, as a hard delete of it changes nothing; one soft-deleted already stays as it is
                    self.rows[c.key] = {**self.rows[c.key], "_deleted": True}
            else:
                self.rows[c.key] = {**self._row(c), **({"_deleted": False} if self.deletes == "soft" else {})}

    def _history(self, c: Change) -> None:
        if c.op == "d" and self.deletes == "false":
            return
        if c.op != "d" and self.track is not None:
            row = c.row_dict()
            for version in self.history:
                if version["id"] == c.key and version["_current"] and all(version[t] == row[t] for t in self.track):
                    version.update(row)  # in place: _valid_from kept
                    return
        for version in self.history:
            if version["id"] == c.key and version["_current"]:
                version["_valid_to"], version["_current"] = c.ts, False
        if c.op != "d":
            self.history.append({**self._row(c), "_valid_from": c.ts, "_valid_to": None, "_current": True})

    def table(self) -> list[dict[str, Any]]:
        rows = self.history if self.mode == "history" else list(self.rows.values())
        return sorted(rows, key=_order)


def _order(r: dict[str, Any]) -> tuple:
    return tuple((v is None, str(v)) for v in r.values())


def normalized(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as a reader returned them, in the model's order, timestamps in UTC."""
    for r in rows:
        for k in ("_valid_from", "_valid_to"):
            if r.get(k) is not None:
                r[k] = r[k].astimezone(dt.timezone.utc)
    return sorted(rows, key=_order)


def random_epochs(seed: int, epochs: int, keys: int, per_epoch: int, tasks: int) -> list[list[Change]]:
    """Epoch 0 a snapshot of every key (op r, no LSN), then random inserts/updates/deletes of
    few keys (many changes per key and epoch, spread over tasks, LSNs shared within a transaction)."""
    rng = random.Random(seed)
    out = [[Change(k, "r", f"s{k}", None, k % tasks, k) for k in range(keys)]]
    lsn = 100
    for e in range(1, epochs):
        changes = []
        rows: collections.Counter[int] = collections.Counter()
        for _ in range(per_epoch):
            if rng.random() < 0.7:
                lsn += rng.randint(1, 3)  # else: the same transaction as the previous change
            k = rng.randrange(keys + keys // 4)
            op = rng.choice("cuuud")
            part = rng.randrange(tasks)
            changes.append(Change(k, op, None if op == "d" else f"e{e}-{rng.randrange(1000)}", lsn, part, rows[part]))
            rows[part] += 1
        out.append(changes)
    return out


def merged_table(models: dict[str, Model]) -> list[dict[str, Any]]:
    """What a target merging shards (``models``: each shard's, by its ``schema.table``) must hold: every shard's rows,
    each with its ``_source_table`` (:mod:`flinkish_spark.connectors.lakehouse.routes`), in the model's order."""
    return sorted(({**r, "_source_table": name} for name, m in models.items() for r in m.table()), key=_order)
