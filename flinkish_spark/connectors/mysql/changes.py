"""The binary log over a position range, as transactions of row changes and statements: the change reader.

What it guarantees:

* :func:`read_range` reads ``[start, end)`` with ``end`` fixed before the read (:func:`current_end`): the
  transactions that begin at or after ``start`` and end at or before ``end``, each whole, in log order.
  The same range read again (a replay after a crash) gives the same transactions with the same values,
  positions and sequence numbers, whatever the server logged since -- as long as it still has the logs,
  which is checked before anything is read: a purged start is one :class:`BinlogPurgedError` naming the
  expiry setting and the fix, never a silent jump past the lost changes.
* A transaction carries where it begins and ends (file positions on this server; the end is where a
  next range starts), its MariaDB GTID and the GTID state after it, its commit time, its row changes
  (``i``/``u``/``d`` with the row before and after as Python values, decoded with the table map logged
  with them -- the columns the row was written with, whatever DDL came after) and its statements (the
  log's ``QUERY`` events other than BEGIN/COMMIT, with their schema changes parsed by :mod:`.ddl`).
  Rows and statements share one ``seq`` counter per transaction: their order within it.
* :func:`wait_for_change` blocks (a replica's blocking dump) until a transaction ends after a position,
  or a deadline passes: the source's "latest offset" without polling the server in a loop.

Starts: a file position (``binlog.000012:4567``, one server only) or a MariaDB GTID position (the
transactions after it, on this server or on a replica that took over: ``@slave_connect_state``). A
transaction is held whole in memory unless ``piece_rows`` asks for pieces of a big one (MariaDB).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator, NamedTuple

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql import ddl
from flinkish_spark.connectors.mysql.connection import ConnectionInfo, error_code, lost_session, session
from flinkish_spark.connectors.mysql.position import FilePosition, Gtid, MariaGtidPosition, MysqlGtidSet, purged
from flinkish_spark.connectors.mysql.row_values import RowDecoder
from flinkish_spark.connectors.mysql.server import binary_logs, oldest_gtid_list
from flinkish_spark.errors import ChangeDataError, TerminalError

Start = FilePosition | MariaGtidPosition
MYSQL_GTID_EVENT, MYSQL_ANONYMOUS_GTID_EVENT, MYSQL_PARTIAL_UPDATE_ROWS = 33, 34, 39
INCIDENT_EVENT = 26
XA_PREPARE_EVENT = 38  # MariaDB's and MySQL's
MARIADB_FL_STANDALONE = 0x01
LOG_EVENT_ARTIFICIAL_F = 0x20
_OPS = {B.WRITE_ROWS_V1: "i", B.UPDATE_ROWS_V1: "u", B.DELETE_ROWS_V1: "d",
        B.WRITE_ROWS_V2: "i", B.UPDATE_ROWS_V2: "u", B.DELETE_ROWS_V2: "d"}
_HEADER = struct.Struct("<IBIIIH").unpack_from
_ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236


class BinlogPurgedError(TerminalError):
    """The server no longer has a binary log that the position to read from needs."""


@dataclass(frozen=True)
class LogEnd:
    """The end of the server's log at one moment: its file position and, on MariaDB, the GTID state there
    (``BINLOG_GTID_POS`` of that file position: the two name the same point)."""

    file: FilePosition
    gtid: MariaGtidPosition | MysqlGtidSet | None  # MySQL: the executed GTID set, where the server has GTIDs on

    def __str__(self) -> str:
        return f"{self.file}" + (f" ({self.gtid})" if self.gtid is not None else "")


class RowChange(NamedTuple):
    """One row of a row event (a tuple: a log holds millions of them)."""

    table: B.TableMap  # the table map logged with it: database, table, column names
    op: str  # 'i' insert, 'u' update, 'd' delete (the stream rows' _op)
    file: str  # the row event's start (:attr:`position`): its file and offset, kept apart -- a FilePosition per
    offset: int  # row event was ~5 % of a packed change read's CPU, counting the garbage collector's
    seq: int  # within the transaction
    before: list[Any] | None  # update, delete: a value per column of the table map
    after: list[Any] | None  # insert, update

    @property
    def position(self) -> FilePosition:
        """The row event's start."""
        return _pos(self.file, self.offset)


