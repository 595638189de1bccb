"""MySQL and MariaDB column types -> Arrow and Spark types: one table, the rule for each type.

The input is a column's ``COLUMN_TYPE`` from ``information_schema.COLUMNS`` (``bigint(20) unsigned``,
``decimal(12,2)``, ``enum('a','b')``, ``datetime(6)``). Every MySQL value of a column fits its type here
without loss, or the type is text with MySQL's own rendering:

================================  =====================  =========================  ==========================
MySQL type                        Spark                  Arrow                      rule
================================  =====================  =========================  ==========================
TINYINT / UNSIGNED                byte / short           int8 / int16               TINYINT(1) stays a number
SMALLINT / UNSIGNED               short / int            int16 / int32
MEDIUMINT (either)                int                    int32
INT / UNSIGNED                    int / long             int32 / int64
BIGINT / UNSIGNED                 long / decimal(20,0)   int64 / decimal128(20,0)   2^64-1 needs 20 digits
DECIMAL(p,s), p <= 38             decimal(p,s)           decimal128(p,s)
DECIMAL(p,s), p > 38              string                 string                     Spark's limit is 38 digits
FLOAT / DOUBLE                    float / double         float32 / float64
CHAR, VARCHAR, *TEXT              string                 string                     decoded from the column's charset
ENUM                              string                 string                     the label ('' for invalid)
SET                               string                 string                     labels joined by ',' as MySQL shows
JSON                              string                 string                     JSON text (MariaDB: LONGTEXT)
BINARY(n), VARBINARY, *BLOB       binary                 binary                     BINARY: padded to n (a)
BIT(1)                            boolean                bool
BIT(n), n > 1                     binary                 binary                     big-endian, ceil(n/8) bytes
DATE                              date                   date32                     zero date -> NULL
DATETIME(fsp)                     timestamp_ntz          timestamp(us)              wall clock; zero -> NULL
TIMESTAMP(fsp)                    timestamp              timestamp(us, UTC)         an instant; zero -> NULL
TIME(fsp)                         string                 string                     -838:59:59 .. 838:59:59
YEAR                              short                  int16                      0000 stays 0
GEOMETRY types                    binary                 binary                     MySQL's SRID + WKB bytes
INET4, INET6, UUID (MariaDB)      string                 string                     as MySQL shows them
================================  =====================  =========================  ==========================

(a) The binary log drops a BINARY(n) value's trailing zero bytes; a decoder pads them back.

Zero dates (``0000-00-00``, ``0000-00-00 00:00:00`` and dates with a zero year, month or day, which
MySQL stores unless ``NO_ZERO_DATE``/``NO_ZERO_IN_DATE`` forbid them; year 0 is also outside Spark's
dates) name no day: they are read as
NULL, as MySQL's own JDBC driver does with ``zeroDateTimeBehavior=CONVERT_TO_NULL`` and Debezium
does for nullable columns (:func:`is_zero_date`). TIME is text because no Spark, Delta or Iceberg
type holds durations beyond 24 hours or below zero, which a MySQL TIME may be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import types as T

from flinkish_spark.errors import ConfigError

MAX_SPARK_DECIMAL = 38
_TYPE = re.compile(r"^\s*(?P<name>[a-z0-9_ ]+?)\s*(?:\((?P<args>.*)\))?\s*(?P<attrs>(?:unsigned|signed|zerofill|\s)*)$",
                   re.IGNORECASE | re.DOTALL)

_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json", "enum", "set", "time",
         "inet4", "inet6", "uuid", "long varchar", "long", "nchar", "nvarchar"}
_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "long varbinary",
           "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
           "geometrycollection", "geomcollection"}
_SIGNED = {"tinyint": (T.ByteType(), pa.int8()), "smallint": (T.ShortType(), pa.int16()),
           "mediumint": (T.IntegerType(), pa.int32()), "int": (T.IntegerType(), pa.int32()),
           "integer": (T.IntegerType(), pa.int32()), "bigint": (T.LongType(), pa.int64())}
_UNSIGNED = {"tinyint": (T.ShortType(), pa.int16()), "smallint": (T.IntegerType(), pa.int32()),
             "mediumint": (T.IntegerType(), pa.int32()), "int": (T.LongType(), pa.int64()),
             "integer": (T.LongType(), pa.int64()), "bigint": (T.DecimalType(20, 0), pa.decimal128(20, 0))}


@dataclass(frozen=True)
class ColumnType:
    """A parsed ``COLUMN_TYPE``: the base name (lower case), its arguments as written, unsigned or not."""

    name: str
    args: tuple[str, ...]
    unsigned: bool

    @classmethod
    def parse(cls, column_type: str) -> ColumnType:
        m = _TYPE.match(column_type)
        if m is None:
            raise ConfigError(f"cannot read the MySQL column type {column_type!r}")
        raw = m["args"]
        args = tuple(a.strip() for a in _split_args(raw)) if raw is not None else ()
        name = " ".join(m["name"].lower().split())
        if name in ("double precision", "real"):
            name = "double"
        elif name in ("numeric", "dec", "fixed"):
            name = "decimal"
        elif name in ("bool", "boolean"):
            name, args = "tinyint", ("1",)
        return cls(name, args, "unsigned" in (m["attrs"] or "").lower())


def _split_args(raw: str) -> list[str]:
    """``'a','b,c'`` -> ['a', 'b,c'] (quoted ENUM/SET labels may hold commas); ``12,2`` -> ['12', '2']."""
    out, cur, quoted, i = [], "", False, 0
    while i < len(raw):
        ch = raw[i]
        if ch == "'":
            if quoted and raw[i + 1:i + 2] == "'":  # '' inside a label
                cur += "'"
                i += 2
                continue
            quoted = not quoted
        elif ch == "," and not quoted:
            out.append(cur)
            cur = ""
            i += 1
            continue
        else:
            cur += ch
        i += 1
    out.append(cur)
    return out


def types_for(column_type: str) -> tuple[T.DataType, pa.DataType]:
    """(Spark type, Arrow type) of a MySQL ``COLUMN_TYPE``; a :class:`ConfigError` for a type not in the table."""
    t = ColumnType.parse(column_type)
    if t.name in _SIGNED:
        return (_UNSIGNED if t.unsigned else _SIGNED)[t.name]
    if t.name == "decimal":
        precision = int(t.args[0]) if t.args else 10
        scale = int(t.args[1]) if len(t.args) > 1 else 0
        if precision > MAX_SPARK_DECIMAL:
            return T.StringType(), pa.string()
        return T.DecimalType(precision, scale), pa.decimal128(precision, scale)
    if t.name == "float":
        # FLOAT(p) with p > 24 is a DOUBLE (MySQL stores it as one).
        if t.args and t.args[0] and len(t.args) == 1 and int(t.args[0]) > 24:
            return T.DoubleType(), pa.float64()
        return T.FloatType(), pa.float32()
    if t.name == "double":
        return T.DoubleType(), pa.float64()
    if t.name in _TEXT:
        return T.StringType(), pa.string()
    if t.name in _BINARY:
        return T.BinaryType(), pa.binary()
    if t.name == "bit":
        width = int(t.args[0]) if t.args else 1
        return (T.BooleanType(), pa.bool_()) if width == 1 else (T.BinaryType(), pa.binary())
    if t.name == "date":
        return T.DateType(), pa.date32()
    if t.name == "datetime":
        return T.TimestampNTZType(), pa.timestamp("us")
    if t.name == "timestamp":
        return T.TimestampType(), pa.timestamp("us", tz="UTC")
    if t.name == "year":
        return T.ShortType(), pa.int16()
    raise ConfigError(f"the flinkish.mysql source cannot read the MySQL column type {column_type!r} yet")


def spark_type(column_type: str) -> T.DataType:
    return types_for(column_type)[0]


def arrow_type(column_type: str) -> pa.DataType:
    return types_for(column_type)[1]


def enum_labels(column_type: str) -> tuple[str, ...]:
    """The labels of an ``enum(...)`` or ``set(...)`` column, in order (the binary log holds their indexes)."""
    t = ColumnType.parse(column_type)
    if t.name not in ("enum", "set"):
        raise ValueError(f"{column_type!r} is not an ENUM or SET")
    return t.args


_ZERO_DATE = re.compile(r"^(?P<y>[0-9]{4})-(?P<m>[0-9]{2})-(?P<d>[0-9]{2})")


def is_zero_date(text: str) -> bool:
    """Whether a DATE/DATETIME/TIMESTAMP value as MySQL renders it names no day: year, month or day 0."""
    m = _ZERO_DATE.match(text)
    return m is not None and (m["y"] == "0000" or m["m"] == "00" or m["d"] == "00")
