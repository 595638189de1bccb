"""A packed change range cut from row images column by column (connectors/mysql/row_images.py, image_columns.py) holds
exactly the packs made from the decoder's Python values: the same schema rows and typed rows per table -- for a
table of every MySQL type and one of the edges of the direct cuts (length prefixes of 1 and 2 bytes, DECIMALs of
every group shape and sign, fractional seconds of each width, dates before 1970 and zero dates, NULLs anywhere,
rows of several per event, updates that move the key, a column widened mid-run); a date Python refuses fails
both ways alike."""

from __future__ import annotations

from typing import Any

import pytest

from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.mysql import packed_changes
from flinkish_spark.connectors.mysql.connection import parse_url
from flinkish_spark.connectors.mysql.dialect import MysqlDialect
from tests.connectors.mysql.test_packed_changes import _per_table, _read
from tests.connectors.mysql.test_packed_chunks import _table

_EDGES = ("CREATE TABLE e (id int PRIMARY KEY, v varchar(300), w varchar(10) NOT NULL, d1 decimal(18,9), "
          "d2 decimal(5,5), d3 decimal(10,0), d4 decimal(18,0), dt1 datetime(1), dt3 datetime(3), "
          "ts6 timestamp(6) NULL, ts0 timestamp NULL, dd date, m mediumint, mu mediumint unsigned, y year, fl float, "
          "last_col int)")
_FILL = ("INSERT INTO e SELECT seq, IF(seq % 5 = 0, NULL, REPEAT(CHAR(65 + seq % 26), seq % 300)), concat('w', seq), "
         "IF(seq % 7 = 0, NULL, (seq - 150) * 1234567.123456789 / 1000), (seq % 100) / 1000 - 0.05, "
         "seq * 1000003 - 9, (seq - 100) * 99999999999999, '1969-12-31 23:59:59.9' + INTERVAL seq DAY, "
         "IF(seq % 11 = 0, '0000-00-00 00:00:00', '2024-02-29 00:00:00.123' + INTERVAL seq * 3607 SECOND), "
         "IF(seq % 13 = 0, NULL, '1970-01-01 00:00:01.000001' + INTERVAL seq * 86399 SECOND), "
         "IF(seq % 3 = 0, '0000-00-00 00:00:00', '2038-01-19 03:14:07' - INTERVAL seq HOUR), "
         "IF(seq % 17 = 0, '0000-00-00', '0001-01-01' + INTERVAL seq * 1000 DAY), -8388608 + seq * 55924, "
         "16777215 - seq, IF(seq % 4 = 0, 0, 1900 + seq % 256), seq / 3, IF(seq % 2 = 0, NULL, seq) "
         "FROM (SELECT CAST(seq AS SIGNED) AS seq FROM seq_1_to_300) q")


def test_a_packed_range_cut_from_row_images_is_the_packed_range_of_decoded_values(
        mariadb: Any, mysql_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db = mysql_db
    info = parse_url(mariadb.url_for(db))
    dialect = MysqlDialect(info, patterns=TablePatterns.parse(f"{db}.*", "t"))
    with dialect.connect() as conn:
        start = dialect.current_position(conn)
    _table(mariadb, db)  # every type: three rows, the second the other ends, the third all NULL
    mariadb.sql(f"SET sql_mode = ''; SET time_zone = '+00:00'; {_EDGES}; {_FILL}; "
                "UPDATE e SET id = id + 1000, v = NULL WHERE id BETWEEN 20 AND 30; "
                "UPDATE e SET d1 = -d1 WHERE id < 10; DELETE FROM e WHERE id > 290; "
                "ALTER TABLE e MODIFY w varchar(200) NOT NULL; "
                "INSERT INTO e (id, w, last_col) VALUES (5000, REPEAT('é', 150), 7); UPDATE a SET f = 2.5", database=db)
    end = dialect.change_target(start, None)
    by_values = _per_table(_read(dialect, start, end, True, row_images=False))
    direct: list[str] = []  # the columns of the row images' way that took the decoder's values
    original = packed_changes.typed_values

    def noted(values: Any, col: Any, target: Any) -> Any:
        direct.append(col.name)
        return original(values, col, target)

    monkeypatch.setattr(packed_changes, "typed_values", noted)
    by_images = _per_table(_read(dialect, start, end, True, row_images=True))
    assert set(by_images) == {f"{db}.a", f"{db}.e"}
    for table in by_values:
        assert by_images[table] == by_values[table], table
    # every column but these was cut directly (the others need the decoder: padding, labels, text of bits...)
    assert set(direct) == {"biu", "d65", "vc", "bn", "e", "st", "b1", "b9", "tm", "g", "u"}
    rows = [r[2] for r in by_images[f"{db}.e"] if r[0] == "row"]
    assert len(rows) > 300 and {r["_op"] for r in rows} == {"c", "u", "d"}


def test_a_date_python_refuses_fails_the_read_both_ways(mariadb: Any, mysql_db: str) -> None:
    info = parse_url(mariadb.url_for(mysql_db))
    dialect = MysqlDialect(info, patterns=TablePatterns.parse(f"{mysql_db}.*", "t"))
    mariadb.sql("CREATE TABLE d (id int PRIMARY KEY, dd date)", database=mysql_db)
    with dialect.connect() as conn:
        start = dialect.current_position(conn)
    mariadb.sql("SET sql_mode = 'ALLOW_INVALID_DATES'; INSERT INTO d VALUES (1, '2024-02-30')", database=mysql_db)
    end = dialect.change_target(start, None)
    for images in (False, True):
        with pytest.raises(ValueError, match="day is out of range"):
            _read(dialect, start, end, True, row_images=images)
