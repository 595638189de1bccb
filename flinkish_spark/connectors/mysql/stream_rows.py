"""MySQL/MariaDB tables and rows in the CDC core's multi-table stream: ``s`` schema rows and JSON rows the sinks decode.

What it guarantees: every routing sink and ``flinkish mirror`` read a MySQL table's rows as they read a PostgreSQL
table's -- the ``s`` row is a :class:`..postgres.rows.TableSchema` whose columns carry *PostgreSQL* type names
(:func:`column`: the routed PostgreSQL sink creates and alters its targets with them) and the encodings and Spark
types of :mod:`..postgres.rows.schema`; each MySQL type goes to the one PostgreSQL type that holds all its values as
:mod:`.types` reads them (TINYINT -> smallint, INT UNSIGNED -> bigint, BIGINT UNSIGNED -> numeric(20,0), DECIMAL(p,s)
-> numeric(p,s), FLOAT -> real, CHAR/TEXT/ENUM/SET/JSON/TIME -> text, BINARY/BLOB/BIT(n) -> bytea, BIT(1) -> boolean,
DATETIME -> timestamp, TIMESTAMP -> timestamptz, YEAR -> smallint).

One mapping for both halves, so that a snapshot chunk and the changes after it name the same schema (same
``_schema_id``) while the table is unchanged: a chunk's schema comes from the catalog's ``COLUMN_TYPE``
(:func:`schema_of_info`), a change's from the table map the binary log wrote with its rows (:func:`schema_of_map`,
turned into the same ``COLUMN_TYPE`` spelling first) -- so a replay of a range gives the same schema whatever DDL
came since, and a column's new type shows in the first ``s`` row after the DDL.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any, Callable, Mapping, Sequence

from pyspark.sql import types as T

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql.snapshot import TableInfo
from flinkish_spark.connectors.mysql.types import spark_type
from flinkish_spark.connectors.postgres.rows import TableSchema, make_column
from flinkish_spark.connectors.postgres.rows.schema import Column

_BINARY_COLLATION = 63
#: Spark type of :mod:`.types` -> (PostgreSQL type as shown, its base type name).
_PG: dict[T.DataType, tuple[str, str]] = {T.ByteType(): ("smallint", "int2"), T.ShortType(): ("smallint", "int2"), T.IntegerType(): ("integer", "int4"),
       T.LongType(): ("bigint", "int8"), T.FloatType(): ("real", "float4"), T.DoubleType(): ("double precision", "float8"),
       T.StringType(): ("text", "text"), T.BinaryType(): ("bytea", "bytea"), T.BooleanType(): ("boolean", "bool"),
       T.DateType(): ("date", "date"), T.TimestampNTZType(): ("timestamp without time zone", "timestamp"),
       T.TimestampType(): ("timestamp with time zone", "timestamptz")}
_INTS = {B.TINY: "tinyint", B.SHORT: "smallint", B.INT24: "mediumint", B.LONG: "int", B.LONGLONG: "bigint"}
_PLAIN = {B.FLOAT: "float", B.DOUBLE: "double", B.DATE: "date", B.DATETIME2: "datetime", B.TIMESTAMP2: "timestamp",
          B.TIME2: "time", B.YEAR: "year", B.JSON: "json", B.ENUM: "enum", B.SET: "set", B.GEOMETRY: "geometry"}


def column(name: str, column_type: str) -> Column:
    """The stream's column for a MySQL column of ``COLUMN_TYPE`` ``column_type`` (see the module docstring)."""
    spark = spark_type(column_type)
    if isinstance(spark, T.DecimalType):
        typmod = ((spark.precision << 16) | spark.scale) + 4
        return make_column(name, f"numeric({spark.precision},{spark.scale})", "numeric", typmod, None)
    shown, base = _PG[spark]
    return make_column(name, shown, base, -1, None)


def schema_of_info(info: TableInfo) -> TableSchema:
    """A table's schema from the catalog (a snapshot chunk's, read in the chunk's own transaction)."""
    return TableSchema(f"{info.database}.{info.table}", tuple(column(c.name, c.column_type) for c in info.columns),
                       info.key)


def map_column_type(table: B.TableMap, i: int, text: Mapping[int, str] | None = None) -> str:
    """The ``COLUMN_TYPE`` spelling of a table map's column ``i``, as far as :mod:`.types` tells types apart.
    ``text``: the columns the decoder reads as text though the log has them as binary strings (MariaDB's UUID,
    INET4, INET6: :meth:`.row_values.RowDecoder.text_types`)."""
    if text and i in text:
        return text[i]
    t, meta = table.types[i], table.meta[i]
    unsigned = " unsigned" if table.unsigned and table.unsigned[i] else ""
    if t in _INTS:
        return _INTS[t] + unsigned
    if t == B.NEWDECIMAL:
        return f"decimal({meta[0]},{meta[1]})"
    if t == B.BIT:
        return f"bit({meta[0]})"
    if t in (B.VARCHAR, B.VAR_STRING, B.STRING, B.BLOB):
        return "varbinary" if table.collations.get(i, _BINARY_COLLATION) == _BINARY_COLLATION else "varchar"
    if t in _PLAIN:
        return _PLAIN[t]
    raise ValueError(f"column {i} of {table.database}.{table.table}: binary log type {t} has no stream type")


def schema_of_map(table: B.TableMap, key: Sequence[str], text: Mapping[int, str] | None = None) -> TableSchema:
    """A change's schema from its table map (``binlog_row_metadata=FULL``: names, signedness, collations)."""
    if table.names is None:
        raise ValueError(f"the table map of {table.database}.{table.table} has no column names: "
                         "binlog_row_metadata must be FULL")
    return TableSchema(f"{table.database}.{table.table}",
                       tuple(column(n, map_column_type(table, i, text)) for i, n in enumerate(table.names)), tuple(key))


def map_key(table: B.TableMap) -> tuple[str, ...]:
    """The primary key the table map names (``binlog_row_metadata=FULL``), () without one."""
    return tuple(table.names[i] for i in table.primary_key) if table.names else ()


def _number(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    if isinstance(v, Decimal):
        return format(v, "f")
    return str(int(v))


def _text(v: Any) -> str:
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            return json.dumps(v.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat(sep=" ") + "+00:00")
        return json.dumps(v.isoformat(sep=" "))
    if isinstance(v, dt.date):
        return json.dumps(v.isoformat())
    if isinstance(v, (bytes, bytearray)):
        return json.dumps(bytes(v).decode("utf-8", "replace"))
    if isinstance(v, Decimal):
        return json.dumps(format(v, "f"))
    return json.dumps(v if isinstance(v, str) else str(v), ensure_ascii=False)


def _base64(v: Any) -> str:
    raw = v.encode() if isinstance(v, str) else bytes(v)  # MariaDB's UUID/INET: the text the decoder made
    return '"' + base64.b64encode(raw).decode() + '"'


_ENCODERS: dict[str, Callable[[Any], str]] = {"number": _number, "bool": lambda v: "true" if v else "false",
                                              "base64": _base64, "string": _text}


def row_encoder(schema: TableSchema) -> Callable[[Sequence[Any]], str]:
    """Values in the schema's column order -> the row's JSON text (null as ``null``)."""
    parts = [(json.dumps(c.name) + ":", _ENCODERS[c.encoding]) for c in schema.columns]

    def encode(values: Sequence[Any]) -> str:
        return "{" + ",".join(name + ("null" if v is None else enc(v)) for (name, enc), v in zip(parts, values)) + "}"

    return encode
