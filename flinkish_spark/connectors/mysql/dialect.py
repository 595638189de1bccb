"""MySQL/MariaDB as a dialect of the CDC core: its catalog and snapshot half (:class:`..cdc.dialect.CatalogDialect`).

What it answers, from :mod:`.snapshot` and ``information_schema``:

* **Tables** (:meth:`MysqlDialect.find_tables`): base tables outside the system databases, as
  ``database.table`` against the ``tables`` patterns (unquoted parts fold to lower case, so a table
  named with capitals is written quoted: ``shop."Orders"``). A table without a primary key is left out
  with a warning (its changes could not be applied by key). The table's id is a stable hash of its name:
  MySQL has no catalog id that survives a restart and is readable without PROCESS; a ``RENAME`` or a
  ``DROP``/``CREATE`` under one name is the binary log's DDL to follow, not the catalog's.
* **No signature**: every DDL is in the binary log (the log reader follows it), so nothing changes a
  table's rows without a log event; ``signatures`` is empty and never asks for a re-snapshot.
* **Positions**: a file position as an integer, ``file sequence << 32 | offset`` (``binlog.000042`` at
  1234 is ``42 << 32 | 1234``; a file is at most 1 GiB); the base name is the server's
  (:meth:`MysqlDialect.format_position` gives ``binlog.000042:1234`` back).
* **Joining**: the binary log carries every table from the start (no publication): a table's chunks
  wait for nothing (``after_xid = None``), except -- under a name followed before -- for the changes
  before the join to be committed downstream (:meth:`MysqlDialect.unread_before`, from the positions
  :meth:`MysqlDialect.release` was given: a restarted source waits for its first completed epoch).
* **Chunks** (:meth:`MysqlDialect.plan_chunks`): :func:`.snapshot.plan_chunks`' primary key ranges, their
  bounds as JSON (:func:`bound_to_json`); :meth:`MysqlDialect.read_chunk_arrow` reads one in a consistent
  snapshot of its own (``START TRANSACTION WITH CONSISTENT SNAPSHOT``), typed by :mod:`.types`.

Not here yet: the change-log half (ranges of the binary log, purge checks -- :mod:`.binlog`,
:mod:`.position`) and the chunk's rows in the stream schema (the MySQL columns in the stream's
``TableSchema``). docs/cdc-core.md.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
from contextlib import closing
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ContextManager, Iterator

import pyarrow as pa

from flinkish_spark.connectors.cdc.dialect import JoinMark, TableChunks
from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns
from flinkish_spark.connectors.cdc.registry import TableEntry
from flinkish_spark.connectors.mysql.connection import ConnectionInfo, connect
from flinkish_spark.connectors.mysql.position import FilePosition
from flinkish_spark.connectors.mysql.snapshot import Chunk, begin_snapshot, plan_chunks, read_chunk, table_info
from flinkish_spark.errors import TerminalError

if TYPE_CHECKING:
    from flinkish_spark.connectors.cdc.dialect import CatalogDialect

#: Databases never followed.
SYSTEM_DATABASES = ("mysql", "information_schema", "performance_schema", "sys")
_OFFSET_BITS = 32


def table_id(name: str) -> int:
    """The registry's id of the table ``database.table``: a stable 63-bit hash of its name (see the module)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> 1


def encode_position(position: FilePosition) -> int:
    _, seq, offset = position.key
    return seq << _OFFSET_BITS | offset


def decode_position(base: str, position: int) -> FilePosition:
    return FilePosition(f"{base}.{position >> _OFFSET_BITS:06d}", position & ((1 << _OFFSET_BITS) - 1))


