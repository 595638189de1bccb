"""What the source needs from the server's binary log: one clear error per wrong setting, naming the fix."""

from __future__ import annotations

import pytest

from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.server import BinlogSettingError, check_server, check_settings

GOOD = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL",
        "server_id": "1"}
INFO = parse_url("mysql://repl:secret@db:3306/shop")


@pytest.mark.parametrize("setting, value, words", [
    ("log_bin", "OFF", r"has no binary log \(log_bin is OFF\)"),
    ("binlog_format", "MIXED", "logs binlog_format = MIXED; the flinkish.mysql source needs binlog_format = ROW"),
    ("binlog_row_image", "MINIMAL", "SET GLOBAL binlog_row_image = 'FULL'"),
    ("binlog_row_metadata", "MINIMAL", "binlog-row-metadata = FULL in its option file"),
])
def test_each_wrong_setting_has_its_own_message(setting: str, value: str, words: str) -> None:
    with pytest.raises(BinlogSettingError, match=words) as err:
        check_settings(INFO, "10.11.18-MariaDB", {**GOOD, setting: value})
    assert "secret" not in str(err.value) and "mysql://repl:***@db:3306/shop" in str(err.value)


def test_an_old_server_without_row_metadata_is_told_to_upgrade() -> None:
    settings = {k: v for k, v in GOOD.items() if k != "binlog_row_metadata"}
    with pytest.raises(BinlogSettingError, match=r"has no setting binlog_row_metadata.*MariaDB 10\.5\+"):
        check_settings(INFO, "10.4.30-MariaDB", settings)


def test_the_test_server_passes_and_a_statement_log_is_refused(mariadb) -> None:
    info = parse_url(mariadb.url)
    with connect(info) as conn:
        server = check_server(conn, info)
        assert server.mariadb and server.gtid_kind == "mariadb" and server.server_id == 1
        try:
            with conn.cursor() as cur:
                cur.execute("SET GLOBAL binlog_format = 'STATEMENT'")
            with pytest.raises(BinlogSettingError, match="binlog_format = STATEMENT"):
                check_server(conn, info)
        finally:
            with conn.cursor() as cur:
                cur.execute("SET GLOBAL binlog_format = 'ROW'")
