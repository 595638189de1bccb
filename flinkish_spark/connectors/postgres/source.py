"""``flinkish.postgres`` source: a table's snapshot in parallel chunks that finish, then its changes.

Flink CDC's PostgreSQL source and Flink's HybridSource in the flinkish split model:

* **Snapshot** splits ``snapshot-<g>-<n>``: ranges of the split column (the first primary
  key column, or ``splitColumn``) of about ``splitSize`` rows, whose boundaries the
  enumerator computes once. A chunk is read whole, in Arrow through ADBC, in one epoch and
  is FINISHED from then on: it is never read again, also after a restart.
* **Changes** split ``changes-<g>``: its position is a WAL position (LSN). Each epoch's
  range ``[start, end)`` is fixed by the enumerator in ``latestOffset`` (end = the server's
  WAL flush position, or earlier under ``maxRowsPerTrigger``) and holds every transaction
  whose commit record starts in it. The reader peeks it from the slot
  (``pg_logical_slot_peek_binary_changes`` up to ``end``) without consuming, so a replay reads
  the same rows. The slot is advanced only in the "checkpoint complete" notification of an
  epoch (and the final notification), to that epoch's end -- never before.

Consistency between snapshot and changes (the reasoning the guarantee rests on): the slot is
created before the snapshot starts, at consistent point S. Chunks are read later, each at
its own moment T >= S, without an exported snapshot (a snapshot exported by a replication
connection dies with that connection; a chunked snapshot that survives restarts cannot keep
it). The change split starts only in the epoch after every chunk's epoch is committed, and
reads every change committed after S, in commit order. Each change is a full row image
(insert, update) or a key (delete); a key change is a delete of the old key then the new row.
For a sink that applies rows keyed by the primary key (upsert + deletes), the last change of
a key determines its final value whatever the snapshot held, and a key without a change after
S was the same at S and at T. So after the change stream has passed the time the last chunk
was read, the target equals the table; in between it may briefly show older values of keys
that changed during the snapshot (re-applied changes). Not covered: a ``TRUNCATE`` (the source
stops with an error), an update that leaves a TOASTed value (> ~2 kB) unchanged (the source
stops with an error naming the column, unless the table has ``REPLICA IDENTITY FULL``: then the
value comes from the old row), changes of the table's
columns while running, and an append-only sink (it would see the overlap as duplicates).

Output: the table's columns, plus ``_op`` (``r`` snapshot read, ``c`` insert, ``u`` update,
``d`` delete), ``_lsn`` (the commit LSN of the change's transaction, null for snapshot rows)
and ``_commit_ts``. An epoch's changes are one Spark partition in WAL order (commit order,
then order within the transaction): a keyed sink that keeps the last row per key in the
order Spark produced them (as the ``flinkish.postgres`` sink does) applies them right.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from decimal import Decimal
from datetime import date, datetime, timezone
from typing import Any, Callable, ClassVar, Collection, Iterator, Literal

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.postgres import publication as publications
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import (
    ConnectionInfo, adbc_connect, check_server_version, connect, parse_url,
)
from flinkish_spark.connectors.primary_key import with_primary_key
from flinkish_spark.connectors.postgres.pgoutput import (
    Begin,
    Change,
    Truncate,
    decode_changes,
    decode_message,
    format_lsn,
    parse_lsn,
)
from flinkish_spark.errors import ConfigError, PostgresSourceError
from flinkish_spark.options import Options
from flinkish_spark.source.datasource import SplitDataSource
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.planning import ReadRange
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split, SplitExtent

Startup = Literal["snapshot", "snapshotThenChanges", "changes"]
OnSlotLost = Literal["fail", "resnapshot"]

DEFAULT_SPLIT_SIZE = 100_000
BATCH_ROWS = 65_536
#: How long a reader waits for a slot that a killed run's backend still holds.
SLOT_BUSY_WAIT_S = 60.0
METADATA_COLUMNS = ("_op", "_lsn", "_commit_ts")
#: ``_op`` of the marker rows around a re-snapshot (``onSlotLost=resnapshot``): every other column
#: is null. The slot was lost, so the deletes of the gap are too; a keyed target applies 'E' by
#: deleting each key that the snapshot rows since 'B' did not hold (the flinkish.postgres sink
#: with deletes=true does: :mod:`flinkish_spark.connectors.postgres.resnapshot`).
RESNAPSHOT_BEGIN, RESNAPSHOT_END = "B", "E"


# -- the table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    pg_type: str  # pg_type.typname (int4, numeric, timestamptz, ...)
    spark_type: str  # a Spark DDL type
    as_text: bool  # read through ::text (types Spark has no equivalent of, numeric)


@dataclass(frozen=True)
class TableInfo:
    schema: str
    name: str
    columns: tuple[ColumnInfo, ...]
    key: tuple[str, ...]  # primary key columns, in key order (empty: none)
    split_column: str

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> ColumnInfo:
        return next(c for c in self.columns if c.name == name)

    def spark_ddl(self) -> str:
        cols = [f"`{c.name}` {c.spark_type}" for c in self.columns]
        return ", ".join(cols + ["`_op` string", "`_lsn` bigint", "`_commit_ts` timestamp"])

    def spark_schema(self) -> StructType:
        """The stream's schema (as :meth:`spark_ddl`) with the primary key marked for keyed sinks
        (:mod:`flinkish_spark.connectors.primary_key`)."""
        fields = [{"name": c.name, "type": _JSON_TYPE.get(c.spark_type, c.spark_type), "nullable": True}
                  for c in self.columns]
        fields += [{"name": "_op", "type": "string", "nullable": True}, {"name": "_lsn", "type": "long", "nullable": True},
                   {"name": "_commit_ts", "type": "timestamp", "nullable": True}]
        return with_primary_key(fields, self.key)


# Spark DDL type names (spark_type) whose JSON form differs; decimal(p,s) and the rest are the same.
_JSON_TYPE = {"smallint": "short", "int": "integer", "bigint": "long"}


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def spark_type(typname: str, typmod: int) -> tuple[str, bool]:
    """The Spark type of a PostgreSQL column, and whether it is read as text."""
    simple = {
        "int2": "smallint", "int4": "int", "int8": "bigint", "float4": "float", "float8": "double",
        "bool": "boolean", "date": "date", "timestamp": "timestamp_ntz", "timestamptz": "timestamp",
        "bytea": "binary", "text": "string", "varchar": "string", "bpchar": "string", "name": "string",
    }
    if typname in simple:
        return simple[typname], False
    if typname == "numeric" and typmod >= 4:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        if precision <= 38:
            return f"decimal({precision},{scale})", True
    return "string", True  # uuid, json, jsonb, numeric without precision, arrays, ...: lossless text


def load_table_info(conn: Any, table: str, split_column: str | None, what: str) -> TableInfo:
    row = conn.execute(
        "SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = to_regclass(%s)",
        (table,),
    ).fetchone()
    if row is None:
        raise PostgresSourceError(f"{what}: table {table!r} does not exist (or is not visible to this role)")
    oid, schema_name, rel_name = row
    cols = conn.execute(
        "SELECT a.attname, t.typname, a.atttypmod FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (oid,),
    ).fetchall()
    key = [
        r[0]
        for r in conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s AND i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (oid,),
        ).fetchall()
    ]
    columns = []
    for name, typname, typmod in cols:
        if name in METADATA_COLUMNS:
            raise PostgresSourceError(f"{what}: table {schema_name}.{rel_name} has a column named {name!r}, which the source adds itself")
        st, as_text = spark_type(str(typname), int(typmod))
        columns.append(ColumnInfo(str(name), str(typname), st, as_text))
    names = [c.name for c in columns]
    if split_column is not None and split_column not in names:
        raise ConfigError(f"{what}: option 'splitColumn' names {split_column!r}, which is not a column of {schema_name}.{rel_name} ({', '.join(names)})")
    chosen = split_column or (key[0] if key else None)
    if chosen is None:
        raise PostgresSourceError(
            f"{what}: table {schema_name}.{rel_name} has no primary key. The snapshot is split by key ranges "
            "and changes are applied by key: add a primary key (ALTER TABLE ... ADD PRIMARY KEY (...)), or, "
            "for startup=snapshot only, name an orderable column with the option 'splitColumn'"
        )
    return TableInfo(str(schema_name), str(rel_name), tuple(columns), tuple(key), chosen)


# -- the splits ----------------------------------------------------------------------------


def chunk_id(generation: int, n: int) -> str:
    return f"snapshot-{generation}-{n:05d}"


def changes_id(generation: int) -> str:
    return f"changes-{generation}"


def split_generation(split_id: str) -> int:
    return int(split_id.split("-")[1])


@dataclass(frozen=True)
class Chunk:
    lo: str | None  # inclusive, as text; None = from the start
    hi: str | None  # exclusive, as text; None = to the end (and the NULLs of a nullable split column)

    def to_payload(self) -> str:
        return json.dumps({"lo": self.lo, "hi": self.hi})

    @classmethod
    def from_payload(cls, payload: str | None) -> "Chunk":
        d = json.loads(payload or "{}")
        return cls(d.get("lo"), d.get("hi"))


def chunk_boundaries(conn: Any, info: TableInfo, split_size: int) -> list[Chunk]:
    """Ranges of the split column holding about ``split_size`` rows each (equal values stay together).

    A dense integer key (as many rows as values between its minimum and maximum, by the
    planner's row estimate) is split arithmetically: two index look-ups. Any other column is
    walked through its index, one ``OFFSET split_size LIMIT 1`` step per chunk (a single pass
    over the index in all, several times cheaper than numbering every row).
    """
    bounds = _dense_integer_bounds(conn, info, split_size)
    if bounds is None:
        bounds = _walked_bounds(conn, info, split_size)
    edges: list[str | None] = [None, *bounds, None]
    return [Chunk(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _dense_integer_bounds(conn: Any, info: TableInfo, split_size: int) -> list[str] | None:
    if info.column(info.split_column).pg_type not in ("int2", "int4", "int8"):
        return None
    col = quote_ident(info.split_column)
    lo, hi, estimate = conn.execute(
        f"SELECT min({col}), max({col}), (SELECT reltuples FROM pg_class WHERE oid = %s::regclass) FROM {info.qualified}",
        (info.qualified,),
    ).fetchone()
    if lo is None or estimate is None or estimate <= 0:
        return None  # empty, or never analysed: walk
    span = int(hi) - int(lo) + 1
    if span > 1.1 * float(estimate):
        return None  # gaps (or a stale estimate): walk, so that chunks stay about split_size rows
    return [str(v) for v in range(int(lo) + split_size, int(hi) + 1, split_size)]


def _walked_bounds(conn: Any, info: TableInfo, split_size: int) -> list[str]:
    col, cast = quote_ident(info.split_column), _cast_type(info, info.split_column)
    bounds: list[str] = []
    # The output is aliased: named like the column, ORDER BY would sort the text, not the values.
    while True:
        if not bounds:
            row = conn.execute(
                f"SELECT {col}::text AS b FROM {info.qualified} WHERE {col} IS NOT NULL ORDER BY {col} OFFSET %s LIMIT 1",
                (split_size,),
            ).fetchone()
        else:
            row = conn.execute(
                f"SELECT {col}::text AS b FROM {info.qualified} WHERE {col} >= %s::{cast} ORDER BY {col} OFFSET %s LIMIT 1",
                (bounds[-1], split_size),
            ).fetchone()
            if row is not None and row[0] == bounds[-1]:
                # More than split_size rows share this value: they stay in one chunk.
                row = conn.execute(
                    f"SELECT min({col})::text FROM {info.qualified} WHERE {col} > %s::{cast}", (bounds[-1],)
                ).fetchone()
                row = None if row is None or row[0] is None else row
        if row is None:
            return bounds
        bounds.append(row[0])


def _cast_type(info: TableInfo, column: str) -> str:
    return info.column(column).pg_type


# -- enumerator (driver) ---------------------------------------------------------------------


class PostgresEnumerator(SplitEnumerator):
    """Plans chunks once, then the change stream's WAL ranges; advances the slot on completion."""

    def __init__(self, source: "PostgresSourceDataSource") -> None:
        self.source = source
        self.generation = 0
        self.started = False
        self.snapshot_done = False
        self.changes_discovered = False

    # state ----------------------------------------------------------------------------------

    def snapshot_state(self) -> bytes:
        return json.dumps(
            {"generation": self.generation, "started": self.started, "snapshot_done": self.snapshot_done,
             "changes_discovered": self.changes_discovered}
        ).encode()

    def restore(self, state: bytes) -> None:
        if state:
            d = json.loads(state)
            self.generation = int(d.get("generation", 0))
            self.started = bool(d.get("started", False))
            self.snapshot_done = bool(d.get("snapshot_done", False))
            self.changes_discovered = bool(d.get("changes_discovered", False))

    # planning ---------------------------------------------------------------------------------

    @property
    def uses_slot(self) -> bool:
        return self.source.startup != "snapshot"

    def discover(self, known: Collection[str]) -> list[Split]:
        src = self.source
        if not self.started:
            return self._start(known)
        if self.uses_slot:
            lost = self._slot_lost()
            if lost is not None:
                if src.on_slot_lost == "fail":
                    raise lost
                self.generation += 1  # a new slot and a new snapshot; the old splits end where they are
                self.snapshot_done = self.changes_discovered = False
                return self._start(known)
        if src.startup != "snapshot" and self.snapshot_done and not self.changes_discovered:
            self.changes_discovered = True
            return [Split(changes_id(self.generation))]
        return []

    def _start(self, known: Collection[str]) -> list[Split]:
        src = self.source
        info = src.table_info()
        out: list[Split] = []
        with connect(src.conn_info, autocommit=True) as conn:
            if self.uses_slot:
                slots.check_logical_replication(conn, src.component)
                # The slot first: every change after its consistent point is kept for us.
                slots.ensure_slot_and_publication(
                    conn, src.io, src.checkpoint_store().directory, src.slot_name, src.publication,
                    (info.schema, info.name), [c.name for c in info.columns], src.publication_given, src.component,
                )
            # A re-snapshot (generation > 0) reads the table whatever the startup: the changes
            # in the gap are gone, and only the table itself can say what they did.
            resnapshot = self.generation > 0
            if src.startup != "changes" or resnapshot:
                chunks = chunk_boundaries(conn, info, src.split_size)
                out = [Split(chunk_id(self.generation, i), c.to_payload()) for i, c in enumerate(chunks)]
        if src.startup == "changes" and not resnapshot:
            self.snapshot_done = self.changes_discovered = True
            out.append(Split(changes_id(self.generation)))
        self.started = True
        return [s for s in out if s.split_id not in known]

    def _slot_lost(self) -> PostgresSourceError | None:
        src = self.source
        with connect(src.conn_info, autocommit=True) as conn:
            state, _, _ = slots.slot_info(conn, src.slot_name)
        if state == "ok":
            return None
        return PostgresSourceError(
            f"{src.component}: the replication slot {src.slot_name!r} is {state} "
            f"({'dropped' if state == 'missing' else 'invalidated by the server, e.g. max_slot_wal_keep_size'}) "
            "while this source still needs it: the changes since the last committed epoch are gone from the WAL "
            "and the target would silently miss them. Start again with a new snapshot: set the option "
            "onSlotLost=resnapshot -- the source makes a new slot and reads the table again between two marker rows "
            "(_op 'B' and 'E'), at which the flinkish.postgres sink (mode=upsert, deletes=true) also deletes the "
            "target's keys that the table no longer holds; any other target must drop those keys itself "
            "(docs/postgres-source.md, 'A lost slot')"
        )

    def extent(self, split: Split, position: int) -> SplitExtent:
        gen = split_generation(split.split_id)
        if gen < self.generation:
            return SplitExtent(position, position)  # superseded by a new snapshot after a lost slot
        if split.split_id.startswith("snapshot-"):
            return SplitExtent(1, 1)  # a chunk is read whole, in one epoch
        return SplitExtent(max(position, self._change_target(position, self.source.max_rows_per_trigger)), None)

    def drain_position(self, split: Split, position: int) -> int:
        if split_generation(split.split_id) < self.generation:
            return position
        if split.split_id.startswith("snapshot-"):
            return 1  # the drain epoch reads the rest of the snapshot
        return self._change_target(position, None)

    def _change_target(self, position: int, limit: int | None) -> int:
        """The end of the next WAL range: the flush position, if a transaction of ours lies before it.

        The flush position (not the insert or write position): the reader's peek decodes up
        to the flushed WAL at *its* time, which is never less than this, so the first read
        and every replay see the same transactions.
        """
        src = self.source
        want = limit or 1
        stale = 0  # messages of transactions before ``position`` that the slot still returns
        with connect(src.conn_info, autocommit=True) as conn:
            flush = parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
            while True:
                rows = _peek(conn, src.slot_name, src.publication, flush, want + stale)
                finals, old = [], 0
                current: int | None = None
                for data in rows:
                    if data[:1] == b"B":
                        msg = decode_message(data)
                        assert isinstance(msg, Begin)
                        current = msg.final_lsn
                        if current >= position:
                            finals.append(current)
                    if current is None or current < position:
                        old += 1
                # The slot lags behind ``position`` only until the completed epoch's advance
                # (normally done just before): peek again past the transactions already read.
                if old <= stale or len(rows) < want + stale:
                    break
                stale = old
        if not finals:
            return position  # nothing new: no epoch (and no empty batch) is made
        if limit is not None and len(rows) - old >= limit:
            return finals[-1] + 1  # the peek stopped after a whole transaction: end just after it
        return flush

    def no_more_splits(self) -> bool:
        if not self.started:
            return False
        return self.source.startup == "snapshot" or self.changes_discovered

    # notifications ------------------------------------------------------------------------------

    def on_checkpoint_complete(self, checkpoint: SourceCheckpoint) -> None:
        gen_chunks = [s for s in checkpoint.splits if s.split_id.startswith(f"snapshot-{self.generation}-")]
        if self.started and all(s.finished for s in gen_chunks):
            self.snapshot_done = True
        if not self.uses_slot:
            return
        change = next((s for s in checkpoint.splits if s.split_id == changes_id(self.generation)), None)
        src = self.source
        owned = slots.Ownership.read(src.io, src.checkpoint_store().directory)
        with connect(src.conn_info, autocommit=True) as conn:
            if change is not None and change.position > 0:
                _with_busy_slot(lambda: slots.advance(conn, src.slot_name, change.position))
            if checkpoint.finished and owned is not None:
                # The last epoch is committed: nothing will ever read the slot again.
                _with_busy_slot(lambda: slots.drop(conn, owned))


def _peek(conn: Any, slot: str, publication: str, upto: int, nchanges: int | None) -> list[bytes]:
    def run() -> list[bytes]:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            "'proto_version', '1', 'publication_names', %s)",
            (slot, format_lsn(upto), nchanges, publication),
        ).fetchall()
        return [bytes(r[0]) for r in rows]

    return _with_busy_slot(run)