def bound_to_json(value: Any) -> Any:
    """A key value as JSON (the chunk's payload); :func:`bound_of_json` gives a query parameter back."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return {"text": str(value)}  # as the server prints it: compares as the column's type
    raise TypeError(f"a primary key value of type {type(value).__name__} cannot be a chunk bound")


def bound_of_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "decimal" in value:
            return Decimal(value["decimal"])
        if "bytes" in value:
            return base64.b64decode(value["bytes"])
        return value["text"]
    return value


class MysqlDialect:
    """The catalog and snapshot half of a MySQL/MariaDB source (see the module docstring)."""

    def __init__(self, info: ConnectionInfo, component: str = "flinkish.mysql source") -> None:
        self.info = info
        self._component = component
        self._base: str | None = None  # the binary log's base name (binlog.000012 -> binlog)
        self._released = -1  # the greatest position release() was given in this process

    @property
    def component(self) -> str:
        return self._component

    def error(self, message: str) -> TerminalError:
        return TerminalError(message)

    def connect(self) -> ContextManager[Any]:
        return closing(connect(self.info))

    # catalog -----------------------------------------------------------------------------------------

    def find_tables(self, conn: Any, patterns: TablePatterns) -> list[FoundTable]:
        marks = ", ".join(["%s"] * len(SYSTEM_DATABASES))
        with conn.cursor() as cur:
            cur.execute(
                "SELECT t.TABLE_SCHEMA, t.TABLE_NAME, EXISTS (SELECT 1 FROM information_schema.STATISTICS s WHERE "
                "s.TABLE_SCHEMA = t.TABLE_SCHEMA AND s.TABLE_NAME = t.TABLE_NAME AND s.INDEX_NAME = 'PRIMARY') "
                f"FROM information_schema.TABLES t WHERE t.TABLE_TYPE = 'BASE TABLE' AND t.TABLE_SCHEMA NOT IN ({marks})",
                SYSTEM_DATABASES)
            rows = cur.fetchall()
        found = []
        for db, table, keyed in rows:
            name = f"{db}.{table}"
            if patterns.matches(name):
                found.append(FoundTable(table_id(name), name, str(db), str(table), True,
                                        None if keyed else "it has no primary key",
                                        f"ALTER TABLE `{db}`.`{table}` ADD PRIMARY KEY (...)"))
        return sorted(found, key=lambda f: f.name)

    def check_followable(self, table: FoundTable) -> None:
        if not table.readable:
            raise self.error(f"{self.component}: table {table.name} matches 'tables' but this user may not read it")

    def follow(self, conn: Any, tables: list[FoundTable]) -> None:
        pass  # the binary log carries every table

    def unfollow(self, conn: Any, oid: int) -> None:
        pass

    def _names(self, conn: Any, oids: list[int]) -> dict[int, tuple[str, str]]:
        """(database, table) of the tables ``oids`` that exist (ids are name hashes: the names are looked up)."""
        wanted = set(oids)
        marks = ", ".join(["%s"] * len(SYSTEM_DATABASES))
        with conn.cursor() as cur:
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
                        f"AND TABLE_SCHEMA NOT IN ({marks})", SYSTEM_DATABASES)
            named = {table_id(f"{d}.{t}"): (str(d), str(t)) for d, t in cur.fetchall()}
        return {o: n for o, n in named.items() if o in wanted}

    def primary_keys(self, conn: Any, oids: list[int]) -> dict[int, tuple[str, ...]]:
        out: dict[int, tuple[str, ...]] = {}
        with conn.cursor() as cur:
            for oid, (db, table) in self._names(conn, oids).items():
                cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND "
                            "TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (db, table))
                key = tuple(str(r[0]) for r in cur.fetchall())
                if key:
                    out[oid] = key
        return out

    def signatures(self, conn: Any, oids: list[int]) -> dict[int, Any]:
        return {}  # every DDL is in the binary log

    def signature_change(self, conn: Any, old: Any, new: Any) -> str | None:
        return None

    def table_name(self, conn: Any, oid: int) -> str | None:
        found = self._names(conn, [oid]).get(oid)
        return None if found is None else f"{found[0]}.{found[1]}"

    # positions -------------------------------------------------------------------------------------------

    def current_position(self, conn: Any) -> int:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        if row is None:
            raise self.error(f"{self.component}: the server writes no binary log: start it with log-bin")
        position = FilePosition(str(row[0]), int(row[1]))
        self._base = position.key[0]
        return encode_position(position)

    def join_mark(self, conn: Any) -> JoinMark:
        return JoinMark(None, self.current_position(conn))

    def transaction_horizon(self, conn: Any) -> int:
        return 0  # no join waits for transactions (after_xid is None)

    def unread_before(self, conn: Any, positions: list[int]) -> int:
        return max((p for p in positions if p <= self._released), default=-1)

    def release(self, position: int) -> None:
        """An epoch up to ``position`` is committed (nothing to free on the server: the position is ours)."""
        self._released = max(self._released, position)

    def format_position(self, position: int) -> str:
        if self._base is None:
            raise self.error(f"{self.component}: no binary log base name known yet (read the position first)")
        return str(decode_position(self._base, position))

    def parse_position(self, text: str) -> int:
        position = FilePosition.parse(text)
        self._base = position.key[0]
        return encode_position(position)

    # snapshot ---------------------------------------------------------------------------------------------

    def plan_chunks(self, conn: Any, entry: TableEntry, split_size: int) -> TableChunks:
        info = table_info(conn, entry.schema, entry.table)
        chunks = plan_chunks(conn, info, split_size)
        rows = None
        if len(chunks) == 1:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {info.qualified} LIMIT %s) s", (split_size,))
                rows = int(cur.fetchone()[0])
        bounds = [(None if c.lo is None else [bound_to_json(v) for v in c.lo],
                   None if c.hi is None else [bound_to_json(v) for v in c.hi]) for c in chunks]
        return TableChunks(bounds, {"database": entry.schema, "name": entry.table, "key": list(info.key)}, rows)

    def chunk_connection(self) -> Any:
        return connect(self.info)

    def read_chunk_arrow(self, chunk: dict[str, Any], conn: Any) -> Iterator[pa.RecordBatch]:
        """A chunk (its split's payload) in a consistent snapshot of its own, as Arrow typed by :mod:`.types`;
        nothing when the table is gone."""
        db, table = str(chunk["database"]), str(chunk["name"])
        begin_snapshot(conn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                            (db, table))
                exists = cur.fetchone() is not None
            if exists:
                info = table_info(conn, db, table)
                lo, hi = chunk.get("lo"), chunk.get("hi")
                yield from read_chunk(conn, info, Chunk(None if lo is None else tuple(bound_of_json(v) for v in lo),
                                                        None if hi is None else tuple(bound_of_json(v) for v in hi)))
        finally:
            conn.rollback()


if TYPE_CHECKING:
    def _conforms(dialect: MysqlDialect) -> CatalogDialect:
        return dialect  # mypy holds the catalog half to the core's protocol