@dataclass(frozen=True)
class Statement:
    """A ``QUERY`` event of a transaction other than BEGIN/COMMIT/ROLLBACK: DDL in a row-based log."""

    database: str  # the session's default database ('' for none): unqualified names are in it
    sql: str
    position: FilePosition
    seq: int
    changes: tuple[ddl.SchemaChange, ...]  # ddl.parse(sql, database); () for no table (GRANT, CREATE USER...)


@dataclass(frozen=True)
class Transaction:
    """A whole transaction, or one piece of a big one (``last`` False: see :func:`read_range`'s ``piece_rows``)."""

    begin: FilePosition  # its first event (the GTID event)
    end: FilePosition  # after its last event: where the next transaction, and a next range, starts
    gtid: Gtid | None  # MariaDB
    gtid_after: MariaGtidPosition | None  # MariaDB: the GTID state once it is read (a GTID start for a next range)
    commit_ts_us: int  # the commit event's time (the log has whole seconds)
    changes: tuple[RowChange, ...]
    statements: tuple[Statement, ...]
    # False: a piece of a transaction that goes on (its end is after its last row event, inside the
    # transaction: not a place to start a range from; gtid_after None); the transaction's last piece is True.
    last: bool = True


def position_key(pos: FilePosition) -> int:
    """A file position as one int64 (``file number << 32 | offset``): ordered as the positions of one server's log
    (an event offset is 32 bits in the log's headers), for a column like PostgreSQL's ``_lsn``."""
    return pos.key[1] << 32 | pos.offset


def position_of_key(key: int, log_files: list[str]) -> FilePosition:
    """:func:`position_key` turned back into a file position of this server's log (its files' base name and width
    from ``log_files``, ``SHOW BINARY LOGS``)."""
    if not log_files:
        raise ChangeDataError("the server lists no binary log files (SHOW BINARY LOGS is empty)")
    base, _, digits = log_files[-1].rpartition(".")
    return FilePosition(f"{base}.{key >> 32:0{len(digits)}d}", key & 0xFFFFFFFF)


def current_end(conn: Any, mariadb: bool) -> LogEnd:
    """The end of the log now (``SHOW MASTER STATUS``; MySQL 8.4's ``SHOW BINARY LOG STATUS``), with MariaDB's GTID
    state at that very point (``BINLOG_GTID_POS``), so that the two cannot disagree by a transaction in between;
    on MySQL the executed GTID set of the same status row (None where GTIDs are off)."""
    with conn.cursor() as cur:
        try:
            cur.execute("SHOW MASTER STATUS")
        except Exception as e:  # MySQL 8.4 dropped the old name
            if "syntax" not in str(e).lower():
                raise
            cur.execute("SHOW BINARY LOG STATUS")
        row = cur.fetchone()
        if row is None:
            raise ChangeDataError("the server has no binary log (SHOW MASTER STATUS is empty): log_bin is OFF")
        end = FilePosition(str(row[0]), int(row[1]))
        gtid: MariaGtidPosition | MysqlGtidSet | None = None
        if not mariadb and len(row) > 4 and row[4]:
            # MySQL: the executed set, read in the same statement as the file position (MariaDB has no such column)
            gtid = MysqlGtidSet.parse(str(row[4]))
        if mariadb:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (end.file, end.offset))
            gtid = MariaGtidPosition.parse(str(cur.fetchone()[0] or ""))
    return LogEnd(end, gtid)


def gtid_at(conn: Any, pos: FilePosition) -> MariaGtidPosition:
    """MariaDB: the GTID state at a transaction boundary of this server's log (a range's start, a consistent
    snapshot's ``binlog_snapshot_position``): the server's own ``BINLOG_GTID_POS``, one query on any connection."""
    with conn.cursor() as cur:
        cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (pos.file, pos.offset))
        value = cur.fetchone()[0]
    if value is None:
        raise ChangeDataError(f"binary log position {pos} is not the start of an event group of this server's log")
    return MariaGtidPosition.parse(str(value))


def _expiry(conn: Any) -> str:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('expire_logs_days', 'binlog_expire_logs_seconds')")
        return ", ".join(f"{name} = {value}" for name, value in sorted(cur.fetchall()))


