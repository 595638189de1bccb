"""The snapshot of a MySQL/MariaDB table and where the binary log continues it, without locks.

Guarantee: :func:`open_snapshot` starts ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` (InnoDB, REPEATABLE
READ, read only) and reads MariaDB's status variables ``binlog_snapshot_file`` / ``binlog_snapshot_position``
in that transaction. MariaDB's group commit writes a transaction to the binary log and makes it visible to new
snapshots under one lock (``LOCK_commit_ordered``), and the consistent snapshot records the log position at
the same point: every transaction logged before that position is in the snapshot, none logged at or after it
is. So rows read in the snapshot, then the log's row events from that position applied by primary key, give
exactly the table at any later point (tests/connectors/mysql/test_snapshot.py checks it with a concurrent
writer). No ``FLUSH TABLES WITH READ LOCK`` and no ``LOCK TABLES``: writers never wait for the snapshot.

The position is a file and an offset. MariaDB offers no consistent GTID beside it (``@@gtid_binlog_pos`` is read
outside the snapshot and may be ahead of it; there is no ``binlog_snapshot_gtid``): the server derives it from the
file position, which is a transaction boundary (``BINLOG_GTID_POS``: :func:`.changes.gtid_at`, which any connection
may ask while the snapshot stays open). MySQL 8 has neither status variable (it needs the
low/high watermark scheme of Flink CDC, or ``performance_schema.log_status`` under a backup lock): refused here.

Chunks (:func:`plan_chunks`) are ranges of the primary key, ``lo <= key < hi`` (row comparison for composite
keys, in the column's collation for text keys), the first without ``lo`` and the last without ``hi``: together
they cover every key exactly once whatever was written while they were planned. A dense integer key is split
arithmetically (two index look-ups); any other key is walked through the primary index, one
``LIMIT 1 OFFSET splitSize`` step per chunk.

:func:`read_chunk` reads one chunk into Arrow typed by :mod:`.types`: PyMySQL's unbuffered cursor, its row packets
split into Arrow binary columns of the server's text a block of rows at a time (:mod:`.row_packets`), then one
Arrow cast per column -- several times PyMySQL's own row reader and converters (benchmarks/mysql_snapshot.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.mysql.connection import ConnectionInfo, connect, require_pymysql
from flinkish_spark.connectors.mysql.position import FilePosition
from flinkish_spark.connectors.mysql.row_packets import column_blocks
from flinkish_spark.connectors.mysql.types import ColumnType, arrow_type
from flinkish_spark.errors import ConfigError

BATCH_ROWS = 8192
_INTEGER = {"tinyint", "smallint", "mediumint", "int", "integer", "bigint"}
_ZERO_DATE = r"^(0000|\d{4}-00|\d{4}-\d\d-00)"


@dataclass(frozen=True)
class Column:
    name: str
    column_type: str  # information_schema.COLUMNS.COLUMN_TYPE


@dataclass(frozen=True)
class TableInfo:
    """A table's columns in order and its primary key columns (in key order)."""

    database: str
    table: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f"{quote(self.database)}.{quote(self.table)}"

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.column_type)) for c in self.columns])


