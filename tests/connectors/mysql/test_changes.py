"""The change reader against the session's MariaDB: a range of the log as whole transactions (the same on a replay,
from a file position or a GTID), rows decoded with the table map they were logged with, the end fixed before the
read, a purged start as one error, the blocking wait, and MariaDB's UUID/INET types as the text the server shows."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from flinkish_spark.connectors.mysql import changes as C
from flinkish_spark.connectors.mysql import connection as mysql_connection
from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.position import FilePosition, MariaGtidPosition
from flinkish_spark.connectors.mysql.row_values import RowDecoder
from flinkish_spark.connectors.mysql.server import collation_charsets
from flinkish_spark.errors import ChangeDataError, DatabaseUnavailableError


def _end(info: Any) -> C.LogEnd:
    with connect(info) as conn:
        return C.current_end(conn, mariadb=True)


def _gtid(end: C.LogEnd) -> MariaGtidPosition:
    assert end.gtid is not None  # MariaDB: always
    return end.gtid


def _decoder(info: Any) -> RowDecoder:
    def column_types(database: str, table: str) -> dict[str, str]:
        with connect(info) as conn, conn.cursor() as cur:
            cur.execute("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
                        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (database, table))
            return {str(n): str(t) for n, t in cur.fetchall()}

    with connect(info) as conn:
        return RowDecoder(collation_charsets(conn), mariadb=True, column_types=column_types)


def _ours(txns: list[C.Transaction], db: str) -> list[tuple[Any, ...]]:
    """What a user of the range sees of this test's database: per transaction its rows and statements."""
    out = []
    for t in txns:
        rows = [(c.table.table, c.op, c.seq, c.table.names, c.before, c.after) for c in t.changes
                if c.table.database == db]
        stmts = [(s.seq, [(x.kind, x.table, x.column) for x in s.changes]) for s in t.statements
                 if any(x.database == db for x in s.changes)]
        if rows or stmts:
            out.append((rows, stmts))
    return out


def test_a_range_is_whole_transactions_decoded_with_their_table_map_and_a_replay_reads_the_same(
        mariadb, mysql_db: str) -> None:
    info = parse_url(mariadb.url_for(mysql_db))
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v varchar(10))", database=mysql_db)
    start = _end(info)
    mariadb.sql("BEGIN; INSERT INTO t VALUES (1, 'a'), (2, 'b'); UPDATE t SET v = 'c' WHERE id = 1; COMMIT; "
                "DELETE FROM t WHERE id = 2; ALTER TABLE t ADD COLUMN w int; INSERT INTO t VALUES (3, 'd', 7)",
                database=mysql_db)
    end = _end(info)
    mariadb.sql("INSERT INTO t VALUES (4, 'later', 0)", database=mysql_db)  # logged after the range's end

    decoder = _decoder(info)
    first = list(C.read_range(info, start.file, end.file, decoder, server_id=9101))
    replay = list(C.read_range(info, start.file, end.file, _decoder(info), server_id=9101))
    from_gtid = list(C.read_range(info, _gtid(start), end.file, decoder, server_id=9102))
    assert first == replay == from_gtid

    names, names_after = ("id", "v"), ("id", "v", "w")
    assert _ours(first, mysql_db) == [
        ([("t", "i", 0, names, None, [1, "a"]), ("t", "i", 1, names, None, [2, "b"]),
          ("t", "u", 2, names, [1, "a"], [1, "c"])], []),
        ([("t", "d", 0, names, [2, "b"], None)], []),
        ([], [(0, [("add_column", "t", "w")])]),
        ([("t", "i", 0, names_after, None, [3, "d", 7])], []),  # the table map after the DDL
    ]
    # Positions: each transaction starts where the one before ended; the last ends at the range's end, with the
    # GTID state the server reports there; the rows of one event share its position, within the transaction.
    assert first[0].begin == start.file and first[-1].end == end.file
    assert all(a.end == b.begin for a, b in zip(first, first[1:]))
    assert first[-1].gtid_after == end.gtid and _gtid(start) < _gtid(end)
    txn = first[0]
    assert txn.begin < txn.changes[0].position < txn.changes[2].position < txn.end
    assert txn.changes[0].position == txn.changes[1].position
    assert abs(txn.commit_ts_us / 1e6 - time.time()) < 120
    assert C.position_key(txn.begin) < C.position_key(txn.end)
    # A range that ends at its start is empty; a range from the end reads the write after it.
    assert list(C.read_range(info, end.file, end.file, decoder, server_id=9101)) == []
    later = _end(info)
    tail = list(C.read_range(info, _gtid(end), later.file, decoder, server_id=9101))
    assert [c.after for t in tail for c in t.changes] == [[4, "later", 0]]


