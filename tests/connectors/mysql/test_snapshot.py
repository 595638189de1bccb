"""The lock-free snapshot (connectors/mysql/snapshot.py) against the session's MariaDB: chunks cover every row
exactly once whatever the key, a row of every type is read into Arrow as the type rule says, and rows read in the
snapshot plus the binary log's changes from the snapshot's position give exactly the table a writer left behind."""

from __future__ import annotations

import threading
import time
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.mysql import binlog
from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.row_values import RowDecoder
from flinkish_spark.connectors.mysql.server import collation_charsets
from flinkish_spark.connectors.mysql.snapshot import open_snapshot

KEYS = {  # name: (table definition, a row's values as SQL for i in 0..n-1)
    "int_dense": ("id int PRIMARY KEY, v int", lambda i: f"({i}, {i})"),
    "int_gaps": ("id int PRIMARY KEY, v int", lambda i: f"({i * i * 7 - 3000}, {i})"),
    "bigint_unsigned": ("id bigint unsigned PRIMARY KEY, v int", lambda i: f"({18446744073709551615 - i * 9999}, {i})"),
    "composite": ("a int, b varchar(10), v int, PRIMARY KEY (a, b)", lambda i: f"({i % 4}, 'k{i:03d}', {i})"),
    # Case-insensitive collation: 'Ab' and 'ab' are one key, ranges compare in the column's collation.
    "varchar": ("s varchar(20) PRIMARY KEY, v int", lambda i: f"('{'AbCdE'[i % 5]}{i * 37 % 101}é', {i})"),
    "empty": ("id int PRIMARY KEY, v int", None),
}


@pytest.mark.parametrize("kind", list(KEYS))
def test_chunks_cover_every_row_exactly_once(mariadb: Any, mysql_db: str, kind: str) -> None:
    definition, row = KEYS[kind]
    mariadb.sql(f"CREATE TABLE t ({definition})", database=mysql_db)
    if row is not None:
        mariadb.sql("INSERT INTO t VALUES " + ", ".join(row(i) for i in range(100)) + "; ANALYZE TABLE t",
                    database=mysql_db)
    with open_snapshot(parse_url(mariadb.url_for(mysql_db))) as snap:
        info = snap.table(mysql_db, "t")
        chunks = snap.chunks(info, 7)
        per_chunk = [pa.Table.from_batches(list(snap.read(info, c)), schema=info.arrow_schema).column("v").to_pylist()
                     for c in chunks]
    values = sorted(v for rows in per_chunk for v in rows)
    assert values == (list(range(100)) if row is not None else [])
    if row is not None:
        assert len(chunks) >= 100 // 7 and max(len(r) for r in per_chunk) <= 7 * 1.5 + 1
    else:
        assert len(chunks) == 1


TYPES = {  # column definition: (SQL literal, the value read into Arrow, as a Python value)
    "ti tinyint": ("-5", -5), "iu int unsigned": ("4294967295", 4294967295),
    "biu bigint unsigned": ("18446744073709551615", Decimal(18446744073709551615)),
    "d decimal(12,2)": ("-1234567890.12", Decimal("-1234567890.12")),
    "d65 decimal(65,30)": ("1.5", "1.500000000000000000000000000000"),
    "f float": ("1.5", 1.5), "db double": ("2.25", 2.25), "c char(3)": ("'ab'", "ab"),
    "vc varchar(20) CHARACTER SET latin1": ("'Zoë €'", "Zoë €"), "bn binary(4)": ("x'01020300'", b"\x01\x02\x03\x00"),
    "bl longblob": ("x'deadbeef'", b"\xde\xad\xbe\xef"), "e enum('small','it''s, big')": ("'it''s, big'", "it's, big"),
    "st set('a','b','c')": ("'a,c'", "a,c"), "b1 bit(1)": ("b'1'", True), "b9 bit(9)": ("b'100000001'", b"\x01\x01"),
    "j json": ("'{\"k\": [1, 2]}'", '{"k": [1, 2]}'), "dz date": ("'0000-00-00'", None),
    "dd date": ("'2024-02-29'", date(2024, 2, 29)),
    "dtm datetime(6)": ("'2024-02-29 23:59:59.123456'", datetime(2024, 2, 29, 23, 59, 59, 123456)),
    "dtz datetime": ("'2024-00-00 00:00:00'", None),
    "ts timestamp(3) NULL": ("'2024-03-01 12:00:00.5'", datetime(2024, 3, 1, 12, 0, 0, 500000, timezone.utc)),
    "tm time(2)": ("'-838:59:59.5'", "-838:59:59.50"), "y year": ("2024", 2024), "n int": ("NULL", None),
    # Values of 251+ and 65536+ bytes: the row packet's longer length prefixes.
    "mid varchar(400)": ("REPEAT('é', 300)", "é" * 300), "big mediumtext": ("REPEAT('xy', 40000)", "xy" * 40000),
}


