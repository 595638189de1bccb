"""A table's schema as the multi-table stream describes it: columns, their JSON encoding, Spark and Arrow types, key.

:class:`TableSchema` is what an ``_op = 's'`` row carries (as JSON in its ``row`` column) and
what every data row names by ``_schema_id``. The id is a hash of the content, so the
source's driver, its executors and a replay all compute the same id for the same columns,
without coordinating: two schemas with the same id are the same schema.

Type mapping (PostgreSQL -> JSON value -> Spark type of the ``from_json`` helper schema):

=========================================  ======================================  ==================
PostgreSQL                                 JSON value                              Spark
=========================================  ======================================  ==================
int2, int4, int8, oid                      number                                  smallint/int/bigint
numeric(p,s), 0 <= s <= p <= 38            number, exact digits (``12.30``)        decimal(p,s)
float4, float8                             number (shortest exact text)            float/double
bool                                       true / false                            boolean
bytea                                      string, base64                          binary
date / timestamp / timestamptz             string, PostgreSQL's ISO text           date/timestamp_ntz/timestamp
                                           (timestamptz in UTC: ``...+00``)
1-D/n-D arrays of the types above with     array (nested for more dimensions)      array<...>
number/bool/text/uuid elements
everything else: text, varchar, uuid,      string: PostgreSQL's text output        string
json, jsonb, interval, time, money,
enums, numeric beyond 38 digits or
without precision, other arrays, ...
=========================================  ======================================  ==================

``NaN``, ``Infinity`` and ``-Infinity`` of float and numeric columns are bare JSON tokens
(``{"x":NaN}``): Spark's ``from_json``, pyarrow and Python's ``json`` read them; strict JSON
parsers (Spark's ``parse_json``) do not. A null column is ``null``; a delete row holds the
key columns only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import pyarrow as pa

#: How a column's values are written in the JSON row (see the module docstring).
Encoding = Literal["number", "bool", "base64", "string", "array"]

#: Element types of arrays written as JSON arrays (any other array is its text, a string).
_ARRAY_ELEMENTS = {"int2", "int4", "int8", "float4", "float8", "bool", "numeric", "text", "varchar", "bpchar",
                   "name", "uuid"}
_INTS = {"int2": "smallint", "int4": "int", "int8": "bigint", "oid": "bigint"}
_FLOATS = {"float4": "float", "float8": "double"}
_TEMPORAL = {"date": "date", "timestamp": "timestamp_ntz", "timestamptz": "timestamp"}
_STRINGY = {"text", "varchar", "bpchar", "name", "uuid"}


@dataclass(frozen=True)
class Column:
    """One column: ``type`` is PostgreSQL's own spelling (``format_type``: ``numeric(12,2)``,
    ``integer[]``), ``pg_type`` the base type's name (a domain's base type; ``_int4`` for an
    ``int4`` array), ``encoding`` how its JSON value is written, ``spark_type`` the Spark DDL
    type of the helper schema, ``element`` the element kind of an array written as a JSON array."""

    name: str
    type: str
    pg_type: str
    encoding: Encoding
    spark_type: str
    element: Encoding | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "type": self.type, "pg_type": self.pg_type, "encoding": self.encoding,
             "spark_type": self.spark_type}
        if self.element is not None:
            d["element"] = self.element
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Column":
        return cls(str(d["name"]), str(d["type"]), str(d["pg_type"]), d["encoding"], str(d["spark_type"]),
                   d.get("element"))


def numeric_precision(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a ``numeric`` typmod, or None without one."""
    if typmod < 4:
        return None
    # As PostgreSQL's numeric.c: the scale is 11 bits, signed from version 15 on (numeric(5,-2)).
    precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (((typmod - 4) & 0x7FF) ^ 1024) - 1024
    return precision, scale


def _scalar(pg_type: str, typmod: int) -> tuple[Encoding, str]:
    """(encoding, Spark type) of a non-array base type."""
    if pg_type in _INTS:
        return "number", _INTS[pg_type]
    if pg_type in _FLOATS:
        return "number", _FLOATS[pg_type]
    if pg_type == "numeric":
        ps = numeric_precision(typmod)
        if ps is not None and 0 <= ps[1] <= ps[0] <= 38:
            return "number", f"decimal({ps[0]},{ps[1]})"
        return "string", "string"  # beyond Spark's decimal: the exact text
    if pg_type == "bool":
        return "bool", "boolean"
    if pg_type == "bytea":
        return "base64", "binary"
    if pg_type in _TEMPORAL:
        return "string", _TEMPORAL[pg_type]
    return "string", "string"


def make_column(name: str, type_display: str, pg_type: str, typmod: int, element_type: str | None) -> Column:
    """The column of base type ``pg_type`` (for an array: ``element_type`` is its element's base type)."""
    if element_type is None:
        encoding, spark = _scalar(pg_type, typmod)
        return Column(name, type_display, pg_type, encoding, spark)
    if element_type in _ARRAY_ELEMENTS:
        elem_encoding, elem_spark = _scalar(element_type, typmod)
        if element_type == "numeric" and elem_spark == "string":
            return Column(name, type_display, pg_type, "string", "string")
        if element_type in _STRINGY:
            elem_encoding = "string"
        return Column(name, type_display, pg_type, "array", f"array<{elem_spark}>", elem_encoding)
    return Column(name, type_display, pg_type, "string", "string")


@dataclass(frozen=True)
class TableSchema:
    """What a sink needs to know of a table: its columns in order and its primary key."""

    table: str  # schema.table, unquoted
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @cached_property
    def schema_id(self) -> str:
        """A content hash: the same columns and key always give the same id."""
        body = json.dumps(self._body(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def _body(self) -> dict[str, Any]:
        return {"table": self.table, "columns": [c.to_dict() for c in self.columns], "key": list(self.key)}

    def to_json(self) -> str:
        return json.dumps({**self._body(), "schema_id": self.schema_id}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "TableSchema":
        d = json.loads(text)
        return cls(str(d["table"]), tuple(Column.from_dict(c) for c in d["columns"]), tuple(d["key"]))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def spark_ddl(self) -> str:
        """The row's struct as Spark DDL, for ``from_json(row, ddl)``."""
        return ", ".join(f"`{c.name.replace('`', '``')}` {c.spark_type}" for c in self.columns)

    def arrow_schema(self) -> pa.Schema:
        """The typed Arrow schema of the rows (what :func:`~.decode.decode_rows` returns)."""
        return pa.schema([pa.field(c.name, arrow_type(c.spark_type)) for c in self.columns])


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type of a Spark DDL type of the mapping above."""
    simple: dict[str, pa.DataType] = {
        "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(),
        "double": pa.float64(), "boolean": pa.bool_(), "binary": pa.binary(), "string": pa.string(),
        "date": pa.date32(), "timestamp_ntz": pa.timestamp("us"), "timestamp": pa.timestamp("us", tz="UTC"),
    }
    if spark_type in simple:
        return simple[spark_type]
    if spark_type.startswith("decimal("):
        p, s = spark_type[len("decimal("):-1].split(",")
        return pa.decimal128(int(p), int(s))
    if spark_type.startswith("array<"):
        return pa.list_(arrow_type(spark_type[len("array<"):-1]))
    raise ValueError(f"no Arrow type for Spark type {spark_type!r}")
