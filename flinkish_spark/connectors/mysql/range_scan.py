"""A planned change range's transactions walked by their event headers alone: the planning of a range without a limit.

:meth:`.dialect.MysqlDialect.change_target` must know of a range, before any task reads it: its transaction
boundaries (where it may be cut, :mod:`.range_cuts`), whether it holds a change of a followed table at all (else no
epoch), its statements (a ``TRUNCATE`` of a followed table fences the cuts; the statements of
:data:`.planning.ACTED_ON` are acted on) -- never a row's value, nor how many rows a row event holds.
:func:`scan_range` gives exactly that from the replication stream, without decoding a table map's columns or walking
a row image: per event its header, and a row event's table id looked up in the table names its table maps gave
(db and table name only). What it guarantees:

* **The reader's transactions**: a :class:`ScannedTxn` ends where :func:`.changes.read_range`'s
  :class:`~.changes.Transaction` ends (the same rules: an ``XID`` event, ``COMMIT``/``ROLLBACK``, a statement
  outside ``BEGIN``), so a cut at a :attr:`ScannedTxn.end` is one of the reader's transaction boundaries; a range
  read from a cut reads whole transactions, each with the table maps its row events need.
* **Every statement**: a ``QUERY`` event other than BEGIN/COMMIT/ROLLBACK is in :attr:`ScannedTxn.statements`
  with its default database, its text and position, as the reader's :class:`~.changes.Statement` (parsed by the
  caller with :mod:`.ddl`).
* **Work, not rows**: :attr:`ScannedTxn.events` counts the row events of followed tables, :attr:`ScannedTxn.size`
  their bytes (a row event holds up to ~8 kB of rows: one row of an OLTP ``INSERT``, hundreds of a bulk one) -- a
  row event's bytes are what its reader decodes, so pieces of equal bytes are pieces of about equal work.
* The log's refusals are the reader's: a purged start (:class:`.changes.BinlogPurgedError`), a partial JSON
  update, a prepared XA transaction, an incident -- at the planning already, as before.

Why not ``SHOW BINLOG EVENTS``: the server parses there too, but returns one result row per event, with its text
(the ``Annotate_rows`` statement, ``table_id: N (db.t)``); on a log of one-row statements -- three events a change --
PyMySQL reads those rows several times slower than the dump's packets are walked here (docs/benchmarks.md, "Planning
a change range without reading its rows").
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Iterator, NamedTuple

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql.changes import (
    INCIDENT_EVENT, LOG_EVENT_ARTIFICIAL_F, MARIADB_FL_STANDALONE, MYSQL_ANONYMOUS_GTID_EVENT, MYSQL_GTID_EVENT,
    MYSQL_PARTIAL_UPDATE_ROWS, XA_PREPARE_EVENT, Start, _pos, _server_error, _where, check_start, query_text, refusal,
)
from flinkish_spark.connectors.mysql.connection import ConnectionInfo, session
from flinkish_spark.connectors.mysql.position import FilePosition
from flinkish_spark.errors import ChangeDataError

_ROWS = frozenset({B.WRITE_ROWS_V1, B.UPDATE_ROWS_V1, B.DELETE_ROWS_V1, B.WRITE_ROWS_V2, B.UPDATE_ROWS_V2,
                   B.DELETE_ROWS_V2})
_GTIDS = frozenset({B.MARIADB_GTID_EVENT, MYSQL_GTID_EVENT, MYSQL_ANONYMOUS_GTID_EVENT})
_REFUSED = frozenset({MYSQL_PARTIAL_UPDATE_ROWS, XA_PREPARE_EVENT, INCIDENT_EVENT})
_HEADER = struct.Struct("<IBIIIH").unpack_from


class ScannedStatement(NamedTuple):
    database: str
    sql: str
    position: FilePosition


class ScannedTxn(NamedTuple):
    """One transaction of the range as the scan saw it (see the module docstring)."""

    end: FilePosition  # after its last event: a transaction boundary of the reader's
    events: int  # row events of followed tables in it
    size: int  # their bytes
    statements: tuple[ScannedStatement, ...]


def scan_range(info: ConnectionInfo, start: Start, end: FilePosition, server_id: int,
               follows: Callable[[str], bool]) -> Iterator[ScannedTxn]:
    """The transactions of ``[start, end)`` (``end``: a transaction boundary at or before the log's end, as for
    :func:`.changes.read_range`), from a dump of their own; ``follows``: whether ``database.table`` is followed."""
    with session(info) as conn:  # a session the server ends is the retryable error, as in read_range
        check_start(conn, info, start)
        yield from _scan(conn, info, start, end, server_id, follows)


def _scan(conn: Any, info: ConnectionInfo, start: Start, end: FilePosition, server_id: int,
          follows: Callable[[str], bool]) -> Iterator[ScannedTxn]:
    pymysql = __import__("pymysql")
    file = start.file if isinstance(start, FilePosition) else ""
    end_key, end_offset = end.key, end.offset
    if isinstance(start, FilePosition) and start.key >= end_key:
        return
    where = _where(start.key[:2], end_key) if isinstance(start, FilePosition) else -1
    followed: dict[bytes, bool] = {}  # a table map's name bytes -> followed (decoded once per table)
    by_id: dict[bytes, bool] = {}  # a row event's table id bytes -> followed (the latest table map's)
    is_open = explicit = False
    begin: FilePosition | None = None
    events = size = 0
    statements: list[ScannedStatement] = []
    last_size, last_map = -1, b""  # the latest table map event: its length, its bytes after the header
    dump = B.dump_events(conn, start, server_id)
    while True:
        try:
            event = next(dump)
        except StopIteration:
            raise ChangeDataError(f"the binary log of the MySQL server at {info.masked} ends before {end}, the end of "
                                  f"the range to read from {start}: was the server's log reset?") from None
        except pymysql.MySQLError as e:
            raise _server_error(info, conn, start, e) from None
        _ts, kind, _server, length, log_pos, flags = _HEADER(event, 0)
        if kind in _ROWS:  # the hot path: most events of a range
            if by_id.get(event[19:25]):
                events += 1
                size += length
            continue
        if kind == B.TABLE_MAP_EVENT:
            if len(event) == last_size and event.startswith(last_map, 19):
                continue  # the map just read again (logged before each row of a one-row-statement writer)
            last_size, last_map = len(event), event[19:]
            n = event[27]
            m = event[29 + n]
            name = event[28:28 + n] + b"." + event[30 + n:30 + n + m]
            hit = followed.get(name)
            if hit is None:
                hit = followed[name] = follows(name.decode("utf-8", "replace"))
            by_id[event[19:25]] = hit
            continue
        if kind == B.ROTATE_EVENT:
            file = event[B.HEADER_SIZE + 8:].decode()
            where = _where(FilePosition(file, 4).key[:2], end_key)
            continue
        if log_pos == 0 or flags & LOG_EVENT_ARTIFICIAL_F:
            continue
        if where > 0 or (where == 0 and log_pos - length >= end_offset):
            if is_open:
                raise ChangeDataError(f"{end} is not a transaction boundary of the binary log (a transaction began at "
                                      f"{begin}): a range ends where a transaction ends")
            return
        close = False
        if kind in _GTIDS:
            if is_open:
                raise ChangeDataError(f"the transaction that began at {begin} has no end before the next one at "
                                      f"{_pos(file, log_pos - length)}: the change reader does not know how it ended")
            is_open, begin = True, _pos(file, log_pos - length)
            explicit = kind == B.MARIADB_GTID_EVENT and not event[B.HEADER_SIZE + 12] & MARIADB_FL_STANDALONE
        elif kind == B.QUERY_EVENT:
            at = _pos(file, log_pos - length)
            database, sql = query_text(event)
            word = sql.strip().upper()
            if word == "BEGIN":
                if not is_open:
                    is_open, begin = True, at
                explicit = True
                continue
            if not is_open:
                is_open, begin, explicit = True, at, False
            if word in ("COMMIT", "ROLLBACK"):
                close = True
            else:
                statements.append(ScannedStatement(database, sql, at))
                close = not explicit
        elif kind == B.XID_EVENT:
            close = is_open
        elif kind in _REFUSED:
            raise refusal(kind, _pos(file, log_pos - length))
        if close:
            yield ScannedTxn(_pos(file, log_pos), events, size, tuple(statements))
            is_open, events, size, statements = False, 0, 0, []
        if not is_open and (where > 0 or (where == 0 and log_pos >= end_offset)):
            return
