"""Per-table counts of a mirror, recorded in its metadata: what ``flinkish mirror status`` and the metrics read.

Where the figures come from: Spark's observed metrics of each batch (``df.observe``, see
:func:`flinkish_spark.mirror.pipeline.start_query`). A per-table count needs a count per key in
one aggregate; ``histogram_numeric`` is one: with at most ``nb`` distinct values its bins are
the values themselves with exact counts (bins of one value are merged first, others only when
there are more than ``nb`` values). The value is the table name's CRC-32 and its length in bytes
(:func:`table_key`: cheap per row, reproducible in Python), so the driver maps bins back to names
with the registry's tables. More than :data:`BINS` tables in one batch, a bin that names no table,
or two followed tables with one key: the batch's per-table counts are not recorded (``exact``
false), its totals are.

The pipeline process folds each committed batch in once (by batch id) and writes the record,
``<checkpoint>/sources/<uid>/_mirror_status.json`` (a small JSON file, replaced each batch;
readers and retention ignore it). A kill between a batch's commit and the record's write loses
that batch's counts (a figure, not data: the targets hold the rows).
"""

from __future__ import annotations

import json
import zlib
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.io.fileio import FileIO

RECORD = "_mirror_status.json"
#: histogram bins per batch: per-table counts are exact for up to this many tables in one batch
BINS = 4096
SNAPSHOT_BY_TABLE, CHANGES_BY_TABLE = "snapshot_by_table", "changes_by_table"


def table_key(name: str) -> float:
    """The number a table's rows are counted under: CRC-32 of ``schema.table`` plus its length in bytes (mod 2^16)
    times 2^32 (48 bits: exact in a double); the same as :func:`table_key_column` computes in Spark."""
    data = name.encode()
    return float(zlib.crc32(data) + (len(data) % 65536) * 2**32)


def table_key_column(table: Any) -> Any:
    from pyspark.sql import functions as F

    return (F.crc32(table.cast("binary")) + (F.octet_length(table) % 65536) * (2**32)).cast("double")


def observed_columns(op: Any, table: Any) -> list[Any]:
    """The per-table aggregates added to the mirror's observed metrics: snapshot rows and changes by table."""
    from pyspark.sql import functions as F

    key = table_key_column(table)
    return [F.histogram_numeric(F.when(op == "r", key), F.lit(BINS)).alias(SNAPSHOT_BY_TABLE),
            F.histogram_numeric(F.when(op.isin("c", "u", "d"), key), F.lit(BINS)).alias(CHANGES_BY_TABLE)]


def by_table(bins: Iterable[Any] | None, names: Iterable[str]) -> dict[str, int] | None:
    """A histogram's bins as counts by table name; None when a bin names none of ``names`` (merged bins)."""
    keys: dict[float, str | None] = {}
    for n in names:
        k = table_key(n)
        keys[k] = None if k in keys and keys[k] != n else n  # None: two tables share the key
    out: dict[str, int] = {}
    for b in bins or ():
        x, y = (b["x"], b["y"]) if isinstance(b, Mapping) else (b.x, b.y)
        name = keys.get(float(x))
        if name is None:
            return None
        out[name] = out.get(name, 0) + int(round(float(y)))
    return out


@dataclass(frozen=True)
class TableCounts:
    snapshot_rows: int = 0  # rows read by the table's snapshots (all of them: a re-snapshot reads again)
    changes: int = 0  # inserts, updates, deletes applied


@dataclass(frozen=True)
class Record:
    """What the pipeline process recorded, cumulated over its runs."""

    batch: int | None = None  # the newest Spark batch folded in
    query_id: str | None = None  # of the Spark query (checkpoint) whose batch ids ``batch`` counts
    committed_ms: int | None = None  # when that batch was visible in the targets
    last_commit_us: int | None = None  # source commit time of the newest change visible in the targets
    lag_s: float | None = None  # visible - source commit time, for the newest batch that had changes
    rows: int = 0
    changes: int = 0
    exact: bool = True  # every batch's per-table counts were recorded
    tables: dict[str, TableCounts] = field(default_factory=dict)
    runs: int = 0  # pipeline process starts: restarts = runs - 1
    errors: int = 0  # runs that ended failed
    last_error: str | None = None
    updated_ms: int = 0

    def to_json(self) -> bytes:
        d = asdict(self)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Record":
        d = json.loads(data)
        d["tables"] = {k: TableCounts(**v) for k, v in d.get("tables", {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def for_query(self, query_id: str) -> "Record":
        """This record for a run of Spark query ``query_id``: a new Spark checkpoint numbers its batches from 0
        again, so the batch watermark starts over with it."""
        return self if query_id == self.query_id else replace(self, query_id=query_id, batch=None)

    def with_batch(self, batch: int, metrics: Mapping[str, Any], visible_ms: int, names: Iterable[str]) -> "Record":
        """This record with Spark batch ``batch``'s observed ``metrics`` folded in (once: an older batch is ignored)."""
        if self.batch is not None and batch <= self.batch:
            return self
        names = list(names)
        snap = by_table(metrics.get(SNAPSHOT_BY_TABLE), names)
        chg = by_table(metrics.get(CHANGES_BY_TABLE), names)
        tables = dict(self.tables)
        for name, n in (snap or {}).items():
            t = tables.get(name, TableCounts())
            tables[name] = replace(t, snapshot_rows=t.snapshot_rows + n)
        for name, n in (chg or {}).items():
            t = tables.get(name, TableCounts())
            tables[name] = replace(t, changes=t.changes + n)
        raw = metrics.get("last_commit_us")
        ts = None if raw is None else int(raw)
        newer = ts is not None and (self.last_commit_us is None or ts >= self.last_commit_us)
        return replace(self, batch=batch, committed_ms=visible_ms, tables=tables,
                       rows=self.rows + int(metrics.get("rows") or 0),
                       changes=self.changes + int(metrics.get("changes") or 0),
                       exact=self.exact and snap is not None and chg is not None,
                       last_commit_us=ts if newer else self.last_commit_us,
                       lag_s=max(0.0, visible_ms / 1000 - ts / 1e6) if newer and ts is not None else self.lag_s,
                       updated_ms=int(time.time() * 1000))


def path(root: str, uid: str) -> str:
    return join(root, "sources", uid, RECORD)


def read(io: FileIO, root: str, uid: str) -> Record | None:
    """The record of mirror ``uid`` under ``root`` (None: none yet, or unreadable)."""
    try:
        return Record.from_json(io.read_bytes(path(root, uid)))
    except (FileNotFoundError, ValueError, TypeError, KeyError):
        return None


def write(io: FileIO, root: str, uid: str, record: Record) -> None:
    io.write_bytes(path(root, uid), record.to_json())
