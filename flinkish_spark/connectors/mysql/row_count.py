"""Row events counted without decoding their values: the decoder of a range's planning (``change_target``).

The planning reads a whole range to count its changes of followed tables, find its statements and its
transaction boundaries (:mod:`.range_cuts`); it never looks at a value. :class:`RowCounter` is a
:class:`.row_values.RowDecoder` whose :meth:`RowCounter.rows` walks each row image by the columns' sizes only
(fixed widths, or a length prefix) and gives as many rows as the event holds, each without values (``before`` and
``after`` None) -- several times cheaper than making Python values, and the planning runs once per range, in
series with the tasks that read it. What it guarantees: the same number of rows per event as the decoder's. A
walk that does not end exactly at the event's end (a type whose size this module got wrong) falls back to the
full decode of that event, so a count is never a guess; a type it does not know decodes as before.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any, Iterator, Sequence

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql.row_values import DIG2BYTES, ROW_EVENTS, RowDecoder, decode_rows, rows_table_id

_FIXED = {B.TINY: 1, B.SHORT: 2, B.INT24: 3, B.LONG: 4, B.LONGLONG: 8, B.FLOAT: 4, B.DOUBLE: 8, B.DATE: 3,
          B.YEAR: 1}
_UPDATES = (B.UPDATE_ROWS_V1, B.UPDATE_ROWS_V2)


def column_sizes(table: B.TableMap) -> list[int] | None:
    """Per column of ``table``: its width in a row image (> 0), or ``-k`` for a value after a ``k``-byte length
    prefix; None when a column's type is not one this module knows (as :func:`.row_values.compile_readers` reads
    them)."""
    out = []
    for t, meta in zip(table.types, table.meta):
        if t in _FIXED:
            out.append(_FIXED[t])
        elif t == B.NEWDECIMAL:
            precision, scale = meta[0], meta[1]
            whole = precision - scale
            out.append(DIG2BYTES[whole % 9] + 4 * (whole // 9) + 4 * (scale // 9) + DIG2BYTES[scale % 9])
        elif t in (B.VARCHAR, B.VAR_STRING, B.STRING):
            out.append(-(1 if meta[0] < 256 else 2))
        elif t in (B.BLOB, B.GEOMETRY, B.JSON):
            out.append(-meta[0])
        elif t in (B.ENUM, B.SET):
            out.append(meta[0])
        elif t == B.BIT:
            out.append((meta[0] + 7) // 8)
        elif t == B.DATETIME2:
            out.append(5 + (meta[0] + 1) // 2)
        elif t == B.TIMESTAMP2:
            out.append(4 + (meta[0] + 1) // 2)
        elif t == B.TIME2:
            out.append(3 + (meta[0] + 1) // 2)
        else:
            return None
    return out


def count_rows(event: bytes, sizes: list[int]) -> int | None:
    """The rows of a row event, walked by ``sizes`` (:func:`column_sizes`); None when the walk does not end exactly
    at the event's end."""
    kind = event[4]
    pos = B.HEADER_SIZE + 8
    if kind >= B.WRITE_ROWS_V2:
        pos += struct.unpack_from("<H", event, pos)[0]
    count, pos = B.lenenc(event, pos)
    width = (count + 7) // 8
    bitmaps = [event[pos:pos + width]]
    pos += width
    if kind in _UPDATES:
        bitmaps.append(event[pos:pos + width])
        pos += width
    images = [[sizes[i] for i in range(count) if bits[i >> 3] >> (i & 7) & 1] for bits in bitmaps]
    end, rows = len(event), 0
    widths = [(len(columns) + 7) // 8 for columns in images]
    try:
        while pos < end:
            for columns, nulls_width in zip(images, widths):
                pos = image_end(event, pos, columns, nulls_width)
            rows += 1
    except IndexError:
        return None
    return rows if pos == end else None


def image_end(event: bytes, pos: int, sizes: Sequence[int], nulls_width: int) -> int:
    """Where the row image at ``pos`` ends: its NULL bitmap (``nulls_width`` bytes), then each present column not
    NULL -- ``sizes`` per present column, > 0 a fixed size, < 0 a length prefix of -size bytes. May raise
    IndexError on a cut image."""
    nulls = event[pos:pos + nulls_width]
    pos += nulls_width
    for k, size in enumerate(sizes):
        if nulls[k >> 3] >> (k & 7) & 1:
            continue
        if size > 0:
            pos += size
        else:
            pos += -size + int.from_bytes(event[pos:pos - size], "little")
    return pos


class RowCounter(RowDecoder):
    """A :class:`.row_values.RowDecoder` whose rows carry no values (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # table id -> (its latest table map, that map's column sizes): the decoder hands back the same map object for
        # the same map bytes, so the sizes are worked out once per distinct map, not per transaction
        self._sizes: dict[int, tuple[B.TableMap, list[int] | None]] = {}

    def table_map(self, event: bytes) -> B.TableMap:
        table = super().table_map(event)
        known = self._sizes.get(table.table_id)
        if known is None or known[0] is not table:
            self._sizes[table.table_id] = (table, column_sizes(table))
        return table

    def rows(self, event: bytes) -> tuple[B.TableMap, Iterator[tuple[str, list[Any] | None, list[Any] | None]]]:
        table, readers = self._by_id[rows_table_id(event)]
        known = self._sizes.get(table.table_id)
        sizes = None if known is None else known[1]
        n = None if sizes is None else count_rows(event, sizes)
        if n is None:
            return table, decode_rows(event, readers)
        return table, itertools.repeat((ROW_EVENTS[event[4]], None, None), n)