def _with_busy_slot(fn: Callable[[], Any]) -> Any:
    """Run ``fn``, waiting while the slot is held by another backend (a killed run's peek ends soon)."""
    psycopg = __import__("psycopg")
    deadline = time.time() + SLOT_BUSY_WAIT_S
    while True:
        try:
            return fn()
        except psycopg.errors.ObjectInUse:
            if time.time() >= deadline:
                raise
            time.sleep(0.5)


# -- reader (executors) ---------------------------------------------------------------------------


def _converter(col: ColumnInfo) -> Callable[[str], object]:
    t = col.pg_type
    if t in ("int2", "int4", "int8"):
        return int
    if t in ("float4", "float8"):
        return float
    if t == "bool":
        return lambda v: v == "t"
    if t == "date":
        return date.fromisoformat
    if t == "timestamp":
        return datetime.fromisoformat
    if t == "timestamptz":
        return lambda v: datetime.fromisoformat(v).astimezone(timezone.utc)
    if t == "bytea":
        return lambda v: bytes.fromhex(v[2:]) if v.startswith("\\x") else v.encode()
    if col.spark_type.startswith("decimal"):
        return Decimal
    return str


class PostgresReader(SplitReader):
    def __init__(self, source: "PostgresSourceDataSource", schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.source = source
        self.info = source.table_info()
        self.target = to_arrow_schema(schema, timezone="UTC")

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        if start >= end:
            return
        if split.split_id.startswith("snapshot-"):
            chunk = Chunk.from_payload(split.payload)
            # A re-snapshot after a lost slot is bracketed by markers (see RESNAPSHOT_BEGIN): the
            # first chunk (no lower bound) opens it, the last (no upper bound) closes it. Chunks are
            # planned in order, so the two land in its first and last epoch.
            resnapshot = split_generation(split.split_id) > 0
            if resnapshot and chunk.lo is None:
                yield self._marker(RESNAPSHOT_BEGIN)
            yield from self._read_chunk(chunk)
            if resnapshot and chunk.hi is None:
                yield self._marker(RESNAPSHOT_END)
        else:
            yield from self._read_changes(start, end)

    def _chunk_query(self, chunk: Chunk) -> str:
        """The chunk's SELECT, its bounds as literals.

        Literals, not parameters: ADBC streams a query without parameters through binary
        ``COPY (query) TO STDOUT`` batch by batch, but runs a query with parameters as a
        prepared statement whose whole result it buffers before the first batch -- the
        chunk's every row in memory, and Spark waiting idle until the last one arrived.
        The bounds are the server's own text output of the split column (psycopg quotes them).
        """
        from psycopg import sql

        info = self.info
        cols = ", ".join(
            f"{quote_ident(c.name)}::text AS {quote_ident(c.name)}" if c.as_text else quote_ident(c.name)
            for c in info.columns
        )
        k, cast = quote_ident(info.split_column), _cast_type(info, info.split_column)
        where = []
        if chunk.lo is not None:
            where.append(f"{k} >= {sql.Literal(chunk.lo).as_string().strip()}::{cast}")
        if chunk.hi is not None:
            where.append(f"{k} < {sql.Literal(chunk.hi).as_string().strip()}::{cast}")
        cond = " AND ".join(where) if where else "TRUE"
        if chunk.hi is None:
            cond = f"({cond}) OR {k} IS NULL"
        return f"SELECT {cols} FROM {info.qualified} WHERE {cond}"

    def _read_chunk(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        src = self.source
        try:
            yield from self._chunk_batches(self._chunk_query(chunk))
        except Exception as e:
            if isinstance(e, PostgresSourceError):
                raise
            raise PostgresSourceError(f"{src.component}: reading {self.info.display} failed: {src.conn_info.mask(str(e))}") from None

    def _chunk_batches(self, query: str) -> Iterator[pa.RecordBatch]:
        src = self.source
        conn = adbc_connect(src.conn_info)
        try:
            cur = conn.cursor()
            try:
                cur.execute(query)
                for batch in cur.fetch_record_batch():
                    if batch.num_rows:
                        yield self._with_metadata(batch, "r")
            finally:
                cur.close()
        finally:
            conn.close()

    def _marker(self, op: str) -> pa.RecordBatch:
        """A row with ``_op`` = ``op`` and every other column null."""
        return pa.RecordBatch.from_arrays(
            [pa.array([op], f.type) if f.name == "_op" else pa.nulls(1, f.type) for f in self.target], schema=self.target)

    def _with_metadata(self, batch: pa.RecordBatch, op: str) -> pa.RecordBatch:
        n = batch.num_rows
        arrays = list(batch.columns) + [
            pa.repeat(pa.scalar(op), n), pa.nulls(n, pa.int64()), pa.nulls(n, pa.timestamp("us", tz="UTC")),
        ]
        return pa.RecordBatch.from_arrays(arrays, names=list(batch.schema.names) + list(METADATA_COLUMNS))

    def _read_changes(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        src, info = self.source, self.info
        converters = {c.name: _converter(c) for c in info.columns}
        rows: list[tuple[str, Change]] = []

        def flush() -> pa.RecordBatch:
            fields = {f.name: f for f in self.target}
            arrays = []
            for c in info.columns:
                conv = converters[c.name]
                values = [None if (v := ch.values.get(c.name)) is None else conv(v) for _, ch in rows]  # type: ignore[arg-type]
                arrays.append(pa.array(values, fields[c.name].type))
            arrays.append(pa.array([op for op, _ in rows], pa.string()))
            arrays.append(pa.array([ch.commit_lsn for _, ch in rows], pa.int64()))
            arrays.append(pa.array([ch.commit_ts_us for _, ch in rows], pa.timestamp("us", tz="UTC")))
            return pa.RecordBatch.from_arrays(arrays, names=[c.name for c in info.columns] + list(METADATA_COLUMNS))

        with connect(src.conn_info, autocommit=True) as conn:
            messages = _peek(conn, src.slot_name, src.publication, end, None)
        for change in decode_changes(messages, start, end):
            if isinstance(change, Truncate):
                if len(change.tables) == len(change.relids) and (info.schema, info.name) not in change.tables:
                    continue  # another table of a publication the user gave
                raise PostgresSourceError(
                    f"{src.component}: {info.display} was truncated (in the WAL range {format_lsn(start)}..{format_lsn(end)}); "
                    "a TRUNCATE cannot be expressed as row changes. Restart with a new snapshot (a new uid, or drop "
                    f"the slot {src.slot_name!r} and set onSlotLost=resnapshot)"
                )
            rel = change.relation
            if (rel.namespace, rel.name) != (info.schema, info.name):
                continue
            for name, value in change.values.items():
                if value is not None and not isinstance(value, str):
                    raise PostgresSourceError(
                        f"{src.component}: an update of {info.display} at LSN {format_lsn(change.commit_lsn)} left the "
                        f"TOASTed value of column {name!r} unchanged, and the server did not send it; the change "
                        f"cannot be a full row. Run ALTER TABLE {info.display} REPLICA IDENTITY FULL (the server then sends "
                        "the old row, which holds the value) and start over with a new snapshot, since this change is already "
                        f"in the WAL without it: SELECT pg_drop_replication_slot('{src.slot_name}') and restart with "
                        "onSlotLost=resnapshot, or use a new uid"
                    )
            if change.op == "d" and info.key:
                # With the default replica identity only the key is sent; the rest is null.
                change = Change("d", rel, {k: change.values.get(k) for k in info.key}, change.commit_lsn,
                                change.commit_ts_us, change.seq)
            rows.append((change.op, change))
            if len(rows) >= BATCH_ROWS:
                yield flush()
                rows = []
        if rows:
            yield flush()


# -- the data source -------------------------------------------------------------------------------


class PostgresSourceDataSource(SplitDataSource):
    """``spark.readStream.format("flinkish.postgres")``.

    Options are validated lazily -- in :meth:`schema` and :meth:`streamReader`, not in
    ``__init__`` -- so that a class serving ``writeStream`` under the same format name can
    inherit from this one and never have its sink options checked as source options.
    """

    KIND: ClassVar[str] = "flinkish.postgres"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = (
        "url", "passwordEnv", "table", "startup", "splitSize", "splitColumn", "maxRowsPerTrigger",
        "slotName", "publication", "onSlotLost", "snapshotPartitions",
    )

    def __init__(self, options: Any) -> None:
        DataSource.__init__(self, options)

    @property
    def component(self) -> str:
        return f"{self.KIND} source"

    def configure(self, opts: Options) -> None:
        url = opts.required("url", "a libpq URI, e.g. postgresql://user@host:5432/db (password via PGPASSWORD or 'passwordEnv')")
        self.password_env = (opts.get("passwordEnv") or "").strip() or None
        self.conn_info: ConnectionInfo = parse_url(url, self.password_env, f"{self.component}: option 'url'")
        self.table = opts.required("table", "the table to read, e.g. public.orders")
        self.startup: Startup = opts.choice("startup", ("snapshot", "snapshotThenChanges", "changes"), "snapshotThenChanges")
        self.split_size = opts.integer("splitSize", DEFAULT_SPLIT_SIZE, minimum=1) or DEFAULT_SPLIT_SIZE
        self.split_column = (opts.get("splitColumn") or "").strip() or None
        self.max_rows_per_trigger = opts.integer("maxRowsPerTrigger", None, minimum=1)
        self.snapshot_partitions = opts.integer("snapshotPartitions", None, minimum=1) or os.cpu_count() or 2
        self.on_slot_lost: OnSlotLost = opts.choice("onSlotLost", ("fail", "resnapshot"), "fail")
        default_name = "flinkish_" + re.sub(r"[^a-z0-9_]", "_", self.uid.lower())
        self.slot_name = (opts.get("slotName") or "").strip() or default_name[:63]
        if not re.fullmatch(r"[a-z0-9_]{1,63}", self.slot_name):
            raise ConfigError(f"{self.component}: option 'slotName' may only hold a-z, 0-9 and _ (at most 63), got {self.slot_name!r}")
        given = (opts.get("publication") or "").strip()
        self.publication_given = bool(given)
        self.publication = given or default_name[:63]
        if self.startup == "snapshot" and (opts.has("slotName") or opts.has("publication") or opts.has("onSlotLost")):
            raise ConfigError(f"{self.component}: startup=snapshot uses no replication slot; drop the options slotName, publication and onSlotLost")
        self._table_info: TableInfo | None = None

    def config(self) -> dict[str, Any]:
        # What defines the data: never the URL (it may hold a password).
        return {"table": self.table, "startup": self.startup, "splitSize": self.split_size,
                "splitColumn": self.split_column, "slotName": self.slot_name if self.startup != "snapshot" else None}

    def table_info(self) -> TableInfo:
        if self._table_info is None:
            with connect(self.conn_info, autocommit=True) as conn:
                check_server_version(conn, self.conn_info, self.component)
                info = load_table_info(conn, self.table, self.split_column, self.component)
                if self.startup != "snapshot":
                    slots.check_logical_replication(conn, self.component)
                    # At every start, not only the first: a publication can be altered while stopped.
                    # (One of this name that is neither given nor ours is refused when the slot is made.)
                    owned = slots.Ownership.read(self.io, self.checkpoint_store().directory)
                    if self.publication_given or (owned is not None and owned.publication_created):
                        publications.check(conn, self.publication, (info.schema, info.name),
                                           [c.name for c in info.columns], self.component)
                    if not info.key:
                        raise PostgresSourceError(
                            f"{self.component}: table {info.display} has no primary key, so its changes carry no key "
                            "(and the server refuses its updates and deletes once it is published). Add a primary key, "
                            "or use startup=snapshot with 'splitColumn'"
                        )
            self._table_info = info
        return self._table_info

    def schema(self) -> StructType:
        self.setup_source()
        return self.table_info().spark_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.setup_source()
        self.table_info()  # on the driver, before anything is written; pickled to the executors with the reader
        return super().streamReader(schema)

    def default_read_limit(self) -> ReadLimit:
        if self.max_rows_per_trigger is not None:
            return ReadMaxFiles(max(1, self.max_rows_per_trigger // self.split_size))
        return ReadAllAvailable()

    def group_ranges(self, ranges: list[ReadRange]) -> list[list[ReadRange]]:
        """An epoch's chunks in at most ``snapshotPartitions`` tasks (consecutive chunks each), changes alone.

        A task per chunk costs each chunk a Spark task, a Python worker round trip, an ADBC
        connection and an output file: with the default splitSize, most of the snapshot's
        time on two cores (see docs/benchmarks.md). The change range stays one partition (WAL order).
        """
        chunks = [r for r in ranges if r.split_id.startswith("snapshot-")]
        groups: list[list[ReadRange]] = [[r] for r in ranges if not r.split_id.startswith("snapshot-")]
        n = min(self.snapshot_partitions, len(chunks))
        for i in range(n):
            groups.append(chunks[len(chunks) * i // n: len(chunks) * (i + 1) // n])
        return groups

    def create_enumerator(self) -> PostgresEnumerator:
        return PostgresEnumerator(self)

    def create_reader(self, schema: StructType) -> PostgresReader:
        return PostgresReader(self, schema)

    def write_descriptor(self) -> None:
        """As the base class, but with the password masked out of the URL and 'passwordEnv' kept.

        The final notification (which drops the slot) rebuilds the source from this file in the
        driver's process: it connects with PGPASSWORD or the variable 'passwordEnv' names.
        """
        options = {k: v for k, v in self.raw_options.items() if k not in ("storageOptions",)}
        options["url"] = self.conn_info.url  # the URI without its password
        cls = type(self)
        descriptor = {"class": f"{cls.__module__}:{cls.__qualname__}", "options": options}
        from flinkish_spark.source.datasource import DESCRIPTOR_FILE

        self.io.write_bytes(f"{self.checkpoint_store().directory}/{DESCRIPTOR_FILE}", json.dumps(descriptor).encode())
