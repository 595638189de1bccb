"""The binary log read over the replication protocol, and its table map events with binlog_row_metadata=FULL."""

from __future__ import annotations

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
