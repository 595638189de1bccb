"""A run of row images (:mod:`.row_images`) cut into the typed Arrow columns of a pack, column by column with numpy.

:mod:`.packed_changes` made each column of a pack from the decoder's Python values (``pa.array`` of ``Decimal``\\ s,
``datetime``\\ s...). Here the images of a run are joined into one buffer and every column is cut out of all of them
at once, as :mod:`.row_packets` cuts a snapshot's text rows: the NULL bit of each image, each value's position (a
fixed width, or after a length prefix), the values gathered and made the column's Arrow type by arithmetic. What it
guarantees: **the column that** :func:`.packed_changes.typed_values` **makes of the decoder's values**, value for
value (tests/connectors/mysql/test_image_columns.py compares both on every type):

* cut directly: integers (not BIGINT UNSIGNED), FLOAT, DOUBLE, DECIMAL up to 18 digits, DATE, DATETIME, TIMESTAMP,
  YEAR, and strings in UTF-8 (``utf8mb4``/``utf8mb3``) or binary (not ``BINARY(n)``, which the decoder pads);
  zero dates are NULL, as the decoder makes them;
* every other column -- and a directly cut one whose values the decoder would not take (invalid UTF-8, a date
  Python refuses, a DECIMAL group out of range) -- gets the decoder's values (its readers, at each value's
  position) and :func:`.packed_changes.typed_values`, so it fails or falls back exactly as before;
* a walk of the images that does not end where each image ends gives None: the caller decodes the values instead.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql.row_images import Layout, RowImage
from flinkish_spark.connectors.mysql.row_packets import _binary
from flinkish_spark.connectors.mysql.row_values import _FRAC_MULT, DIG2BYTES
from flinkish_spark.connectors.postgres.rows.schema import Column

Typed = Callable[[Sequence[Any], Column, pa.DataType], pa.Array]  # packed_changes.typed_values
_INTS = {B.TINY: 1, B.SHORT: 2, B.INT24: 3, B.LONG: 4, B.LONGLONG: 8}
_UTF8 = "utf-8"
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int64)
_US_PER_DAY = 86_400_000_000


class _Refused(Exception):
    """A directly cut column whose values the decoder would not give as they are: read the decoder's way."""


def image_columns(images: list[RowImage], columns: Sequence[Column], target: pa.Schema,
                  typed: Typed) -> list[pa.Array] | None:
    """The pack's columns of ``images`` (a run: one schema, images of one or more table maps), in their order."""
    first = images[0].layout
    if all(im.layout is first for im in images):
        return _cut(images, first, columns, target, typed)
    groups: dict[int, list[int]] = {}
    for r, im in enumerate(images):
        groups.setdefault(id(im.layout), []).append(r)
    parts, order = [], []
    for rows in groups.values():
        part = _cut([images[r] for r in rows], images[rows[0]].layout, columns, target, typed)
        if part is None:
            return None
        parts.append(part)
        order.extend(rows)
    back = np.empty(len(images), np.int64)
    back[np.array(order, np.int64)] = np.arange(len(images))
    take = pa.array(back)
    return [pa.concat_arrays([p[k] for p in parts]).take(take) for k in range(len(columns))]


def _cut(images: list[RowImage], layout: Layout, columns: Sequence[Column], target: pa.Schema,
         typed: Typed) -> list[pa.Array] | None:
    parts, starts, at = [], [], 0
    for im in images:
        parts.append(im.event[im.start:im.end])
        starts.append(at)
        at += im.end - im.start
    buf = b"".join(parts)
    data = np.frombuffer(buf, np.uint8)
    row = np.array(starts, np.int64)
    ends = np.append(row[1:], at)
    last = max(len(data) - 1, 0)
    pos = row + layout.nulls_width
    out = []
    for k, size in enumerate(layout.sizes):
        bits = ((data[row + (k >> 3)] >> (k & 7)) & 1).astype(bool)
        null = bits if bits.any() else None
        if size > 0:
            lengths, value_pos = None, pos
            step: Any = size if null is None else np.where(null, 0, size)
        else:
            lengths = _little(data, pos, -size, last)
            if null is not None:
                lengths[null] = 0
            value_pos = pos + -size
            step = -size + lengths
            if null is not None:
                step = np.where(null, 0, step)
        out.append(_column(layout, k, data, buf, pos, value_pos, lengths, null, last, columns[k],
                           target.field(k).type, typed))
        pos = pos + step
    return out if np.array_equal(pos, ends) else None