def purged_error(info: ConnectionInfo, start: Start, oldest: str | None, expiry: str) -> BinlogPurgedError:
    expiry = expiry or "expire_logs_days / binlog_expire_logs_seconds"
    return BinlogPurgedError(
        f"the MySQL server at {info.masked} no longer has the binary log that position {start} needs (its oldest log "
        f"is {oldest or 'unknown'}): it was purged (PURGE BINARY LOGS, or expiry: {expiry}). The changes in between "
        "are lost to this source: start over with a new snapshot (onSlotLost=resnapshot, or a new uid), and keep logs longer than the source may be stopped: "
        "SET GLOBAL binlog_expire_logs_seconds = <seconds> (MariaDB 10.6+, MySQL 8; expire_logs_days on older MariaDB) "
        "and the same line in the server's option file"
    )


def check_start(conn: Any, info: ConnectionInfo, start: Start) -> None:
    """Raise :class:`BinlogPurgedError` when reading from ``start`` needs a log the server purged."""
    files = binary_logs(conn)
    gtid_list = oldest_gtid_list(conn, files[0]) if files and isinstance(start, MariaGtidPosition) else None
    if purged(start, files, gtid_list):
        raise purged_error(info, start, files[0] if files else None, _expiry(conn))


class _Open:
    """The transaction being read."""

    __slots__ = ("begin", "gtid", "explicit", "changes", "statements", "seq", "ts")

    def __init__(self, begin: FilePosition, gtid: Gtid | None, explicit: bool, ts: int | None = None) -> None:
        self.begin, self.gtid, self.explicit = begin, gtid, explicit
        self.ts = ts  # the commit time when known at the start (MariaDB's GTID event carries it)
        self.changes: list[RowChange] = []
        self.statements: list[Statement] = []
        self.seq = 0


def query_text(event: bytes) -> tuple[str, str]:
    """(default database, SQL text) of a ``QUERY`` event."""
    p = B.HEADER_SIZE
    db_len, status_len = event[p + 8], struct.unpack_from("<H", event, p + 11)[0]
    p += 13 + status_len
    database = event[p:p + db_len].decode("utf-8", "replace")
    return database, event[p + db_len + 1:].decode("utf-8", "replace")


def _rotate_file(event: bytes) -> str:
    return event[B.HEADER_SIZE + 8:].decode()


def read_range(info: ConnectionInfo, start: Start, end: FilePosition, decoder: RowDecoder, server_id: int,
               mariadb: bool = True, piece_rows: int | None = None) -> Iterator[Transaction]:
    """The transactions of ``[start, end)``, from a connection of their own (closed when the iteration ends or the
    generator is closed). ``end``: a transaction boundary of this server's log at or before its end now
    (:func:`current_end`, or a :attr:`Transaction.end`). ``decoder``: the table maps and readers (kept across
    ranges: a table map is compiled once). ``server_id``: the replica id this reader uses.

    ``piece_rows``: a transaction of more rows comes in pieces of about that many (cut after the row event that
    reaches it, before the next one), so that one ``UPDATE`` of millions of rows is never held whole: the pieces
    have the same ``begin``, ``gtid`` and ``commit_ts_us``, their rows and statements in order with one ``seq``
    sequence, and ``last`` True on the final one only. MariaDB only: its GTID event, first in the transaction, carries the
    commit's time (it is written at commit); elsewhere transactions stay whole."""
    # session(): a session the server ends (a restart) anywhere in the read is the retryable
    # DatabaseUnavailableError -- the task is retried, the mirror's failure is transient -- as a failed connect is.
    with session(info) as conn:
        check_start(conn, info, start)
        state: MariaGtidPosition | None = start if isinstance(start, MariaGtidPosition) else (
            gtid_at(conn, start) if mariadb else None)
        yield from _transactions(conn, info, start, end, decoder, server_id, state, piece_rows)


def _server_error(info: ConnectionInfo, conn: Any, start: Start, exc: BaseException) -> Exception:
    lost = lost_session(info, exc)
    if lost is not None:  # the dump's session ended by the server (a restart, a kill): not a refusal, retryable
        return lost
    code = error_code(exc)
    text = info.mask(str(exc.args[1] if len(exc.args) > 1 else exc))
    if code == _ER_MASTER_FATAL_ERROR_READING_BINLOG and "purged" in text:
        return purged_error(info, start, None, "")
    return ChangeDataError(f"the MySQL server at {info.masked} refused to send its binary log from {start}: {text}")


