"""MySQL 8's binary JSON (a JSON column's value in the binary log) -> JSON text, as MySQL itself prints it.

MariaDB stores JSON as LONGTEXT, so its log carries text and never this format; MySQL 5.7+ stores and logs
the binary form of ``sql/json_binary.h`` (MySQL's source, "JSON binary format"), which this module reads::

    doc           ::= type value
    type          ::= 0x00 small object | 0x01 large object | 0x02 small array | 0x03 large array
                    | 0x04 literal | 0x05 int16 | 0x06 uint16 | 0x07 int32 | 0x08 uint32 | 0x09 int64
                    | 0x0a uint64 | 0x0b double | 0x0c string | 0x0f custom (opaque)
    object        ::= element-count size key-entry* value-entry* key* value*
    array         ::= element-count size value-entry* value*
    element-count, size, key-offset, value offsets ::= uint16 (small) | uint32 (large), little-endian,
                    offsets from the start of the object/array (its element-count)
    key-entry     ::= key-offset key-length(uint16)
    value-entry   ::= type offset-or-inlined-value  (literals and [u]int16 inlined; [u]int32 too when large)
    string        ::= data-length utf8mb4-data ; data-length: 7 bits a byte, high bit = more bytes follow
    custom        ::= field-type(uint8) data-length data

Output: ``{"a": 1, "b": [true, null]}`` (MySQL's separators ``, `` and ``: ``; members in stored order,
which is MySQL's key order: by length, then bytes). Custom values: DECIMAL as its number, DATE/TIME/
DATETIME/TIMESTAMP as quoted text (``"2024-02-29 23:59:59.123456"``), any other as
``"base64:type<N>:<base64>"``, as MySQL prints them. Not read: the partial JSON updates of
``binlog_row_value_options=PARTIAL_JSON`` (the change reader refuses them).
"""

from __future__ import annotations

import base64
import json
import struct

from flinkish_spark.errors import ChangeDataError

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY, LITERAL = 0x00, 0x01, 0x02, 0x03, 0x04
INT16, UINT16, INT32, UINT32, INT64, UINT64 = 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A
DOUBLE, STRING, OPAQUE = 0x0B, 0x0C, 0x0F
_FIXED = {INT16: struct.Struct("<h"), UINT16: struct.Struct("<H"), INT32: struct.Struct("<i"),
          UINT32: struct.Struct("<I"), INT64: struct.Struct("<q"), UINT64: struct.Struct("<Q"),
          DOUBLE: struct.Struct("<d")}
# MySQL field types of custom values that it prints as numbers or quoted temporal text.
_NEWDECIMAL, _DATE, _TIME, _DATETIME, _TIMESTAMP, _TIMESTAMP2, _DATETIME2, _TIME2 = 246, 10, 11, 12, 7, 17, 18, 19


def to_text(data: bytes) -> str:
    """The JSON text of one binary JSON document (an empty value is JSON ``null``, as MySQL reads it)."""
    if not data:
        return "null"
    try:
        return _value(data, data[0], 1, len(data))
    except (IndexError, struct.error, UnicodeDecodeError, ValueError) as e:
        raise ChangeDataError(f"a binary JSON value the decoder cannot read ({type(e).__name__}: {e}); "
                              f"first bytes {data[:16].hex()}") from None


def _length(data: bytes, pos: int) -> tuple[int, int]:
    """A data-length (7 bits a byte, least significant first): (value, position after it)."""
    n, shift = 0, 0
    while True:
        b = data[pos]
        n |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return n, pos
        shift += 7
        if shift > 28:
            raise ValueError("a data length of more than 5 bytes")


