"""Writing a row as JSON: from pgoutput's text values (changes, in Python) and in SQL (snapshot chunks, on the server).

Both paths produce the same text for the same value, byte for byte, because both start from
PostgreSQL's own text output of the value (pgoutput sends it; the snapshot query casts
``::text``) under the same session settings (:data:`SESSION_SETTINGS`), and apply the same
rules of :mod:`.schema` to it. ``tests/connectors/postgres/test_rows.py`` checks it value by value.
"""

from __future__ import annotations

import base64
import json
from typing import Callable, Sequence

from flinkish_spark.connectors.postgres.rows.schema import Column, Encoding, TableSchema

#: Settings of every session whose text output ends up in rows (the peek, the chunk reads):
#: the text of dates, timestamps, intervals, floats and bytea depends on them.
SESSION_SETTINGS = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",  # shortest exact text (PostgreSQL 12+), all digits before that
    "bytea_output": "hex",
}


def session_settings_sql() -> list[str]:
    """The ``SET`` statements of :data:`SESSION_SETTINGS`, for a connection that reads rows."""
    return [f"SET {k} = '{v}'" for k, v in SESSION_SETTINGS.items()]


_NON_FINITE = ("NaN", "Infinity", "-Infinity")


#: ``json.dumps(v, ensure_ascii=False)`` of a string is exactly this function of the json module (C code), without the
#: encoder object dumps builds per call.
_encode_basestring: Callable[[str], str] = json.encoder.encode_basestring


def _json_string(v: str) -> str:
    return _encode_basestring(v)


def _bytea_base64(v: str) -> str:
    return '"' + base64.b64encode(bytes.fromhex(v[2:])).decode("ascii") + '"'


def _bool(v: str) -> str:
    return "true" if v == "t" else "false"


def _identity(v: str) -> str:
    return v


def value_encoder(column: Column) -> Callable[[str], str]:
    """A function from the value's PostgreSQL text to its JSON text (never called for null)."""
    if column.encoding == "number":
        return _identity  # PostgreSQL's text of a number is its JSON text (NaN/Infinity: bare tokens)
    if column.encoding == "bool":
        return _bool
    if column.encoding == "base64":
        return _bytea_base64
    if column.encoding == "array":
        element = _element_encoder(column.element or "string")
        return lambda v: _array_json(v, element)
    return _json_string


def _element_encoder(encoding: Encoding) -> Callable[[str], str]:
    if encoding == "number":
        return _identity
    if encoding == "bool":
        return _bool
    return _json_string


def _array_json(text: str, element: Callable[[str], str]) -> str:
    """``{1,NULL,"a b"}`` (PostgreSQL's array text) as ``[1,null,"a b"]``; nested braces nest."""
    if text.startswith("["):  # dimension decoration of a lower bound other than 1: '[0:2]={...}'
        text = text[text.index("=") + 1:]
    out: list[str] = []
    i, n = 0, len(text)
    first = True
    while i < n:
        ch = text[i]
        if ch == "{":
            if not first:
                out.append(",")
            out.append("[")
            first = True
            i += 1
        elif ch == "}":
            out.append("]")
            first = False
            i += 1
        elif ch == ",":
            i += 1
        else:
            if ch == '"':
                j, buf = i + 1, []
                while text[j] != '"':
                    if text[j] == "\\":
                        j += 1
                    buf.append(text[j])
                    j += 1
                value: str | None = "".join(buf)
                i = j + 1
            else:
                j = i
                while j < n and text[j] not in ",}":
                    j += 1
                raw = text[i:j]
                value = None if raw == "NULL" else raw
                i = j
            if not first:
                out.append(",")
            out.append("null" if value is None else element(value))
            first = False
    return "".join(out)