def test_a_row_of_every_type_is_read_into_arrow_as_the_type_rule_says(mariadb: Any, mysql_db: str) -> None:
    names = [c.split()[0] for c in TYPES]
    mariadb.sql(f"CREATE TABLE a (id int PRIMARY KEY, {', '.join(TYPES)})", database=mysql_db)
    mariadb.sql(f"SET sql_mode = ''; SET time_zone = '+00:00'; INSERT INTO a (id, {', '.join(names)}) VALUES "
                f"(1, {', '.join(literal for literal, _ in TYPES.values())})", database=mysql_db)
    with open_snapshot(parse_url(mariadb.url_for(mysql_db))) as snap:
        info = snap.table(mysql_db, "a")
        (chunk,) = snap.chunks(info, 1000)
        table = pa.Table.from_batches(list(snap.read(info, chunk)), schema=info.arrow_schema)
    assert table.to_pylist() == [{"id": 1, **{n: v for n, (_, v) in zip(names, TYPES.values())}}]


def test_snapshot_rows_plus_the_log_from_its_position_give_the_final_table(mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v int, s varchar(20)); INSERT INTO t VALUES "
                + ", ".join(f"({i}, {i}, 'r{i}')" for i in range(2000)), database=mysql_db)
    info = parse_url(mariadb.url_for(mysql_db))
    stop, started = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    written = [0]  # the writer's iterations so far

    def writer() -> None:  # inserts, updates, deletes and multi-statement transactions until told to stop
        try:
            with connect(info) as conn, conn.cursor() as cur:
                n = 0
                while not stop.is_set() or n < 50:
                    n += 1
                    cur.execute("INSERT INTO t VALUES (%s, %s, 'new')", (10000 + n, n))
                    cur.execute("UPDATE t SET v = v + 1, s = 'upd' WHERE id = %s", (n * 13 % 2000,))
                    cur.execute("BEGIN")
                    cur.execute("DELETE FROM t WHERE id = %s", (n * 7 % 2000,))
                    cur.execute("UPDATE t SET id = id + 100000 WHERE id = %s", (10000 + n - 1,))
                    cur.execute("COMMIT")
                    written[0] = n
                    if n == 20:
                        started.set()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            started.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    started.wait(30)
    rows: dict[Any, dict[str, Any]] = {}
    with open_snapshot(info) as snap:
        position, at_start = snap.position, written[0]
        t = snap.table(mysql_db, "t")
        for chunk in snap.chunks(t, 300):
            time.sleep(0.05)  # the writer keeps writing while the chunks are read
            for batch in snap.read(t, chunk):
                for r in batch.to_pylist():
                    assert r["id"] not in rows
                    rows[r["id"]] = r
        assert written[0] > at_start + 5
    stop.set()
    thread.join(60)
    assert not errors
    with connect(info) as conn:
        charsets = collation_charsets(conn)
        events = list(binlog.dump_events(conn, position, server_id=9101))
    decoder, changes = RowDecoder(charsets, mariadb=True), 0
    for event in events:
        if event[4] == binlog.TABLE_MAP_EVENT:
            decoder.table_map(event)
        elif event[4] in (binlog.WRITE_ROWS_V1, binlog.UPDATE_ROWS_V1, binlog.DELETE_ROWS_V1):
            table, changed = decoder.rows(event)
            if (table.database, table.table) != (mysql_db, "t"):
                continue
            for op, before, after in changed:
                changes += 1
                if before is not None:
                    del rows[before[0]]  # a KeyError: a change the snapshot already held, or one it missed
                if after is not None:
                    assert after[0] not in rows
                    rows[after[0]] = dict(zip(("id", "v", "s"), after))
    assert changes > 0
    final = mariadb.sql("SELECT id, v, s FROM t", database=mysql_db).splitlines()
    expected = {int(i): {"id": int(i), "v": int(v), "s": s} for i, v, s in (line.split("\t") for line in final)}
    assert rows == expected


def test_the_snapshot_position_as_a_gtid_position(mariadb: Any, mysql_db: str) -> None:
    from flinkish_spark.connectors.mysql.position import MariaGtidPosition
    from flinkish_spark.connectors.mysql.changes import gtid_at

    mariadb.sql("CREATE TABLE g (id int PRIMARY KEY); INSERT INTO g VALUES (1); INSERT INTO g VALUES (2)",
                database=mysql_db)
    info = parse_url(mariadb.url_for(mysql_db))
    with open_snapshot(info) as snap, connect(info) as conn:
        before = MariaGtidPosition.parse(mariadb.sql("SELECT @@gtid_binlog_pos"))
        mariadb.sql("INSERT INTO g VALUES (3)", database=mysql_db)  # after the snapshot: not in its position
        assert gtid_at(conn, snap.position) == before
        assert MariaGtidPosition.parse(mariadb.sql("SELECT @@gtid_binlog_pos")) > before


def test_a_chunk_left_part_way_leaves_the_snapshot_usable_and_a_table_without_key_is_refused(
        mariadb: Any, mysql_db: str) -> None:
    from flinkish_spark.connectors.mysql.snapshot import read_chunk
    from flinkish_spark.errors import ConfigError

    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v int); CREATE TABLE nokey (v int); INSERT INTO t VALUES "
                + ", ".join(f"({i}, {i})" for i in range(50)), database=mysql_db)
    with open_snapshot(parse_url(mariadb.url_for(mysql_db))) as snap:
        info = snap.table(mysql_db, "t")
        (chunk,) = snap.chunks(info, 100)
        batches = read_chunk(snap.conn, info, chunk, batch_rows=10)
        assert next(batches).num_rows == 10
        batches.close()  # the rest of the result is read off the connection
        assert sum(b.num_rows for b in snap.read(info, chunk)) == 50
        with pytest.raises(ConfigError, match="nokey has no primary key"):
            snap.table(mysql_db, "nokey")