@dataclass(frozen=True)
class Chunk:
    """``lo <= key < hi``; ``None`` is open. Bounds are key tuples (one value per key column)."""

    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class Snapshot:
    """An open consistent snapshot on its own connection, and the log position it is consistent with.

    Read chunks with :meth:`read` while it is open; :meth:`close` ends the transaction (a context manager)."""

    def __init__(self, conn: Any, position: FilePosition) -> None:
        self.conn = conn
        self.position = position

    def table(self, database: str, table: str) -> TableInfo:
        return table_info(self.conn, database, table)

    def chunks(self, info: TableInfo, split_size: int) -> list[Chunk]:
        return plan_chunks(self.conn, info, split_size)

    def read(self, info: TableInfo, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        return read_chunk(self.conn, info, chunk)

    def close(self) -> None:
        try:
            self.conn.rollback()  # read only: nothing to keep
        finally:
            self.conn.close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_snapshot(info: ConnectionInfo) -> Snapshot:
    """A consistent snapshot and the binary log position where the changes after it start (see the module)."""
    conn = connect(info)
    try:
        position = begin_snapshot(conn)
    except BaseException:
        conn.close()
        raise
    return Snapshot(conn, position)


def begin_snapshot(conn: Any) -> FilePosition:
    """On ``conn`` (no transaction open): start the snapshot; the position it is consistent with."""
    with conn.cursor() as cur:
        # TIMESTAMP values as UTC text (read_chunk reads them as instants); REPEATABLE READ is what the
        # consistent snapshot needs (under READ COMMITTED each statement would take a new one).
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        cur.execute("SHOW SESSION STATUS WHERE Variable_name IN ('binlog_snapshot_file', 'binlog_snapshot_position')")
        status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
    if "binlog_snapshot_file" not in status:
        conn.rollback()
        raise ConfigError("this server reports no binlog_snapshot_file (MySQL has none; MariaDB 5.3+ does): the "
                          "lock-free snapshot boundary needs MariaDB")
    if not status["binlog_snapshot_file"]:
        conn.rollback()
        raise ConfigError("the server writes no binary log (binlog_snapshot_file is empty): start it with log-bin")
    return FilePosition(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))


def table_info(conn: Any, database: str, table: str) -> TableInfo:
    """Columns and primary key from information_schema (a table without a primary key is refused)."""
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, COLUMN_KEY FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (database, table))
        columns = tuple(Column(str(n), str(t)) for n, t, _ in cur.fetchall())
        cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND "
                    "TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (database, table))
        key = tuple(str(r[0]) for r in cur.fetchall())
    if not columns:
        raise ConfigError(f"table {database}.{table} does not exist")
    if not key:
        raise ConfigError(f"table {database}.{table} has no primary key: its chunks and changes cannot be keyed")
    return TableInfo(database, table, columns, key)


# -- chunk planning --------------------------------------------------------------------------------------