def _transactions(conn: Any, info: ConnectionInfo, start: Start, end: FilePosition, decoder: RowDecoder,
                  server_id: int, state: MariaGtidPosition | None, piece_rows: int | None) -> Iterator[Transaction]:
    pymysql = __import__("pymysql")
    file = start.file if isinstance(start, FilePosition) else ""
    end_key = end.key
    if isinstance(start, FilePosition) and start.key >= end_key:
        return
    # Where the current file stands to the end's file: -1 before it (read on), 0 the end's file (compare
    # offsets with end_offset), 1 after it. Kept per file, not compared per event (the hot path).
    end_offset = end.offset
    where = _where(start.key[:2], end_key) if isinstance(start, FilePosition) else -1
    txn: _Open | None = None
    events = B.dump_events(conn, start, server_id)
    while True:
        try:
            event = next(events)
        except StopIteration:
            raise ChangeDataError(f"the binary log of the MySQL server at {info.masked} ends before {end}, the end of "
                                  f"the range to read from {start}: was the server's log reset?") from None
        except pymysql.MySQLError as e:
            raise _server_error(info, conn, start, e) from None
        _ts, kind, event_server, size, log_pos, flags = _HEADER(event, 0)
        if kind == B.ROTATE_EVENT:
            file = _rotate_file(event)
            where = _where(FilePosition(file, 4).key[:2], end_key)
            continue
        if log_pos == 0 or flags & LOG_EVENT_ARTIFICIAL_F:
            continue  # made up for this reader: a start's format description and GTID list
        if where > 0 or (where == 0 and log_pos - size >= end_offset):
            if txn is not None:
                raise ChangeDataError(f"{end} is not a transaction boundary of the binary log (a transaction began at "
                                      f"{txn.begin}): a range ends where a transaction ends")
            return
        if kind == B.TABLE_MAP_EVENT:
            decoder.table_map(event)
        elif kind in _OPS:
            if txn is None:
                raise ChangeDataError(f"a row event at {_pos(file, log_pos - size)} outside a transaction")
            op = _OPS[kind]
            offset = log_pos - size
            if piece_rows and len(txn.changes) >= piece_rows and txn.ts is not None:
                # Cut before this event (not after the one that reached the count): the last piece then holds
                # rows, and a transaction of exactly piece_rows rows is one piece.
                yield Transaction(txn.begin, _pos(file, offset), txn.gtid, None, txn.ts * 1_000_000,
                                  tuple(txn.changes), tuple(txn.statements), last=False)
                txn.changes, txn.statements = [], []
            table, rows = decoder.rows(event)
            changes, seq = txn.changes, txn.seq
            for _op, before, after in rows:
                changes.append(RowChange(table, op, file, offset, seq, before, after))
                seq += 1
            txn.seq = seq
        elif kind in (B.MARIADB_GTID_EVENT, MYSQL_GTID_EVENT, MYSQL_ANONYMOUS_GTID_EVENT) and txn is not None:
            # Never drop an open transaction's rows by starting the next one over it.
            raise ChangeDataError(f"the transaction that began at {txn.begin} has no end before the next one at "
                                  f"{_pos(file, log_pos - size)}: the change reader does not know how it ended")
        elif kind == B.MARIADB_GTID_EVENT:
            seq_no, domain, flags2 = struct.unpack_from("<QIB", event, B.HEADER_SIZE)
            txn = _Open(_pos(file, log_pos - size), Gtid(domain, event_server, seq_no),
                        explicit=not flags2 & MARIADB_FL_STANDALONE, ts=_ts)
        elif kind in (MYSQL_GTID_EVENT, MYSQL_ANONYMOUS_GTID_EVENT):
            txn = _Open(_pos(file, log_pos - size), None, explicit=False)  # BEGIN follows unless one DDL statement
        elif kind == B.QUERY_EVENT:
            at = _pos(file, log_pos - size)
            database, sql = query_text(event)
            word = sql.strip().upper()
            if word == "BEGIN":
                if txn is None:
                    txn = _Open(at, None, explicit=True)
                txn.explicit = True
                continue
            if txn is None:  # a DDL statement without a GTID event (MySQL with GTIDs off, old servers)
                txn = _Open(at, None, explicit=False)
            if word in ("COMMIT", "ROLLBACK"):  # ROLLBACK: non-transactional tables' rows stand (they were logged)
                state = yield from _close(txn, log_pos, _ts, file, state)
                txn = None
            else:
                txn.statements.append(Statement(database, sql, at, txn.seq, ddl.parse(sql, database)))
                txn.seq += 1
                if not txn.explicit:
                    state = yield from _close(txn, log_pos, _ts, file, state)
                    txn = None
        elif kind == B.XID_EVENT:
            if txn is not None:
                state = yield from _close(txn, log_pos, _ts, file, state)
                txn = None
        elif kind in (MYSQL_PARTIAL_UPDATE_ROWS, XA_PREPARE_EVENT, INCIDENT_EVENT):
            raise refusal(kind, _pos(file, log_pos - size))
        # Format description, GTID lists, checkpoints, annotations, heartbeats: nothing to read.
        if txn is None and (where > 0 or (where == 0 and log_pos >= end_offset)):
            return  # the next event is at the range's end, which the log may not hold yet (a dump's EOF is next)