#: The field of a change row's JSON object that lists the columns the change did not carry (an update that left
#: a TOASTed value unchanged: the server does not send it). No column can have this name (PostgreSQL's names hold
#: no NUL), Spark's ``from_json`` and the rows' decoder ignore it as a value; :func:`..decode.split_tables` turns
#: it into the ``_unchanged`` column. The row holds no value for those columns.
UNCHANGED_FIELD = "\x00unchanged"
_UNCHANGED_PREFIX = json.dumps(UNCHANGED_FIELD) + ":"


class RowEncoder:
    """Encodes the text values of one schema's rows (changes) as JSON objects."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self._prefixes = {c.name: _json_string(c.name) + ":" for c in schema.columns}
        self._encoders = {c.name: value_encoder(c) for c in schema.columns}

    def encode(self, values: dict[str, object], names: Sequence[str] | None = None,
               unchanged: Sequence[str] = ()) -> str:
        """The JSON object of ``values`` (text or None by column name), columns in ``names`` (default: all);
        ``unchanged``: columns the change did not carry, left out and listed in :data:`UNCHANGED_FIELD`."""
        parts = []
        for name in names if names is not None else self.schema.names:
            if name in unchanged:
                continue
            v = values.get(name)
            parts.append(self._prefixes[name] + ("null" if v is None else self._encoders[name](v)))  # type: ignore[arg-type]
        if unchanged:
            parts.append(_UNCHANGED_PREFIX + json.dumps(list(unchanged), ensure_ascii=False))
        return "{" + ",".join(parts) + "}"

    def compile(self, columns: Sequence[str], names: Sequence[str] | None = None) -> Callable[[tuple[object, ...]], str]:
        """:meth:`encode` for values as a tuple in the order of ``columns`` (a Relation's), chosen once per
        relation: ``compile(columns, names)(values) == encode(dict(zip(columns, values)), names)`` for values
        without an unchanged TOASTed one. A column of ``names`` that ``columns`` lacks is null, as in encode."""
        index = {n: i for i, n in enumerate(columns)}
        missing = len(columns)  # the position of the None appended for columns the values lack
        plan = [(self._prefixes[n], self._encoders[n], index.get(n, missing))
                for n in (names if names is not None else self.schema.names)]
        pad = (None,) if any(i == missing for _, _, i in plan) else ()

        def encode(values: tuple[object, ...]) -> str:
            if pad:
                values = values + pad
            return "{" + ",".join([p + ("null" if (v := values[i]) is None else enc(v))  # type: ignore[arg-type]
                                   for p, enc, i in plan]) + "}"

        return encode


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def column_sql(column: Column) -> str:
    """The SQL expression (text, never null) of ``column``'s JSON value, as :func:`value_encoder` writes it."""
    c = _quote_ident(column.name)
    if column.encoding == "number":
        expr = f"{c}::text"
    elif column.encoding == "bool":
        expr = f"CASE WHEN {c} THEN 'true' WHEN NOT {c} THEN 'false' END"
    elif column.encoding == "base64":
        expr = f"to_json(translate(encode({c}, 'base64'), E'\\n', ''))::text"
    elif column.encoding == "array":
        expr = f"to_json({c})::text"
        if column.element == "number":
            # to_json quotes NaN and infinities; rows carry them as bare tokens (arrays of numbers hold no other strings).
            for token in _NON_FINITE:
                expr = f"replace({expr}, {_sql_literal(json.dumps(token))}, {_sql_literal(token)})"
    elif column.pg_type == "bpchar":
        expr = f"to_json(bpcharout({c})::text)::text"  # ::text would drop the padding that pgoutput keeps
    else:
        expr = f"to_json({c}::text)::text"
    return f"coalesce({expr}, 'null')"


def row_sql(schema: TableSchema) -> str:
    """The SQL expression of the whole JSON row (the snapshot reads ``SELECT <this> FROM table``)."""
    parts = []
    for i, col in enumerate(schema.columns):
        key = ("{" if i == 0 else ",") + _json_string(col.name) + ":"
        parts.append(f"{_sql_literal(key)} || {column_sql(col)}")
    if not parts:
        return "'{}'"
    return " || ".join(parts) + " || '}'"