def _little(data: np.ndarray, pos: np.ndarray, width: int, last: int) -> np.ndarray:
    value = np.zeros(len(pos), np.int64)
    for b in range(width):
        value |= data[np.minimum(pos + b, last)].astype(np.int64) << (8 * b)
    return value


def _bytes(data: np.ndarray, pos: np.ndarray, width: int, last: int) -> np.ndarray:
    """The ``width`` bytes at each position, as an (n, width) matrix (a NULL's position may be the buffer's end)."""
    return data[np.minimum(pos[:, None] + np.arange(width), last)]


def _big(matrix: np.ndarray) -> np.ndarray:
    value = np.zeros(len(matrix), np.int64)
    for b in range(matrix.shape[1]):
        value = (value << 8) | matrix[:, b].astype(np.int64)
    return value


def _column(layout: Layout, k: int, data: np.ndarray, buf: bytes, pos: np.ndarray, value_pos: np.ndarray,
            lengths: np.ndarray | None, null: np.ndarray | None, last: int, col: Column, want: pa.DataType,
            typed: Typed) -> pa.Array:
    table = layout.table
    t, meta = table.types[k], table.meta[k]
    try:
        arr = _direct(t, meta, bool(table.unsigned and table.unsigned[k]), layout.codecs[k],
                      k in layout.text_types, data, value_pos, lengths, null, last)
        if arr is not None:
            return arr if arr.type == want else arr.cast(want)
    except (_Refused, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    read = layout.readers[k]
    nulls = [False] * len(pos) if null is None else null.tolist()
    values = [None if n else read(buf, p)[0] for p, n in zip(pos.tolist(), nulls)]
    return typed(values, col, want)


def _direct(t: int, meta: tuple[int, ...], unsigned: bool, codec: str | None, text: bool, data: np.ndarray,
            pos: np.ndarray, lengths: np.ndarray | None, null: np.ndarray | None, last: int) -> pa.Array | None:
    """The column cut directly, or None: the decoder's way (see the module docstring)."""
    n = len(pos)
    if t in _INTS:
        width = _INTS[t]
        if t == B.LONGLONG and unsigned:
            return None
        m = _bytes(data, pos, width, last)
        if width == 3:
            v = m[:, 0].astype(np.int32) | m[:, 1].astype(np.int32) << 8 | m[:, 2].astype(np.int32) << 16
            if not unsigned:
                v = np.where(v >= 1 << 23, v - (1 << 24), v)
        else:
            v = m.view(f"<{'u' if unsigned else 'i'}{width}").reshape(n)
        return pa.array(v, mask=null)
    if t in (B.FLOAT, B.DOUBLE):
        width = 4 if t == B.FLOAT else 8
        return pa.array(_bytes(data, pos, width, last).view(f"<f{width}").reshape(n), mask=null)
    if t in (B.VARCHAR, B.VAR_STRING, B.STRING, B.BLOB) and not text and lengths is not None:
        if codec not in (None, _UTF8) or (t == B.STRING and codec is None):
            return None  # another character set; BINARY(n), padded back to n bytes by the decoder
        arr = _binary(data, pos, lengths, None if null is None else ~null)
        return arr.cast(pa.string()) if codec == _UTF8 else arr
    if t == B.NEWDECIMAL and meta[0] <= 18:
        return _decimal(meta[0], meta[1], data, pos, null, last)
    if t == B.YEAR:
        v = data[np.minimum(pos, last)].astype(np.int16)
        return pa.array(np.where(v == 0, 0, v + 1900).astype(np.int16), mask=null)
    if t == B.DATE:
        v = _little(data, pos, 3, last)
        year, month, day = v >> 9, (v >> 5) & 15, v & 31
        zero = (year == 0) | (month == 0) | (day == 0)
        null = _valid_dates(year, month, day, zero, null)
        days = np.where(null, 0, _civil_days(year, month, day))
        return pa.array(days.astype(np.int32), mask=null).view(pa.date32())
    if t == B.DATETIME2:
        fb = (meta[0] + 1) // 2
        v = _big(_bytes(data, pos, 5, last)) - 0x8000000000
        ym, day = (v >> 22) & 0x1FFFF, (v >> 17) & 0x1F
        year, month = ym // 13, ym % 13
        zero = (year == 0) | (month == 0) | (day == 0)
        hour, minute, second = (v >> 12) & 0x1F, (v >> 6) & 0x3F, v & 0x3F
        micro = _fraction(data, pos + 5, fb, last)
        bad = (hour > 23) | (minute > 59) | (second > 59) | (micro > 999_999)
        null = _valid_dates(year, month, day, zero, null, bad)
        us = (_civil_days(year, month, day) * _US_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1_000_000
              + micro)
        return pa.array(np.where(null, 0, us), mask=null).view(pa.timestamp("us"))
    if t == B.TIMESTAMP2:
        fb = (meta[0] + 1) // 2
        seconds = _big(_bytes(data, pos, 4, last))
        micro = _fraction(data, pos + 4, fb, last)
        zero = (seconds == 0) & (micro == 0)
        live = ~zero if null is None else ~(zero | null)
        if bool((micro[live] > 999_999).any()):
            raise _Refused()
        null = ~live
        return pa.array(np.where(null, 0, seconds * 1_000_000 + micro), mask=null).view(pa.timestamp("us", "UTC"))
    return None


def _fraction(data: np.ndarray, pos: np.ndarray, fb: int, last: int) -> np.ndarray:
    if not fb:
        return np.zeros(len(pos), np.int64)
    return _big(_bytes(data, pos, fb, last)) * _FRAC_MULT[fb]


def _valid_dates(year: np.ndarray, month: np.ndarray, day: np.ndarray, zero: np.ndarray, null: np.ndarray | None,
                 bad: np.ndarray | None = None) -> np.ndarray:
    """The NULLs of a date column (NULL or a zero date); raises :class:`_Refused` for a date Python refuses."""
    null = zero if null is None else (zero | null)
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    days = _MONTH_DAYS[np.clip(month - 1, 0, 11)] + ((month == 2) & leap)
    wrong = (year > 9999) | (month > 12) | (day > days)
    if bad is not None:
        wrong |= bad
    if bool((wrong & ~null).any()):
        raise _Refused()
    return null


def _civil_days(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (years >= 1; H. Hinnant's ``days_from_civil``)."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _decimal(precision: int, scale: int, data: np.ndarray, pos: np.ndarray, null: np.ndarray | None,
             last: int) -> pa.Array:
    """MySQL's decimal binary (see :func:`.row_values._decimal`) of up to 18 digits: the unscaled value in an int64,
    made a decimal128 column."""
    ip = precision - scale
    widths = [(w, d) for w, d in [(DIG2BYTES[ip % 9], ip % 9)] + [(4, 9)] * (ip // 9) + [(4, 9)] * (scale // 9)
              + [(DIG2BYTES[scale % 9], scale % 9)] if w]
    size = sum(w for w, _ in widths)
    m = _bytes(data, pos, size, last).copy()
    negative = (m[:, 0] & 0x80) == 0
    m[:, 0] ^= 0x80
    m[negative] ^= 0xFF
    total = np.zeros(len(pos), np.int64)
    at = 0
    for w, digits in widths:
        group = _big(m[:, at:at + w])
        if null is None and bool((group >= 10 ** digits).any()) or null is not None and bool(
                (group[~null] >= 10 ** digits).any()):
            raise _Refused()
        total = total * 10 ** digits + group
        at += w
    value = np.where(negative, -total, total)
    if null is not None:
        value[null] = 0
    words = np.empty((len(pos), 2), np.int64)
    words[:, 0] = value
    words[:, 1] = value >> 63
    bitmap = None if null is None else pa.py_buffer(np.packbits(~null, bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.decimal128(precision, scale), len(pos), [bitmap, pa.py_buffer(words.tobytes())],
                                 null_count=0 if null is None else int(null.sum()))