def refusal(kind: int, at: FilePosition) -> ChangeDataError:
    """The error of an event the change reader refuses (a partial JSON update, a prepared XA transaction, an
    incident) at ``at``: the reader's and the planning's (:mod:`.range_scan`)."""
    if kind == MYSQL_PARTIAL_UPDATE_ROWS:
        return ChangeDataError(f"a partial JSON update at {at}: the source needs whole rows; set "
                               "binlog_row_value_options = '' on the server")
    if kind == XA_PREPARE_EVENT:
        return ChangeDataError(
            f"a prepared XA transaction at {at}: its rows are committed or rolled back by a later XA COMMIT/ROLLBACK, "
            "which the change reader does not follow yet (XA ... ONE PHASE transactions are read as any other)")
    return ChangeDataError(f"the binary log records an incident at {at} (changes the server could not log): the "
                           "source cannot know the rows in between; start over with a new snapshot")


def _where(file_key: tuple[str, int], end_key: tuple[str, int, int]) -> int:
    return (file_key > end_key[:2]) - (file_key < end_key[:2])


def _pos(file: str, offset: int) -> FilePosition:
    """A position of an event the server sent: valid by construction, so without FilePosition's checks (a regex
    per event: this is the reader's hot path)."""
    pos = object.__new__(FilePosition)
    object.__setattr__(pos, "file", file)
    object.__setattr__(pos, "offset", offset)
    return pos


def _close(txn: _Open, log_pos: int, ts: int, file: str, state: MariaGtidPosition | None
           ) -> Generator[Transaction, None, MariaGtidPosition | None]:
    if txn.gtid is not None and state is not None:
        state = state.after(txn.gtid)
    # MariaDB: the GTID event's time, which is the commit's (and what the pieces of a big one carried).
    yield Transaction(txn.begin, _pos(file, log_pos), txn.gtid, state, (ts if txn.ts is None else txn.ts) * 1_000_000,
                      tuple(txn.changes), tuple(txn.statements))
    return state


def wait_for_change(info: ConnectionInfo, after: Start, deadline: float, server_id: int,
                    clock: Callable[[], float] = time.time) -> bool:
    """Block until a transaction ends in the log after ``after`` (True) or ``deadline`` (``clock`` seconds) passes
    (False). A blocking dump from ``after`` on a connection of its own: the server wakes it when it logs."""
    with session(info) as conn:
        check_start(conn, info, after)
        events = B.dump_events(conn, after, server_id, blocking=True)
        pymysql = __import__("pymysql")
        while True:
            left = deadline - clock()
            if left <= 0:
                return False
            conn._read_timeout = left  # PyMySQL sets it on the socket before each packet
            try:
                event = next(events)
            except pymysql.err.OperationalError as e:
                if "timed out" in str(e).lower():
                    return False
                raise _server_error(info, conn, after, e) from None
            kind, log_pos = event[4], _HEADER(event, 0)[4]
            if log_pos and (kind == B.XID_EVENT or (kind == B.QUERY_EVENT
                                                    and query_text(event)[1].strip().upper() != "BEGIN")):
                return True


__all__ = ["BinlogPurgedError", "LogEnd", "RowChange", "Statement", "Transaction", "check_start", "current_end",
           "gtid_at", "position_key", "position_of_key", "read_range", "wait_for_change"]
