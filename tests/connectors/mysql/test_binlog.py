"""The binary log read over the replication protocol: table map events with binlog_row_metadata=FULL, and every
column type of a row read back from insert, update and delete events as the type rule (types.py) says."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

from flinkish_spark.connectors.mysql import binlog
from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.position import FilePosition

TABLE = ("CREATE TABLE t (id bigint unsigned PRIMARY KEY, ti tinyint, u int unsigned, d decimal(12,2), c char(3), "
         "v varchar(300) CHARACTER SET latin1, bl blob, tx text, e enum('small','it''s, big'), s set('a','b'), "
         "bt bit(9), dt datetime(6), g point, g2 point, tail varchar(5) CHARACTER SET ascii)")


def test_the_table_map_carries_names_types_signedness_collations_labels_and_key(mariadb, mysql_db: str) -> None:
    info = parse_url(mariadb.url_for(mysql_db))
    mariadb.sql(TABLE, database=mysql_db)
    start_file = mariadb.sql("SHOW MASTER STATUS").split("\t")[0]
    mariadb.sql("INSERT INTO t (id, tail) VALUES (18446744073709551615, 'x')", database=mysql_db)
    with connect(info) as conn:
        events = list(binlog.dump_events(conn, FilePosition(start_file, 4), server_id=9001))
    headers = [binlog.EventHeader.parse(e) for e in events]
    assert binlog.FORMAT_DESCRIPTION_EVENT in [h.type for h in headers]
    assert all(h.size == len(e) + 4 for h, e in zip(headers, events))  # the CRC32 trailer is cut
    maps = [binlog.parse_table_map(e, mariadb=True)
            for h, e in zip(headers, events) if h.type == binlog.TABLE_MAP_EVENT]
    table = next(m for m in maps if (m.database, m.table) == (mysql_db, "t"))

    assert table.names == ("id", "ti", "u", "d", "c", "v", "bl", "tx", "e", "s", "bt", "dt", "g", "g2", "tail")
    assert table.types == (binlog.LONGLONG, binlog.TINY, binlog.LONG, binlog.NEWDECIMAL, binlog.STRING,
                           binlog.VARCHAR, binlog.BLOB, binlog.BLOB, binlog.ENUM, binlog.SET, binlog.BIT,
                           binlog.DATETIME2, binlog.GEOMETRY, binlog.GEOMETRY, binlog.VARCHAR)
    assert table.meta[3] == (12, 2) and table.meta[4] == (12,) and table.meta[5] == (300,)  # char(3) utf8mb4: 12 bytes
    assert table.meta[10] == (9,) and table.meta[11] == (6,)
    assert [i for i, u in enumerate(table.unsigned) if u] == [0, 2]
    assert table.nullable[0] is False and all(table.nullable[1:])
    assert table.enum_labels == {8: ("small", "it's, big")} and table.set_labels == {9: ("a", "b")}
    assert table.primary_key == (0,)
    names = dict(zip(table.names, range(len(table.names))))
    charsets = {name: _charset(mariadb, table.collations[i]) for name, i in names.items() if i in table.collations}
    # MariaDB counts the POINTs among the character columns: the ascii column after them is still ascii.
    assert charsets == {"c": "utf8mb4", "v": "latin1", "bl": "binary", "tx": "utf8mb4", "g": "binary", "g2": "binary",
                        "tail": "ascii"}


def _charset(mariadb, collation_id: int) -> str:
    return mariadb.sql(f"SELECT CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE ID = {collation_id}")\
        .strip()


ALL_TYPES = {  # column definition: (SQL literal, the value read from the log)
    "ti tinyint": ("-5", -5), "tiu tinyint unsigned": ("255", 255), "si smallint": ("-300", -300),
    "mi mediumint": ("-8388608", -8388608), "miu mediumint unsigned": ("16777215", 16777215),
    "i int": ("-7", -7), "iu int unsigned": ("4294967295", 4294967295),
    "bi bigint": ("-9223372036854775808", -9223372036854775808),
    "biu bigint unsigned": ("18446744073709551615", 18446744073709551615),
    "d decimal(12,2)": ("-1234567890.12", Decimal("-1234567890.12")), "d0 decimal": ("42", Decimal(42)),
    "dfrac decimal(4,4)": ("-0.0001", Decimal("-0.0001")),
    "d65 decimal(65,30)": ("12345678901234567890123456789012345.123456789012345678901234567890",
                           Decimal("12345678901234567890123456789012345.123456789012345678901234567890")),
    "f float": ("1.5", 1.5), "db double": ("2.25", 2.25), "c char(3)": ("'ab'", "ab"),
    "vc varchar(20) CHARACTER SET latin1": ("'Zoë €'", "Zoë €"), "tx text": ("'text ✓'", "text ✓"),
    "bn binary(4)": ("x'01020300'", b"\x01\x02\x03\x00"), "vb varbinary(9)": ("x'ff00'", b"\xff\x00"),
    "bl longblob": ("x'deadbeef'", b"\xde\xad\xbe\xef"), "e enum('small','it''s, big')": ("'it''s, big'", "it's, big"),
    "st set('a','b','c')": ("'a,c'", "a,c"), "b1 bit(1)": ("b'1'", True), "b9 bit(9)": ("b'100000001'", b"\x01\x01"),
    "j json": ("'{\"k\": [1, 2]}'", '{"k": [1, 2]}'), "dz date": ("'0000-00-00'", None),
    "dd date": ("'2024-02-29'", date(2024, 2, 29)),
    "dtm datetime(6)": ("'2024-02-29 23:59:59.123456'", datetime(2024, 2, 29, 23, 59, 59, 123456)),
    "dtz datetime": ("'0000-00-00 00:00:00'", None),
    "ts timestamp(3) NULL": ("'2024-03-01 12:00:00.5'", datetime(2024, 3, 1, 12, 0, 0, 500000, timezone.utc)),
    "tm time(2)": ("'-838:59:59.5'", "-838:59:59.50"), "tm0 time": ("'12:34:56'", "12:34:56"),
    "tm6 time(6)": ("'-00:00:01.000001'", "-00:00:01.000001"), "y year": ("0", 0), "y2 year": ("2024", 2024),
    "n int": ("NULL", None),
}


def test_every_type_is_read_from_the_log_as_the_type_rule_says(mariadb, mysql_db: str) -> None:
    from flinkish_spark.connectors.mysql.row_values import RowDecoder
    from flinkish_spark.connectors.mysql.server import collation_charsets

    names = [c.split()[0] for c in ALL_TYPES]
    mariadb.sql(f"CREATE TABLE a (id int PRIMARY KEY, {', '.join(ALL_TYPES)})", database=mysql_db)
    start_file = mariadb.sql("SHOW MASTER STATUS").split("\t")[0]
    row = ", ".join(literal for literal, _ in ALL_TYPES.values())
    mariadb.sql(f"SET sql_mode = ''; SET time_zone = '+00:00'; INSERT INTO a (id, {', '.join(names)}) "
                f"VALUES (1, {row}); UPDATE a SET i = 8, tx = NULL WHERE id = 1; DELETE FROM a", database=mysql_db)
    with connect(parse_url(mariadb.url_for(mysql_db))) as conn:
        charsets = collation_charsets(conn)
        events = list(binlog.dump_events(conn, FilePosition(start_file, 4), server_id=9002))
    decoder = RowDecoder(charsets, mariadb=True)
    changes, maps = [], []
    for event in events:
        kind = event[4]
        if kind == binlog.TABLE_MAP_EVENT:
            maps.append(decoder.table_map(event))
        elif kind in (binlog.WRITE_ROWS_V1, binlog.UPDATE_ROWS_V1, binlog.DELETE_ROWS_V1):
            table, rows = decoder.rows(event)
            if (table.database, table.table) == (mysql_db, "a"):  # the file holds earlier tests' events too
                changes.extend(rows)
    ours = [m for m in maps if m.table == "a" and m.database == mysql_db]
    assert len(ours) == 3 and ours[0] is ours[1] is ours[2]  # one map per statement, parsed once
    expected = [1, *(value for _, value in ALL_TYPES.values())]
    assert [op for op, _, _ in changes] == ["insert", "update", "delete"]
    inserted = changes[0][2]
    assert dict(zip(["id", *names], inserted)) == dict(zip(["id", *names], expected))
    before, after = changes[1][1], changes[1][2]
    assert before == inserted
    assert after == [8 if n == "i" else None if n == "tx" else v for n, v in zip(["id", *names], expected)]
    assert changes[2][1] == after and changes[2][2] is None
    # The planning's counter (row_count.py) walks each of these rows by the columns' widths alone: exactly one row
    # per event, never the fallback to the full decode.
    from flinkish_spark.connectors.mysql.row_count import RowCounter, column_sizes, count_rows

    counter, counted = RowCounter(charsets, mariadb=True), []
    for event in events:
        if event[4] == binlog.TABLE_MAP_EVENT:
            counter.table_map(event)
        elif event[4] in (binlog.WRITE_ROWS_V1, binlog.UPDATE_ROWS_V1, binlog.DELETE_ROWS_V1):
            table, rows = counter.rows(event)
            if (table.database, table.table) == (mysql_db, "a"):
                sizes = column_sizes(table)
                assert sizes is not None and count_rows(event, sizes) == 1
                counted += [op for op, _, _ in rows]
    assert counted == ["insert", "update", "delete"]