def test_a_purged_start_is_one_error_naming_the_expiry_setting_and_the_fix(mariadb, mysql_db: str) -> None:
    info = parse_url(mariadb.url_for(mysql_db))
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY)", database=mysql_db)
    old = _end(info)
    mariadb.sql("INSERT INTO t VALUES (1)", database=mysql_db)
    mariadb.sql("FLUSH BINARY LOGS")
    current = _end(info)
    deadline = time.monotonic() + 30
    # MariaDB keeps a log until its storage engine has flushed what the log covers (a binlog checkpoint event
    # follows): purge until the old file is gone.
    while old.file.file in mariadb.sql(f"PURGE BINARY LOGS TO '{current.file.file}'; SHOW BINARY LOGS"):
        assert time.monotonic() < deadline, "the server kept the old log for 30 s"
        time.sleep(0.2)
    current = _end(info)
    assert old.gtid is not None
    for start in (old.file, old.gtid):
        with pytest.raises(C.BinlogPurgedError) as e:
            list(C.read_range(info, start, current.file, _decoder(info), server_id=9103))
        message = str(e.value)
        assert f"position {start} needs" in message and f"oldest log is {current.file.file}" in message
        assert "binlog_expire_logs_seconds = 0" in message and "expire_logs_days" in message
        assert "onSlotLost=resnapshot" in message and "SET GLOBAL binlog_expire_logs_seconds" in message
    # A start the server never had is not called purged.
    with pytest.raises(ChangeDataError, match="binlog.999999:4 is not the start of an event group of this server"):
        list(C.read_range(info, FilePosition("binlog.999999", 4), FilePosition("binlog.999999", 500),
                          _decoder(info), server_id=9103))


def test_a_big_transaction_comes_in_pieces_of_the_rows_asked_for(mariadb, mysql_db: str) -> None:
    info = parse_url(mariadb.url_for(mysql_db))
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v int)", database=mysql_db)
    start = _end(info)
    inserts = "; ".join(f"INSERT INTO t VALUES ({i}, 0)" for i in range(7))
    mariadb.sql(f"BEGIN; {inserts}; UPDATE t SET v = 1; COMMIT; INSERT INTO t VALUES (99, 0)", database=mysql_db)
    end = _end(info)
    whole = list(C.read_range(info, start.file, end.file, _decoder(info), server_id=9107))
    pieces = list(C.read_range(info, start.file, end.file, _decoder(info), server_id=9107, piece_rows=3))
    # 7 single-row events, then one event of 7 updated rows: cut before the event after the one that reaches 3 rows.
    assert [(len(p.changes), p.last) for p in pieces] == [(3, False), (3, False), (1 + 7, True), (1, True)]
    big = whole[0]
    assert tuple(c for p in pieces[:3] for c in p.changes) == big.changes
    assert {(p.begin, p.gtid, p.commit_ts_us) for p in pieces[:3]} == {(big.begin, big.gtid, big.commit_ts_us)}
    assert pieces[2] == big.__class__(**{**big.__dict__, "changes": big.changes[6:]})  # the last piece ends it
    assert [p.gtid_after for p in pieces[:2]] == [None, None] and pieces[0].end < pieces[1].end < big.end
    assert pieces[3] == whole[1]


def test_what_the_reader_cannot_follow_stops_it_with_the_reason(mariadb, mysql_db: str) -> None:
    """A two-phase XA transaction's rows wait for a later XA COMMIT or ROLLBACK: refused, not read as committed.
    CREATE TABLE ... SELECT (a statement and rows in one transaction) and XA ... ONE PHASE are read."""
    info = parse_url(mariadb.url_for(mysql_db))
    start = _end(info)
    mariadb.sql("CREATE TABLE s (id int PRIMARY KEY) SELECT 1 AS id; XA START 'one'; INSERT INTO s VALUES (2); "
                "XA END 'one'; XA COMMIT 'one' ONE PHASE", database=mysql_db)
    middle = _end(info)
    txns = list(C.read_range(info, start.file, middle.file, _decoder(info), server_id=9106))
    assert [([c.after for c in t.changes], [x.kind for s in t.statements for x in s.changes]) for t in txns] == [
        ([[1]], ["create_table"]), ([[2]], [])]
    assert txns[0].statements[0].seq == 0 and txns[0].changes[0].seq == 1  # the statement, then its rows
    mariadb.sql("XA START 'two'; INSERT INTO s VALUES (3); XA END 'two'; XA PREPARE 'two'; XA ROLLBACK 'two'",
                database=mysql_db)
    with pytest.raises(ChangeDataError, match="a prepared XA transaction at binlog"):
        list(C.read_range(info, middle.file, _end(info).file, _decoder(info), server_id=9106))


