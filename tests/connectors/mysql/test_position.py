"""Binary log positions: order, one string each, and whether the server still has what a position needs."""

from __future__ import annotations

import pytest

from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.position import FilePosition, Gtid, MariaGtidPosition, purged
from flinkish_spark.connectors.mysql.server import binary_logs, oldest_gtid_list
from flinkish_spark.errors import ConfigError


def test_file_positions_order_by_file_number_then_offset_and_round_trip() -> None:
    a, b, c = FilePosition("binlog.999999", 900), FilePosition("binlog.1000000", 4), FilePosition("binlog.1000000", 5)
    assert a < b < c and sorted([c, a, b]) == [a, b, c]
    assert FilePosition.parse(str(b)) == b and str(b) == "binlog.1000000:4"
    with pytest.raises(ConfigError, match="file:offset"):
        FilePosition.parse("binlog.000001")
    with pytest.raises(ConfigError, match="first event is at offset 4"):
        FilePosition("binlog.000001", 0)


def test_mariadb_gtid_positions_are_ordered_per_domain() -> None:
    p = MariaGtidPosition.parse("1-2-5,0-1-100")
    assert str(p) == "0-1-100,1-2-5" and MariaGtidPosition.parse(str(p)) == p
    later = p.after(Gtid(0, 3, 101))  # a failover: another server continues domain 0
    assert p < later and later > p and str(later) == "0-3-101,1-2-5"
    other = MariaGtidPosition.parse("0-1-200,1-2-1")  # ahead in domain 0, behind in 1: not comparable
    assert not (p <= other) and not (other <= p)
    assert MariaGtidPosition.parse("") <= p
    with pytest.raises(ConfigError, match="domain-server-sequence"):
        MariaGtidPosition.parse("3E11FA47-71CA-11E1-9E33-C80AA9429562:23")  # a MySQL GTID set


def test_purged_positions_are_noticed_on_the_server(mariadb, mysql_db: str) -> None:
    """PURGE BINARY LOGS on the worker's server: later tests start from current positions, which stay."""
    info = parse_url(mariadb.url_for(mysql_db))
    mariadb.sql(f"CREATE TABLE {mysql_db}.t (id int PRIMARY KEY)")
    with connect(info) as conn:
        old_file = binary_logs(conn)[-1]
        old = FilePosition(old_file, 4)
        old_gtid = MariaGtidPosition.parse(mariadb.sql("SELECT @@gtid_binlog_pos"))  # its next: INSERT 1 in old_file
        mariadb.sql(f"INSERT INTO {mysql_db}.t VALUES (1)")
        mariadb.sql(f"FLUSH BINARY LOGS; INSERT INTO {mysql_db}.t VALUES (2)")
        assert not purged(old, binary_logs(conn))
        logs = binary_logs(conn)
        assert not purged(old_gtid, logs, oldest_gtid_list(conn, logs[0]))

        mariadb.sql(f"INSERT INTO {mysql_db}.t VALUES (3); FLUSH BINARY LOGS")
        # MariaDB keeps a file its storage engine still needs for recovery: old_file goes, maybe not the next.
        mariadb.sql(f"PURGE BINARY LOGS TO '{binary_logs(conn)[-1]}'")
        logs = binary_logs(conn)
        assert old_file not in logs and purged(old, logs)
        assert purged(old_gtid, logs, oldest_gtid_list(conn, logs[0]))  # INSERT 1 is gone
        now = MariaGtidPosition.parse(mariadb.sql("SELECT @@gtid_binlog_pos"))
        assert not purged(now, logs, oldest_gtid_list(conn, logs[0]))


def test_mysql_gtid_sets_parse_normalized_and_a_log_end_carries_the_executed_set() -> None:
    """MySQL's executed GTID set (``SHOW MASTER STATUS``' Executed_Gtid_Set): one text per set, intervals merged,
    UUIDs in lower case and order; the log's end on MySQL carries it beside the file position (no MySQL server
    in the tests: the parsed values and a fake cursor)."""
    from flinkish_spark.connectors.mysql.changes import current_end
    from flinkish_spark.connectors.mysql.position import MysqlGtidSet

    a = "3E11FA47-71CA-11E1-9E33-C80AA9429562:23,3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:6-22"
    b = "2174b383-5441-11e8-b90a-c80aa9429562:1-3"
    s = MysqlGtidSet.parse(f"{a},\n{b}")
    assert str(s) == ("2174b383-5441-11e8-b90a-c80aa9429562:1-3,3e11fa47-71ca-11e1-9e33-c80aa9429562:1-23")
    assert MysqlGtidSet.parse(str(s)) == s and str(MysqlGtidSet.parse("")) == ""
    assert MysqlGtidSet.parse(b) <= s and not s <= MysqlGtidSet.parse(b)
    with pytest.raises(ConfigError, match="not a MySQL GTID set"):
        MysqlGtidSet.parse("0-1-100")

    class Cursor:
        def __enter__(self) -> "Cursor":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def execute(self, sql: str, args: object = None) -> None:
            assert sql == "SHOW MASTER STATUS"

        def fetchone(self) -> tuple:
            return ("binlog.000003", 1234, "", "", f"{a},\n{b}")

    conn = type("Conn", (), {"cursor": lambda self: Cursor()})()
    end = current_end(conn, mariadb=False)
    assert end.file == FilePosition("binlog.000003", 1234) and end.gtid == s
