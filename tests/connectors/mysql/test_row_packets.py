"""A snapshot chunk's row packets split by blocks (connectors/mysql/row_packets.py) give the values PyMySQL's own
reader gives: NULLs, empty values, every length prefix (1, 3, 4 and 9 bytes), a row of several packets, rows cut
by a block's end anywhere -- and an error after some rows is PyMySQL's error."""

from __future__ import annotations

from contextlib import closing
from typing import Any

import pymysql
import pytest

from flinkish_spark.connectors.mysql import row_packets, socket_blocks
from flinkish_spark.connectors.mysql.connection import connect, parse_url


def _ours(conn: Any, sql: str, ncols: int) -> list[tuple[Any, ...]]:
    cur = pymysql.cursors.SSCursor(conn)
    cur.execute(sql)
    columns = [[] for _ in range(ncols)]  # type: list[list[Any]]
    for block in row_packets.column_blocks(cur._result, ncols, rows=3):
        for k, arr in enumerate(block):
            columns[k] += arr.to_pylist()
    cur.close()
    return list(zip(*columns))


def _pymysql(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return [tuple(v if v is None or isinstance(v, bytes) else str(v).encode() for v in row)
                for row in cur.fetchall()]


@pytest.mark.parametrize("block", [7, 1 << 20])
def test_blocks_of_rows_give_the_server_values_whatever_their_lengths(
        mariadb: Any, mysql_db: str, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    mariadb.sql("SET GLOBAL max_allowed_packet = 64 * 1024 * 1024")
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, v varchar(400), b longblob, n double)", database=mysql_db)
    lengths = [0, 1, 250, 251, 252, 300, 65535, 65536, 70000]
    mariadb.sql("; ".join(f"INSERT INTO t VALUES ({i}, repeat('é', {min(n, 400)}), repeat('x', {n}), {i}.5)"
                          for i, n in enumerate(lengths))
                + "; INSERT INTO t VALUES (100, NULL, NULL, NULL), (101, '', '', 0)"
                + "; INSERT INTO t VALUES (102, 'big', repeat('y', 17 * 1024 * 1024), 1)", database=mysql_db)
    monkeypatch.setattr(socket_blocks, "BLOCK", block)  # 7 bytes: a block's end inside every header and value
    sql = "SELECT id, v, b, concat(n) FROM t ORDER BY id"  # the server's text of the double (PyMySQL: a float)
    with closing(connect(parse_url(mariadb.url_for(mysql_db)))) as conn:
        want = _pymysql(conn, sql)
        assert _ours(conn, sql, 4) == want
        assert len(want) == 12 and len(want[-1][2]) == 17 * 1024 * 1024  # several packets, a 9-byte prefix
        assert _pymysql(conn, "SELECT 1") == [(b"1",)]  # the connection is usable after the result's end

        # Left part way (a chunk's reader closed early): the rest, the 17 MiB row too, is read off the connection.
        cur = pymysql.cursors.SSCursor(conn)
        cur.execute(sql)
        blocks = row_packets.column_blocks(cur._result, 4, rows=2)
        assert next(blocks)[0].to_pylist() == [b"0", b"1"]
        blocks.close()
        cur.close()
        assert _pymysql(conn, "SELECT 2") == [(b"2",)]

        # An error after some rows (a subquery of two rows at id 5): PyMySQL's error, the rows before it given.
        with pytest.raises(pymysql.err.MySQLError, match="more than 1 row"):
            _ours(conn, "SELECT id, (SELECT 1 FROM dual WHERE t.id = 5 UNION ALL SELECT 2 FROM dual WHERE t.id = 5) "
                        "FROM t ORDER BY id", 2)