def test_wait_for_change_returns_at_a_commit_or_at_its_deadline(mariadb, mysql_db: str) -> None:
    info = parse_url(mariadb.url_for(mysql_db))
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY)", database=mysql_db)
    end = _end(info)
    t0 = time.monotonic()
    assert C.wait_for_change(info, end.file, time.time() + 0.5, server_id=9104) is False
    waited = time.monotonic() - t0
    assert 0.4 < waited < 5

    writer = threading.Timer(0.5, lambda: mariadb.sql("INSERT INTO t VALUES (1)", database=mysql_db))
    writer.start()
    t0 = time.monotonic()
    try:
        assert C.wait_for_change(info, _gtid(end), time.time() + 30, server_id=9104) is True
    finally:
        writer.join()
    assert time.monotonic() - t0 < 10  # woken by the commit, not by the deadline
    assert _end(info).file > end.file


def test_uuid_inet4_and_inet6_are_the_text_the_server_shows(mariadb, mysql_db: str) -> None:
    info = parse_url(mariadb.url_for(mysql_db))
    values = [("6ccd780c-baba-1026-9564-5b8c656024db", "1.2.3.4", "2001:db8::1"),
              ("01890a5d-ac96-774b-bcce-b302099a8057", "0.0.0.0", "::ffff:1.2.3.4"),
              ("00000000-0000-0000-0000-000000000000", "255.255.255.255", "::1.2.3.4"),
              ("0123e456-789a-4bcd-8f01-23456789abcd", "10.0.0.1", "::2:3:4:5:6:7:8"),
              ("0123e456-789a-4bcd-8f01-23456789abce", "10.0.0.2", "1:0:0:2:0:0:0:3"),
              ("0123e456-789a-4bcd-8f01-23456789abcf", "10.0.0.3", "1:0:2:0:3:4:5:6"),
              ("0123e456-789a-4bcd-8f01-23456789abc0", "10.0.0.4", "::")]
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, u uuid, a inet4, b inet6, bn binary(16))", database=mysql_db)
    start = _end(info)
    rows = ", ".join(f"({i}, '{u}', '{a}', '{b}', x'00ff')" for i, (u, a, b) in enumerate(values))
    mariadb.sql(f"INSERT INTO t VALUES {rows}, (99, NULL, NULL, NULL, NULL)", database=mysql_db)
    shown = [tuple(line.split("\t")) for line in
             mariadb.sql("SELECT u, a, b FROM t WHERE id < 99 ORDER BY id", database=mysql_db).splitlines()]
    txns = list(C.read_range(info, start.file, _end(info).file, _decoder(info), server_id=9105))
    read: list[Any] = [c.after for t in txns for c in t.changes]
    assert [tuple(r[1:4]) for r in read[:-1]] == shown
    assert read[-1] == [99, None, None, None, None]
    assert read[0][4] == b"\x00\xff" + bytes(14)  # a BINARY(16) stays bytes


def _kill_dumps(mariadb: Any) -> int:
    """Ends every binary log dump of the server from its side (as a restart does to a reader); how many."""
    ids = [line for line in mariadb.sql("SELECT ID FROM information_schema.PROCESSLIST "
                                        "WHERE COMMAND LIKE 'Binlog Dump%'").split() if line]
    for i in ids:
        mariadb.sql(f"KILL {i}")
    return len(ids)


def test_a_range_read_the_server_ends_midway_is_the_retryable_unavailable_error(mariadb, mysql_db: str) -> None:
    """A task reading its range when the server restarts: the same retryable DatabaseUnavailableError as a failed
    connect (the mirror's "transient failure", Spark's task retry), never a terminal ChangeDataError."""
    info = parse_url(mariadb.url_for(mysql_db))
    mariadb.sql("CREATE TABLE big (id int PRIMARY KEY, v text)", database=mysql_db)
    start = _end(info)
    # ~8 MB of log: far more than the socket buffers hold, so the kill lands while the range is still being sent.
    mariadb.sql(";".join(f"INSERT INTO big SELECT seq, repeat('x', 2000) FROM seq_{i * 400 + 1}_to_{i * 400 + 400}"
                         for i in range(10)), database=mysql_db)
    end = _end(info)
    txns = C.read_range(info, start.file, end.file, _decoder(info), server_id=9111)
    assert next(txns).changes  # the read is under way
    assert _kill_dumps(mariadb) == 1
    with pytest.raises(DatabaseUnavailableError, match=r"mysql://root@127\.0\.0\.1:\d+"):
        for _ in txns:
            pass


def test_a_session_the_server_ended_before_the_range_read_began_is_the_retryable_unavailable_error(
        mariadb, mysql_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The range's first queries (is the start still in the log, its GTID state) on a session the server ended in
    between (a restart just after the connect): the retryable error, not PyMySQL's raw OperationalError."""
    info = parse_url(mariadb.url_for(mysql_db))
    start, end = _end(info), _end(info)

    def ended_session(info: Any, *args: Any, **kwargs: Any) -> Any:
        conn = connect(info, *args, **kwargs)
        mariadb.sql(f"KILL {conn.thread_id()}")
        return conn

    monkeypatch.setattr(mysql_connection, "connect", ended_session)
    with pytest.raises(DatabaseUnavailableError):
        list(C.read_range(info, start.file, end.file, _decoder(info), server_id=9112))
