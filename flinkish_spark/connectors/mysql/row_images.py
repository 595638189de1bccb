"""Row events as row images -- where each row's bytes are in its event -- instead of Python values: the decoder of
``rowFormat=arrow``'s change reads.

:class:`.row_values.RowDecoder` makes a Python value of every column of every row (a ``Decimal``, a ``datetime``...)
which the packed shape then turns into Arrow columns again: ~10 us a change of a six-column table, most of a change
task's CPU (docs/benchmarks.md, "MySQL change tasks"). :class:`ImageDecoder` gives each row of a row event as a
:class:`RowImage` instead -- the event's bytes, where the image starts and ends, and the table map's
:class:`Layout` -- found by walking the image by its columns' sizes only (:func:`.row_count.column_sizes`); the
packed shape then cuts every column of a run of images out at once (:mod:`.image_columns`, numpy). What it
guarantees:

* **The decoder's rows**: as many rows per event as :class:`.row_values.RowDecoder` gives, in order, with the same
  ``op``; a :class:`RowImage`'s :meth:`~RowImage.values` are that decoder's values for the row (its readers, the
  same code), and ``image[i]`` is one of them (an update's key comparison).
* Images only where a walk is certain: every column present in the image (``binlog_row_image=FULL``), a type
  :func:`.row_count.column_sizes` knows, and a walk that ends exactly at the event's end. Any other event gives
  the decoder's value lists, as before.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Iterator, Mapping

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql.row_count import column_sizes
from flinkish_spark.connectors.mysql.row_values import CODECS, ROW_EVENTS, Reader, RowDecoder, decode_rows

_UPDATES = (B.UPDATE_ROWS_V1, B.UPDATE_ROWS_V2)
_V2 = B.WRITE_ROWS_V2
_U16 = struct.Struct("<H").unpack_from
Rows = Iterator[tuple[str, Any, Any]]


class Layout:
    """A table map's columns as a row image holds them (all present): what a walk and a column cut need."""

    __slots__ = ("table", "readers", "sizes", "codecs", "count", "bitmap", "nulls_width", "segments", "text_types")

    def __init__(self, table: B.TableMap, readers: list[Reader], sizes: list[int], charsets: Mapping[int, str],
                 text_types: Mapping[int, str]) -> None:
        self.table, self.readers, self.sizes = table, readers, sizes
        # per column: its Python codec, None for binary (as compile_readers picks it)
        names = [charsets.get(table.collations.get(i, 63), "binary") for i in range(len(sizes))]
        self.codecs = tuple(None if name == "binary" else CODECS.get(name) for name in names)
        self.count = len(sizes)
        self.bitmap = bytes([0xFF] * (self.count // 8) + ([(1 << (self.count % 8)) - 1] if self.count % 8 else []))
        self.nulls_width = (self.count + 7) // 8
        self.text_types = dict(text_types)
        # a row without NULLs: runs of fixed widths summed, a length prefix as its negative width
        segments: list[int] = []
        for size in sizes:
            if size > 0 and segments and segments[-1] > 0:
                segments[-1] += size
            else:
                segments.append(size)
        self.segments = tuple(segments)

    def image_end(self, event: bytes, pos: int) -> int:
        """Where the image at ``pos`` ends (IndexError past the event's end)."""
        nw = self.nulls_width
        nulls = event[pos:pos + nw]
        pos += nw
        if not any(nulls):
            for size in self.segments:
                if size > 0:
                    pos += size
                elif size == -1:
                    pos += 1 + event[pos]
                else:
                    pos += -size + int.from_bytes(event[pos:pos - size], "little")
            return pos
        for k, size in enumerate(self.sizes):
            if nulls[k >> 3] >> (k & 7) & 1:
                continue
            if size > 0:
                pos += size
            else:
                pos += -size + int.from_bytes(event[pos:pos - size], "little")
        if pos > len(event):
            raise IndexError(pos)
        return pos


class RowImage:
    """One row image of a row event (see the module docstring)."""

    __slots__ = ("event", "start", "end", "layout", "_values")

    def __init__(self, event: bytes, start: int, end: int, layout: Layout) -> None:
        self.event, self.start, self.end, self.layout = event, start, end, layout
        self._values: list[Any] | None = None

    def values(self) -> list[Any]:
        """The row's values, as :func:`.row_values.decode_rows` makes them."""
        if self._values is None:
            event, pos, layout = self.event, self.start, self.layout
            nw = layout.nulls_width
            nulls = event[pos:pos + nw]
            pos += nw
            values: list[Any] = [None] * layout.count
            for i, read in enumerate(layout.readers):
                if not nulls[i >> 3] >> (i & 7) & 1:
                    values[i], pos = read(event, pos)
            self._values = values
        return self._values

    def __getitem__(self, i: int) -> Any:
        return self.values()[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values())

    def __len__(self) -> int:
        return self.layout.count


class ImageDecoder(RowDecoder):
    """A :class:`.row_values.RowDecoder` whose rows are :class:`RowImage` where it can (see the module docstring)."""

    def __init__(self, charsets: dict[int, str], mariadb: bool,
                 column_types: Callable[[str, str], Mapping[str, str]] | None = None) -> None:
        super().__init__(charsets, mariadb, column_types)
        # table id -> (its latest table map, that map's layout): the decoder hands back the same map object for the
        # same map bytes, so a layout is made once per distinct map
        self._layouts: dict[int, tuple[B.TableMap, Layout | None]] = {}

    def table_map(self, event: bytes) -> B.TableMap:
        table = super().table_map(event)
        known = self._layouts.get(table.table_id)
        if known is None or known[0] is not table:
            sizes = column_sizes(table)
            readers = self._by_id[table.table_id][1]
            layout = None if sizes is None else Layout(table, readers, sizes, self._charsets, self._text_types(table))
            self._layouts[table.table_id] = (table, layout)
        return table

    def rows(self, event: bytes) -> tuple[B.TableMap, Rows]:
        table_id = int.from_bytes(event[19:25], "little")
        table, readers = self._by_id[table_id]
        known = self._layouts.get(table_id)
        layout = None if known is None else known[1]
        if layout is not None:
            rows = _images(event, layout)
            if rows is not None:
                return table, iter(rows)
        return table, decode_rows(event, readers)


def _images(event: bytes, layout: Layout) -> list[tuple[str, Any, Any]] | None:
    """The rows of a row event as images, or None where a walk is not certain (see the module docstring)."""
    kind = event[4]
    op = ROW_EVENTS[kind]
    pos = B.HEADER_SIZE + 8
    if kind >= _V2:
        pos += _U16(event, pos)[0]
    count, pos = (event[pos], pos + 1) if event[pos] < 251 else B.lenenc(event, pos)
    if count != layout.count:
        return None
    width = layout.nulls_width
    bitmap = layout.bitmap
    if event[pos:pos + width] != bitmap:
        return None
    pos += width
    update = kind in _UPDATES
    if update:
        if event[pos:pos + width] != bitmap:
            return None
        pos += width
    end = len(event)
    out: list[tuple[str, Any, Any]] = []
    walk = layout.image_end
    try:
        while pos < end:
            stop = walk(event, pos)
            first = RowImage(event, pos, stop, layout)
            pos = stop
            if update:
                stop = walk(event, pos)
                out.append((op, first, RowImage(event, pos, stop, layout)))
                pos = stop
            elif op == "insert":
                out.append((op, None, first))
            else:
                out.append((op, first, None))
    except IndexError:
        return None
    return out if pos == end else None