def _double(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError("a JSON double that is not a number")
    text = repr(v)
    return text.replace("e+", "e")  # MySQL prints 1e20, Python 1e+20


def _value(data: bytes, kind: int, pos: int, end: int) -> str:
    """The value of type ``kind`` whose bytes start at ``pos``."""
    if kind in (SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY):
        return _container(data, kind, pos)
    if kind == LITERAL:
        return _literal(data[pos])
    if kind in _FIXED:
        v = _FIXED[kind].unpack_from(data, pos)[0]
        return _double(v) if kind == DOUBLE else str(v)
    if kind == STRING:
        n, p = _length(data, pos)
        return json.dumps(data[p:p + n].decode("utf-8"), ensure_ascii=False)
    if kind == OPAQUE:
        field_type = data[pos]
        n, p = _length(data, pos + 1)
        return _opaque(field_type, data[p:p + n])
    raise ValueError(f"JSON value type {kind:#04x}")


def _literal(b: int) -> str:
    if b > 2:
        raise ValueError(f"JSON literal {b}")
    return ("null", "true", "false")[b]


def _container(data: bytes, kind: int, base: int) -> str:
    large = kind in (LARGE_OBJECT, LARGE_ARRAY)
    word = struct.Struct("<I" if large else "<H")
    w = word.size
    count = word.unpack_from(data, base)[0]
    p = base + 2 * w  # after element-count and size
    keys: list[str] = []
    if kind in (SMALL_OBJECT, LARGE_OBJECT):
        for _ in range(count):
            key_offset = word.unpack_from(data, p)[0]
            key_len = struct.unpack_from("<H", data, p + w)[0]
            keys.append(json.dumps(data[base + key_offset:base + key_offset + key_len].decode("utf-8"),
                                   ensure_ascii=False))
            p += w + 2
    values = []
    for _ in range(count):
        t = data[p]
        if t == LITERAL:
            values.append(_literal(data[p + 1]))
        elif t in (INT16, UINT16) or (large and t in (INT32, UINT32)):
            values.append(str(_FIXED[t].unpack_from(data, p + 1)[0]))
        else:
            offset = word.unpack_from(data, p + 1)[0]
            values.append(_value(data, t, base + offset, len(data)))
        p += 1 + w
    if keys:
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, values)) + "}"
    return ("{}" if kind in (SMALL_OBJECT, LARGE_OBJECT) else "[" + ", ".join(values) + "]")


def _opaque(field_type: int, raw: bytes) -> str:
    if field_type == _NEWDECIMAL:
        from flinkish_spark.connectors.mysql.row_values import _decimal

        value, _ = _decimal(raw[0], raw[1])(raw, 2)
        return str(value)
    if field_type in (_DATE, _DATETIME, _TIMESTAMP, _DATETIME2, _TIMESTAMP2, _TIME, _TIME2):
        packed = struct.unpack_from("<q", raw, 0)[0]
        if field_type in (_TIME, _TIME2):
            return json.dumps(_time_text(packed))
        return json.dumps(_datetime_text(packed, date_only=field_type == _DATE))
    return json.dumps(f"base64:type{field_type}:{base64.b64encode(raw).decode()}")


def _datetime_text(packed: int, date_only: bool) -> str:
    """MySQL's packed datetime (``TIME_to_longlong_datetime_packed``): ymd << 17 | hms, shifted 24, plus micros."""
    if packed < 0:
        raise ValueError("a negative packed datetime")
    micro = packed % (1 << 24)
    ymdhms = packed >> 24
    ymd, hms = ymdhms >> 17, ymdhms % (1 << 17)
    year, month = divmod(ymd >> 5, 13)
    day = ymd % 32
    if date_only:
        return f"{year:04d}-{month:02d}-{day:02d}"
    return (f"{year:04d}-{month:02d}-{day:02d} {hms >> 12:02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}"
            f".{micro:06d}")


def _time_text(packed: int) -> str:
    sign, packed = ("-", -packed) if packed < 0 else ("", packed)
    micro, hms = packed % (1 << 24), packed >> 24
    return f"{sign}{(hms >> 12) % 1024:02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}.{micro:06d}"
