"""MySQL 8's binary JSON -> JSON text. MariaDB stores JSON as LONGTEXT (its log holds text), so no server of the
tests writes this format: the documents here are built byte by byte by the encoder below, written from MySQL's
format description (sql/json_binary.h), not from the decoder."""

from __future__ import annotations

import json
import struct
from decimal import Decimal
from typing import Any

import pytest

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql import json_binary
from flinkish_spark.connectors.mysql.row_values import compile_readers
from flinkish_spark.errors import ChangeDataError


class Opaque:
    def __init__(self, field_type: int, data: bytes) -> None:
        self.field_type, self.data = field_type, data


def _varlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(value: Any, large: bool = False) -> bytes:
    """A whole document: type byte + value."""
    t, body = _encode(value, large)
    return bytes([t]) + body


def _scalar_type(value: Any) -> int:
    if isinstance(value, bool) or value is None:
        return 0x04
    if isinstance(value, int):
        if -2**15 <= value < 2**15:
            return 0x05
        if 0 <= value < 2**16:
            return 0x06
        if -2**31 <= value < 2**31:
            return 0x07
        if 0 <= value < 2**32:
            return 0x08
        return 0x09 if value < 2**63 else 0x0A
    if isinstance(value, float):
        return 0x0B
    if isinstance(value, str):
        return 0x0C
    if isinstance(value, Opaque):
        return 0x0F
    return (0x01 if isinstance(value, dict) else 0x03)  # containers: resolved in _encode


def _encode(value: Any, large: bool) -> tuple[int, bytes]:
    if isinstance(value, (dict, list)):
        return _container(value, large)
    t = _scalar_type(value)
    if t == 0x04:
        return t, bytes([{None: 0, True: 1, False: 2}[value]])
    fmt = {0x05: "<h", 0x06: "<H", 0x07: "<i", 0x08: "<I", 0x09: "<q", 0x0A: "<Q", 0x0B: "<d"}
    if t in fmt:
        return t, struct.pack(fmt[t], value)
    if t == 0x0C:
        raw = value.encode()
        return t, _varlen(len(raw)) + raw
    return t, bytes([value.field_type]) + _varlen(len(value.data)) + value.data


def _container(value: dict[str, Any] | list[Any], large: bool) -> tuple[int, bytes]:
    w = 4 if large else 2
    word = "<I" if large else "<H"
    is_obj = isinstance(value, dict)
    items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
    n = len(items)
    header = 2 * w + (n * (w + 2) if is_obj else 0) + n * (1 + w)
    keys = b""
    key_entries = b""
    for k, _ in items:
        if k is not None:
            raw = k.encode()
            key_entries += struct.pack(word, header + len(keys)) + struct.pack("<H", len(raw))
            keys += raw
    values = b""
    value_entries = b""
    start = header + len(keys)
    for _, v in items:
        t, body = _encode(v, large)
        inline = t == 0x04 or t in (0x05, 0x06) or (large and t in (0x07, 0x08))
        if inline:
            value_entries += bytes([t]) + (body + bytes(w))[:w]
        else:
            value_entries += bytes([t]) + struct.pack(word, start + len(values))
            values += body
    body = key_entries + value_entries + keys + values
    size = 2 * w + len(body)
    t = (0x01 if large else 0x00) if is_obj else (0x03 if large else 0x02)
    return t, struct.pack(word, n) + struct.pack(word, size) + body


def _decimal_bytes(text: str, precision: int, scale: int) -> bytes:
    """MySQL's decimal binary (decimal2bin) for a non-negative value with whole 9-digit groups only."""
    assert precision - scale == 9 and scale == 9
    integer, frac = text.split(".")
    raw = bytearray(struct.pack(">I", int(integer)) + struct.pack(">I", int(frac)))
    raw[0] |= 0x80
    return bytes([precision, scale]) + bytes(raw)


def _packed_datetime(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int) -> bytes:
    ymd = ((y * 13 + mo) << 5) | d
    hms = (h << 12) | (mi << 6) | s
    return struct.pack("<q", (((ymd << 17) | hms) << 24) + us)


DOC = {"a": 1, "bb": [True, False, None, -5, 70000, -70000, 2**40, 2**64 - 1, 1.5, 1e20],
       "ccc": {"nested": "ünïcode \"quoted\"\n", "empty": [], "o": {}}, "long": "x" * 300}


@pytest.mark.parametrize("large", [False, True])
def test_documents_built_per_the_format_read_as_the_json_mysql_prints(large: bool) -> None:
    text = json_binary.to_text(encode(DOC, large))
    assert json.loads(text) == DOC
    assert text.startswith('{"a": 1, "bb": [true, false, null, -5, 70000, -70000, 1099511627776, '
                           '18446744073709551615, 1.5, 1e20], "ccc": {"nested": "ünïcode \\"quoted\\"\\n", '
                           '"empty": [], "o": {}}, "long": "xxx')


def test_scalars_at_the_top_and_custom_values() -> None:
    assert [json_binary.to_text(encode(v)) for v in (None, True, 7, 2**31, -2**40, "", 0.25)] == \
        ["null", "true", "7", "2147483648", "-1099511627776", '""', "0.25"]
    assert json_binary.to_text(b"") == "null"
    decimal = Opaque(246, _decimal_bytes("123456789.000000001", 18, 9))
    dt = Opaque(12, _packed_datetime(2024, 2, 29, 23, 59, 58, 123456))
    date = Opaque(10, _packed_datetime(2024, 2, 29, 0, 0, 0, 0))
    time = Opaque(11, struct.pack("<q", -(((838 << 12) | (59 << 6) | 59) << 24)))
    blob = Opaque(252, b"\x00\x01")
    assert json_binary.to_text(encode([decimal, dt, date, time, blob])) == (
        '[123456789.000000001, "2024-02-29 23:59:58.123456", "2024-02-29", "-838:59:59.000000", '
        '"base64:type252:AAE="]')
    assert json.loads(json_binary.to_text(encode(decimal)), parse_float=Decimal) == Decimal("123456789.000000001")


def test_a_json_column_of_a_row_event_and_a_damaged_value() -> None:
    table = B.TableMap(1, "d", "t", (B.JSON,), ((4,),), (True,), names=("j",))
    (reader,) = compile_readers(table, {})
    doc = encode({"k": [1, 2]})
    value, end = reader(struct.pack("<I", len(doc)) + doc + b"tail", 0)
    assert value == '{"k": [1, 2]}' and end == 4 + len(doc)
    with pytest.raises(ChangeDataError, match="binary JSON value the decoder cannot read"):
        json_binary.to_text(b"\x00\x05\x00")  # an object cut short
