"""MySQL column types -> Spark and Arrow types, read from the real server's catalog, and the zero-date rule."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.types import enum_labels, is_zero_date, spark_type, types_for
from flinkish_spark.errors import ConfigError

# column definition -> (Spark type, Arrow type)
COLUMNS = {
    "ti tinyint": (T.ByteType(), pa.int8()),
    "ti1 tinyint(1)": (T.ByteType(), pa.int8()),
    "tiu tinyint unsigned": (T.ShortType(), pa.int16()),
    "si smallint": (T.ShortType(), pa.int16()),
    "siu smallint unsigned": (T.IntegerType(), pa.int32()),
    "mi mediumint unsigned": (T.IntegerType(), pa.int32()),
    "i int": (T.IntegerType(), pa.int32()),
    "iu int unsigned zerofill": (T.LongType(), pa.int64()),
    "bi bigint": (T.LongType(), pa.int64()),
    "biu bigint unsigned": (T.DecimalType(20, 0), pa.decimal128(20, 0)),
    "d decimal(12,2)": (T.DecimalType(12, 2), pa.decimal128(12, 2)),
    "d0 decimal": (T.DecimalType(10, 0), pa.decimal128(10, 0)),
    "d65 decimal(65,30)": (T.StringType(), pa.string()),
    "f float": (T.FloatType(), pa.float32()),
    "db double": (T.DoubleType(), pa.float64()),
    "c char(3)": (T.StringType(), pa.string()),
    "vc varchar(20) CHARACTER SET latin1": (T.StringType(), pa.string()),
    "tx text": (T.StringType(), pa.string()),
    "bn binary(4)": (T.BinaryType(), pa.binary()),
    "vb varbinary(9)": (T.BinaryType(), pa.binary()),
    "bl longblob": (T.BinaryType(), pa.binary()),
    "e enum('small','it''s, big')": (T.StringType(), pa.string()),
    "st set('a','b','c')": (T.StringType(), pa.string()),
    "b1 bit(1)": (T.BooleanType(), pa.bool_()),
    "b9 bit(9)": (T.BinaryType(), pa.binary()),
    "j json": (T.StringType(), pa.string()),
    "dt date": (T.DateType(), pa.date32()),
    "dtm datetime(6)": (T.TimestampNTZType(), pa.timestamp("us")),
    "ts timestamp(3) NULL": (T.TimestampType(), pa.timestamp("us", tz="UTC")),
    "tm time(2)": (T.StringType(), pa.string()),
    "y year": (T.ShortType(), pa.int16()),
    "g point": (T.BinaryType(), pa.binary()),
    "u uuid": (T.StringType(), pa.string()),
}


def test_every_type_of_a_real_table_maps_to_a_lossless_type(mariadb, mysql_db: str) -> None:
    mariadb.sql(f"CREATE TABLE all_types (id int PRIMARY KEY, {', '.join(COLUMNS)})", database=mysql_db)
    with connect(parse_url(mariadb.url_for(mysql_db))) as conn, conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'all_types' AND COLUMN_NAME <> 'id' "
                    "ORDER BY ORDINAL_POSITION", (mysql_db,))
        catalog = cur.fetchall()
    assert len(catalog) == len(COLUMNS)
    for (name, column_type), (definition, expected) in zip(catalog, COLUMNS.items()):
        assert definition.split()[0] == name
        assert types_for(column_type) == expected, (definition, column_type)
    labels = dict(catalog)
    assert enum_labels(labels["e"]) == ("small", "it's, big")
    assert enum_labels(labels["st"]) == ("a", "b", "c")


def test_zero_dates_are_recognised_as_the_server_renders_them(mariadb, mysql_db: str) -> None:
    out = mariadb.sql("SET SESSION sql_mode = ''; CREATE TABLE z (id int PRIMARY KEY, d date, t datetime(6)); "
                      "INSERT INTO z VALUES (1, '0000-00-00', '0000-00-00 00:00:00'), (2, '2024-00-15', "
                      "'2024-02-00 10:00:00'), (3, '2024-02-29', '2024-02-29 23:59:59.5'); "
                      "SELECT d, t FROM z ORDER BY id", database=mysql_db)
    rows = [line.split("\t") for line in out.splitlines()]
    assert [[is_zero_date(v) for v in row] for row in rows] == [[True, True], [True, True], [False, False]]


def test_a_type_not_in_the_table_is_named() -> None:
    assert spark_type("INT(11) UNSIGNED") == T.LongType()
    assert spark_type("double precision") == T.DoubleType()
    with pytest.raises(ConfigError, match="cannot read the MySQL column type 'vector"):
        types_for("vector(3)")
