"""The MariaDB server of the tests (Debian's mariadb-server, started by flinkish_spark.embedded.mariadb): the
binary log settings the MySQL source needs, a committed row in the log with its column names, a restart."""

from __future__ import annotations

import subprocess

from flinkish_spark.embedded.mariadb import find_program


def test_server_writes_a_row_based_binary_log_with_column_names(mariadb) -> None:
    settings = mariadb.sql("SELECT @@version, @@log_bin, @@binlog_format, @@binlog_row_image, "
                           "@@binlog_row_metadata, @@character_set_server").split("\t")
    assert settings[0].startswith("10.11"), settings
    assert [s.strip() for s in settings[1:]] == ["1", "ROW", "FULL", "FULL", "utf8mb4"]

    mariadb.sql("CREATE DATABASE smoke; CREATE TABLE smoke.t (id bigint PRIMARY KEY, name varchar(10)); "
                "INSERT INTO smoke.t VALUES (1, 'one')")
    log_file = mariadb.sql("SHOW MASTER STATUS").split("\t")[0]
    # Over TCP, as the connector will read it: the table map carries the column names (row metadata FULL).
    out = subprocess.run([find_program("mariadb-binlog"), "--no-defaults", "--read-from-remote-server",
                          "-h127.0.0.1", f"-P{mariadb.port}", "-uroot", "-vv", "--print-table-metadata", log_file],
                         # other tests of this worker's server logged latin1 and binary values in the same file
                         capture_output=True, encoding="utf-8", errors="replace", check=True).stdout
    assert "### INSERT INTO `smoke`.`t`" in out
    assert "`name` VARCHAR(10)" in out
    gtid = mariadb.sql("SELECT @@gtid_binlog_pos").strip()  # MariaDB GTID: domain-server-sequence
    assert gtid.startswith("0-1-"), gtid

    mariadb.restart()
    assert mariadb.sql("SELECT name FROM smoke.t").strip() == "one"
    assert mariadb.sql("SELECT @@gtid_binlog_pos").strip() == gtid
    mariadb.sql("DROP DATABASE smoke")