def plan_chunks(conn: Any, info: TableInfo, split_size: int) -> list[Chunk]:
    """Key ranges of about ``split_size`` rows each covering the whole key space (see the module)."""
    if split_size < 1:
        raise ConfigError("splitSize must be at least 1")
    bounds = _dense_integer_bounds(conn, info, split_size)
    if bounds is None:
        bounds = _walked_bounds(conn, info, split_size)
    edges: list[tuple[Any, ...] | None] = [None, *bounds, None]
    return [Chunk(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _dense_integer_bounds(conn: Any, info: TableInfo, split_size: int) -> list[tuple[Any, ...]] | None:
    if len(info.key) != 1:
        return None
    (name,) = info.key
    ctype = next(c.column_type for c in info.columns if c.name == name)
    if ColumnType.parse(ctype).name not in _INTEGER:
        return None
    col = quote(name)
    with conn.cursor() as cur:
        cur.execute(f"SELECT min({col}), max({col}) FROM {info.qualified}")
        lo, hi = cur.fetchone()
        # InnoDB's estimate (TABLE_ROWS) can be far off: the count only decides dense or walked, not coverage.
        cur.execute("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (info.database, info.table))
        row = cur.fetchone()
    estimate = int(row[0] or 0) if row else 0
    if lo is None or estimate <= 0:
        return None
    span = int(hi) - int(lo) + 1
    if span > 1.5 * estimate:
        return None  # gaps: walk, so that chunks stay about split_size rows
    return [(v,) for v in range(int(lo) + split_size, int(hi) + 1, split_size)]


def _walked_bounds(conn: Any, info: TableInfo, split_size: int) -> list[tuple[Any, ...]]:
    cols = ", ".join(quote(k) for k in info.key)
    row_expr = f"({cols})" if len(info.key) > 1 else cols
    bounds: list[tuple[Any, ...]] = []
    with conn.cursor() as cur:
        while True:
            # The key is unique: each step moves past split_size distinct keys.
            if not bounds:
                cur.execute(f"SELECT {cols} FROM {info.qualified} ORDER BY {cols} LIMIT 1 OFFSET %s", (split_size,))
            else:
                marks = ", ".join(["%s"] * len(info.key))
                lo = f"({marks})" if len(info.key) > 1 else marks
                cur.execute(f"SELECT {cols} FROM {info.qualified} WHERE {row_expr} >= {lo} ORDER BY {cols} "
                            f"LIMIT 1 OFFSET %s", (*bounds[-1], split_size))
            row = cur.fetchone()
            if row is None:
                return bounds
            bounds.append(tuple(row))


def chunk_condition(info: TableInfo, chunk: Chunk) -> tuple[str, list[Any]]:
    """The chunk's WHERE condition with its parameters (row comparison for a composite key)."""
    cols = ", ".join(quote(k) for k in info.key)
    key = f"({cols})" if len(info.key) > 1 else cols
    marks = ", ".join(["%s"] * len(info.key))
    value = f"({marks})" if len(info.key) > 1 else marks
    where: list[str] = []
    params: list[Any] = []
    if chunk.lo is not None:
        where.append(f"{key} >= {value}")
        params.extend(chunk.lo)
    if chunk.hi is not None:
        where.append(f"{key} < {value}")
        params.extend(chunk.hi)
    return (" AND ".join(where) if where else "TRUE"), params


# -- reading ---------------------------------------------------------------------------------------------


def read_chunk(conn: Any, info: TableInfo, chunk: Chunk, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The chunk's rows as Arrow batches of ``info.arrow_schema``, read on ``conn`` (in its open snapshot)."""
    pymysql = require_pymysql()
    cond, params = chunk_condition(info, chunk)
    select = ", ".join(_select_expr(c) for c in info.columns)
    cur = pymysql.cursors.SSCursor(conn)
    try:
        cur.execute(f"SELECT {select} FROM {info.qualified} WHERE {cond}", params)
        schema = info.arrow_schema
        kinds = [ColumnType.parse(c.column_type) for c in info.columns]
        for columns in column_blocks(cur._result, len(info.columns), batch_rows):
            yield pa.RecordBatch.from_arrays([_to_arrow(v, k, f.type) for v, k, f in zip(columns, kinds, schema)],
                                             schema=schema)
    finally:
        cur.close()


def _select_expr(c: Column) -> str:
    name = ColumnType.parse(c.column_type).name
    col = quote(c.name)
    if name == "bit":
        return f"CAST({col} AS UNSIGNED) AS {col}"  # text digits; turned into bytes/bool below
    return col


def _to_arrow(raw_bytes: pa.Array, kind: ColumnType, target: pa.DataType) -> pa.Array:
    if kind.name == "bit":
        digits = raw_bytes.cast(pa.string()).cast(pa.uint64())  # CAST(bit AS UNSIGNED): its value as digits
        if pa.types.is_boolean(target):
            return pc.not_equal(digits, 0)
        size = (int(kind.args[0]) + 7) // 8 if kind.args else 1
        return pa.array([None if v is None else v.to_bytes(size, "big") for v in digits.to_pylist()], pa.binary())
    if pa.types.is_binary(target):
        return raw_bytes
    raw = raw_bytes.cast(pa.string())  # validates UTF-8 (the connection's character set is utf8mb4)
    if pa.types.is_string(target):
        return raw
    if pa.types.is_date32(target) or pa.types.is_timestamp(target):
        zero = pc.match_substring_regex(raw, _ZERO_DATE)
        raw = pc.if_else(zero, pa.scalar(None, pa.string()), raw)
        if pa.types.is_date32(target):
            return raw.cast(pa.date32())
        parsed = raw.cast(pa.timestamp("us"))
        return parsed if target.tz is None else pc.assume_timezone(parsed, "UTC")
    return raw.cast(target)
