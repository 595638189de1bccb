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
from flinkish_spark.connectors.mysql.row_count import column_sizes, image_end
from flinkish_spark.connectors.mysql.row_values import CODECS, ROW_EVENTS, Reader, RowDecoder, decode_rows

_UPDATES = (B.UPDATE_ROWS_V1, B.UPDATE_ROWS_V2)
_V2 = B.WRITE_ROWS_V2
_U16 = struct.Struct("<H").unpack_from
Rows = Iterator[tuple[str, Any, Any]]


class Layout:
    """A table map's columns as a row image holds them (all present): what a walk and a column cut need."""

    __slots__ = ("table", "readers", "sizes", "codecs", "count", "nulls_width", "heads", "fast", "text_types")

    def __init__(self, table: B.TableMap, readers: list[Reader], sizes: list[int], charsets: Mapping[int, str],
                 text_types: Mapping[int, str]) -> None:
        self.table, self.readers, self.sizes = table, readers, sizes
        # per column: its Python codec, None for binary (as compile_readers picks it)
        names = [charsets.get(table.collations.get(i, 63), "binary") for i in range(len(sizes))]
        self.codecs = tuple(None if name == "binary" else CODECS.get(name) for name in names)
        self.count = count = len(sizes)
        self.nulls_width = (count + 7) // 8
        self.text_types = dict(text_types)
        # what a row event of this table with every column present starts with: its column count (length-encoded,
        # as the server writes it) and the present-columns bitmap, twice for an update (the before and after image)
        bitmap = bytes([0xFF] * (count // 8) + ([(1 << (count % 8)) - 1] if count % 8 else []))
        counted = bytes([count]) if count < 251 else b"\xfc" + count.to_bytes(2, "little")
        self.heads = (counted + bitmap, counted + bitmap + bitmap)
        self.fast = _fast_walk(self.nulls_width, sizes, self._walk)

    def _walk(self, event: bytes, pos: int) -> int:
        """Where the image at ``pos``, which has NULLs, ends: column by column (:attr:`fast` for one without)."""
        return image_end(event, pos, self.sizes, self.nulls_width)

    def images(self, event: bytes) -> list[tuple[str, Any, Any]] | None:
        """The rows of a row event of this table as images, or None where a walk is not certain (see the module
        docstring)."""
        kind = event[4]
        pos = 27 if kind < _V2 else 27 + _U16(event, 27)[0]  # after the header, table id, flags (v2: extra data)
        update = kind in _UPDATES
        head = self.heads[update]
        if event[pos:pos + len(head)] != head:
            return None
        pos += len(head)
        op = ROW_EVENTS[kind]
        end = len(event)
        out: list[tuple[str, Any, Any]] = []
        walk = self.fast
        try:
            if not update and walk(event, pos) == end:  # one row (an OLTP statement's): no loop
                image = RowImage(event, pos, end, self)
                return [(op, None, image) if op == "insert" else (op, image, None)]
            while pos < end:
                stop = walk(event, pos)
                first = RowImage(event, pos, stop, self)
                pos = stop
                if update:
                    stop = walk(event, pos)
                    out.append((op, first, RowImage(event, pos, stop, self)))
                    pos = stop
                elif op == "insert":
                    out.append((op, None, first))
                else:
                    out.append((op, first, None))
        except IndexError:
            return None
        return out if pos == end else None


def _fast_walk(nulls_width: int, sizes: list[int], slow: Callable[[bytes, int], int]) -> Callable[[bytes, int], int]:
    """Where the image at ``p`` ends: straight-line code made for the layout where the image has no NULL (runs of
    fixed widths summed, a length prefix read: the per-row step of a change read, without a loop over the columns),
    else ``slow``. The NULL bits past the last column are not the image's (MariaDB sets them)."""
    mask = (1 << len(sizes)) - 1
    if nulls_width == 1:
        lines = [f"    if ev[p] & {mask}:"]
    else:
        lines = [f"    if int.from_bytes(ev[p:p + {nulls_width}], 'little') & {mask}:"]
    lines.append("        return slow(ev, p)")
    fixed = nulls_width
    for size in sizes:
        if size > 0:
            fixed += size
            continue
        if fixed:
            lines.append(f"    p += {fixed}")
            fixed = 0
        if size == -1:
            lines.append("    p += 1 + ev[p]")
        elif size == -2:
            lines.append("    p += 2 + (ev[p] | ev[p + 1] << 8)")
        else:
            lines.append(f"    p += {-size} + int.from_bytes(ev[p:p + {-size}], 'little')")
    if fixed:
        lines.append(f"    p += {fixed}")
    namespace: dict[str, Any] = {"slow": slow}
    exec("def walk(ev, p):\n" + "\n".join(lines) + "\n    return p\n", namespace)  # noqa: S102 - our own code
    walk: Callable[[bytes, int], int] = namespace["walk"]
    return walk


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
        # a table map's bytes -> (the decoder's (map, readers), its layout): made once per distinct map
        self._mapped: dict[bytes, tuple[tuple[B.TableMap, list[Reader]], Layout | None]] = {}
        self._layouts: dict[int, Layout | None] = {}  # table id -> the layout of its latest map
        self._last: tuple[int, bytes, B.TableMap] | None = None  # the latest map: its event's length, body, map

    def table_map(self, event: bytes) -> B.TableMap:
        last = self._last
        if last is not None and len(event) == last[0] and event.startswith(last[1], B.HEADER_SIZE):
            return last[2]  # the latest map again (a writer of one row per statement logs one per row): as it was
        body = bytes(event[B.HEADER_SIZE:])
        hit = self._mapped.get(body)
        if hit is None:
            table = super().table_map(event)
            sizes = column_sizes(table)
            pair = self._by_id[table.table_id]
            layout = None if sizes is None else Layout(table, pair[1], sizes, self._charsets, self._text_types(table))
            if len(self._mapped) >= self.MAX_CACHED:
                self._mapped.clear()
            hit = self._mapped[body] = (pair, layout)
        pair, layout = hit
        table_id = pair[0].table_id
        self._by_id[table_id] = pair
        self._layouts[table_id] = layout
        self._last = (len(event), body, pair[0])
        return pair[0]

    def rows(self, event: bytes) -> tuple[B.TableMap, Rows]:
        table_id = int.from_bytes(event[19:25], "little")
        layout = self._layouts.get(table_id)
        if layout is not None:
            rows = layout.images(event)
            if rows is not None:
                return layout.table, iter(rows)
        table, readers = self._by_id[table_id]
        return table, decode_rows(event, readers)
