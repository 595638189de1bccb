"""Row events of the binary log -> Python values, one precompiled reader per column of a table map.

The second layer of the project's own decoder (after :mod:`.binlog`): :func:`compile_readers` picks,
once per ``TABLE_MAP`` event, a reader for each column from its binlog type, type metadata and the
optional metadata (signedness, collation, ENUM/SET labels); :func:`decode_rows` applies them to a
``WRITE/UPDATE/DELETE_ROWS`` event (v1: MariaDB, v2: MySQL 8). Values follow the rules of
:mod:`.types`: zero dates are None, BINARY(n) is padded back to n bytes (the log drops trailing zero
bytes), ENUM and SET are their labels, BIT(1) a bool and BIT(n) big-endian bytes, TIMESTAMP an aware
UTC datetime, DATETIME a naive one, TIME MySQL's text (``-838:59:59.50``), DECIMAL a Decimal, YEAR 0
stays 0, text decoded with the column's character set (``charsets``: collation id -> MySQL character
set name, from ``information_schema.COLLATIONS``; :func:`.server.collation_charsets`).

MySQL 8's binary JSON (type 245; MariaDB's JSON is text) is read into MySQL's JSON text by
:mod:`.json_binary`. MariaDB's UUID, INET4 and INET6 are fixed binary strings in the log, like BINARY(16)
and BINARY(4): only the catalog tells them apart, so :class:`RowDecoder` takes the columns' catalog types
(``column_types``) and reads those columns as the text MariaDB shows (``6ccd780c-baba-1026-9564-5b8c656024db``,
``1.2.3.4``, ``2001:db8::1``, ``::ffff:1.2.3.4``). Not read: the old pre-5.6 temporal types (TIMESTAMP/
DATETIME/TIME without the 2): a clear error names them.
"""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping

from flinkish_spark.connectors.mysql import binlog as B
from flinkish_spark.connectors.mysql import json_binary
from flinkish_spark.errors import ConfigError

Reader = Callable[[bytes, int], "tuple[Any, int]"]
DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_UTC = dt.timezone.utc
_FRAC_MULT = {0: 0, 1: 10000, 2: 100, 3: 1}  # fraction bytes -> microseconds per unit
_INT = {(B.TINY, False): struct.Struct("<b"), (B.TINY, True): struct.Struct("<B"),
        (B.SHORT, False): struct.Struct("<h"), (B.SHORT, True): struct.Struct("<H"),
        (B.LONG, False): struct.Struct("<i"), (B.LONG, True): struct.Struct("<I"),
        (B.LONGLONG, False): struct.Struct("<q"), (B.LONGLONG, True): struct.Struct("<Q")}
#: MySQL character set -> Python codec (MySQL's latin1 is Windows-1252).
CODECS = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "cp1252", "ascii": "ascii",
          "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
          "latin2": "iso8859-2", "latin5": "iso8859-9", "latin7": "iso8859-13", "greek": "iso8859-7",
          "hebrew": "iso8859-8", "cp1250": "cp1250", "cp1251": "cp1251", "cp1256": "cp1256", "cp1257": "cp1257",
          "cp850": "cp850", "cp852": "cp852", "cp866": "cp866", "koi8r": "koi8-r", "koi8u": "koi8-u",
          "gbk": "gbk", "gb2312": "gb2312", "gb18030": "gb18030", "big5": "big5", "sjis": "shift_jis",
          "cp932": "cp932", "ujis": "euc_jp", "eucjpms": "euc_jp", "euckr": "euc_kr", "tis620": "tis-620"}


def _length_prefixed(size: int, codec: str | None, pad: int = 0) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        n = int.from_bytes(buf[pos:pos + size], "little")
        start = pos + size
        raw = buf[start:start + n]
        if codec is None:
            return (raw.ljust(pad, b"\x00") if pad else raw), start + n
        return raw.decode(codec), start + n
    return read


def _decimal(precision: int, scale: int) -> Reader:
    """MySQL's decimal binary: groups of 9 digits in 4 bytes (shorter leading/trailing groups), big-endian, the
    sign bit flipped and every bit inverted for a negative value. Read as one integer, split into its groups
    by shifts, the digits joined by arithmetic, and made a Decimal from ``digits E-scale`` (exact)."""
    ip = precision - scale
    widths = [(w, d) for w, d in [(DIG2BYTES[ip % 9], ip % 9)] + [(4, 9)] * (ip // 9) + [(4, 9)] * (scale // 9)
              + [(DIG2BYTES[scale % 9], scale % 9)] if w]
    size = sum(w for w, _ in widths)
    sign_bit, all_bits = 1 << (8 * size - 1), (1 << (8 * size)) - 1
    backwards = [(8 * w, (1 << (8 * w)) - 1) for w, _ in reversed(widths)]
    scales = [10 ** d for _, d in widths]
    exponent = f"E-{scale}"

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        x = int.from_bytes(buf[pos:pos + size], "big")
        negative = not x & sign_bit
        x ^= all_bits ^ sign_bit if negative else sign_bit
        groups = []
        for bits, mask in backwards:
            groups.append(x & mask)
            x >>= bits
        total = 0
        for g, mult in zip(reversed(groups), scales):
            total = total * mult + g
        return Decimal(("-" if negative else "") + str(total) + exponent), pos + size
    return read


def _fraction(buf: bytes, pos: int, frac_bytes: int) -> int:
    return int.from_bytes(buf[pos:pos + frac_bytes], "big") * _FRAC_MULT[frac_bytes] if frac_bytes else 0


def _datetime2(fsp: int) -> Reader:
    fb = (fsp + 1) // 2

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(buf[pos:pos + 5], "big") - 0x8000000000
        ym, day = (v >> 22) & 0x1FFFF, (v >> 17) & 0x1F
        year, month = divmod(ym, 13)
        if year == 0 or month == 0 or day == 0:
            return None, pos + 5 + fb  # a zero date: NULL (types.py)
        value = dt.datetime(year, month, day, (v >> 12) & 0x1F, (v >> 6) & 0x3F, v & 0x3F,
                            _fraction(buf, pos + 5, fb))
        return value, pos + 5 + fb
    return read


def _timestamp2(fsp: int) -> Reader:
    fb = (fsp + 1) // 2

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        seconds = int.from_bytes(buf[pos:pos + 4], "big")
        micro = _fraction(buf, pos + 4, fb)
        if seconds == 0 and micro == 0:
            return None, pos + 4 + fb  # '0000-00-00 00:00:00'
        return dt.datetime.fromtimestamp(seconds, _UTC).replace(microsecond=micro), pos + 4 + fb
    return read


def _time2(fsp: int) -> Reader:
    fb = (fsp + 1) // 2

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        # MySQL's my_time_packed_from_binary: a signed (hms << 24 | microseconds) packed value.
        if fb == 3:
            packed = int.from_bytes(buf[pos:pos + 6], "big") - 0x800000000000
        else:
            intpart = int.from_bytes(buf[pos:pos + 3], "big") - 0x800000
            frac = int.from_bytes(buf[pos + 3:pos + 3 + fb], "big") if fb else 0
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x100 if fb == 1 else 0x10000
            packed = (intpart << 24) + frac * _FRAC_MULT[fb]
        sign, packed = ("-", -packed) if packed < 0 else ("", packed)
        hms, micro = packed >> 24, packed % (1 << 24)
        text = f"{sign}{(hms >> 12) % 1024:02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}"
        if fsp:
            text += "." + f"{micro:06d}"[:fsp]
        return text, pos + 3 + fb
    return read


def _date(buf: bytes, pos: int) -> tuple[Any, int]:
    v = int.from_bytes(buf[pos:pos + 3], "little")
    year, month, day = v >> 9, (v >> 5) & 15, v & 31
    return (dt.date(year, month, day) if year and month and day else None), pos + 3


def _int24(unsigned: bool) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(buf[pos:pos + 3], "little", signed=not unsigned), pos + 3
    return read


def _fixed(s: struct.Struct) -> Reader:
    unpack, size = s.unpack_from, s.size
    return lambda buf, pos: (unpack(buf, pos)[0], pos + size)


def _labels(size: int, labels: tuple[str, ...], is_set: bool) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(buf[pos:pos + size], "little")
        if is_set:
            return ",".join(label for i, label in enumerate(labels) if v >> i & 1), pos + size
        return (labels[v - 1] if 0 < v <= len(labels) else ""), pos + size
    return read


def _bit(bits: int) -> Reader:
    size = (bits + 7) // 8
    if bits == 1:
        return lambda buf, pos: (bool(buf[pos]), pos + 1)
    return lambda buf, pos: (bytes(buf[pos:pos + size]), pos + size)


def _uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _inet6(raw: bytes) -> str:
    """As MariaDB's INET6 prints it: IPv4-mapped and -compatible (not ``::``, ``::1``) addresses end in dotted
    form; the longest run of zero groups (the first of equal ones, even a single one) becomes ``::``."""
    if raw[:10] == bytes(10) and (raw[10:12] == b"\xff\xff" or (raw[10:12] == b"\x00\x00" and raw[12:14] != bytes(2))):
        return ("::ffff:" if raw[10:12] == b"\xff\xff" else "::") + ".".join(str(b) for b in raw[12:])
    groups = [int.from_bytes(raw[k:k + 2], "big") for k in range(0, 16, 2)]
    best, best_len, k = -1, 0, 0
    while k < 8:
        if groups[k] == 0:
            j = k
            while j < 8 and groups[j] == 0:
                j += 1
            if j - k > best_len:
                best, best_len = k, j - k
            k = j
        else:
            k += 1
    text = [f"{g:x}" for g in groups]
    if best < 0:
        return ":".join(text)
    return ":".join(text[:best]) + "::" + ":".join(text[best + best_len:])


#: MariaDB's binary-stored types read as text: the catalog's type name -> (stored bytes, rendering).
TEXT_TYPES: dict[str, tuple[int, Callable[[bytes], str]]] = {
    "uuid": (16, _uuid), "inet6": (16, _inet6), "inet4": (4, lambda raw: ".".join(str(b) for b in raw)),
}


def _as_text(reader: Reader, size: int, render: Callable[[bytes], str]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        raw, pos = reader(buf, pos)
        return render(raw.ljust(size, b"\x00")), pos
    return read


def _json(size: int) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        n = int.from_bytes(buf[pos:pos + size], "little")
        start = pos + size
        return json_binary.to_text(buf[start:start + n]), start + n
    return read


def compile_readers(table: B.TableMap, charsets: dict[int, str],
                    text_types: Mapping[int, str] | None = None) -> list[Reader]:
    """One reader per column of ``table``. ``charsets``: collation id -> MySQL character set name.
    ``text_types``: column index -> a type of :data:`TEXT_TYPES` (from the catalog) for the columns logged as
    fixed binary strings that are UUID/INET4/INET6."""
    readers: list[Reader] = []
    for i, (t, meta) in enumerate(zip(table.types, table.meta)):
        unsigned = bool(table.unsigned and table.unsigned[i])
        charset = charsets.get(table.collations.get(i, 63), "binary")
        codec = None if charset == "binary" else CODECS.get(charset)
        if codec is None and charset != "binary":
            raise ConfigError(f"column {_name(table, i)}: the character set {charset} has no decoder yet")
        if (t, unsigned) in _INT:
            readers.append(_fixed(_INT[(t, unsigned)]))
        elif t == B.INT24:
            readers.append(_int24(unsigned))
        elif t == B.FLOAT:
            readers.append(_fixed(struct.Struct("<f")))
        elif t == B.DOUBLE:
            readers.append(_fixed(struct.Struct("<d")))
        elif t == B.NEWDECIMAL:
            readers.append(_decimal(*meta))
        elif t in (B.VARCHAR, B.VAR_STRING):
            readers.append(_length_prefixed(1 if meta[0] < 256 else 2, codec))
        elif t == B.STRING:
            readers.append(_length_prefixed(1 if meta[0] < 256 else 2, codec, pad=meta[0]))
        elif t in (B.BLOB, B.GEOMETRY):
            readers.append(_length_prefixed(meta[0], None if t == B.GEOMETRY else codec))
        elif t in (B.ENUM, B.SET):
            labels = (table.enum_labels if t == B.ENUM else table.set_labels).get(i)
            if labels is None:
                raise ConfigError(f"column {_name(table, i)}: no ENUM/SET labels in the log "
                                  "(binlog_row_metadata must be FULL)")
            readers.append(_labels(meta[0], labels, t == B.SET))
        elif t == B.BIT:
            readers.append(_bit(meta[0]))
        elif t == B.DATE:
            readers.append(_date)
        elif t == B.DATETIME2:
            readers.append(_datetime2(meta[0]))
        elif t == B.TIMESTAMP2:
            readers.append(_timestamp2(meta[0]))
        elif t == B.TIME2:
            readers.append(_time2(meta[0]))
        elif t == B.YEAR:
            readers.append(lambda buf, pos: ((buf[pos] + 1900 if buf[pos] else 0), pos + 1))
        elif t == B.JSON:
            readers.append(_json(meta[0]))
        else:
            raise ConfigError(f"column {_name(table, i)}: the binary log type {t} cannot be read yet "
                              "(a temporal type from before MySQL 5.6)")
        special = (text_types or {}).get(i)
        if special is not None and t == B.STRING and special in TEXT_TYPES:
            size, render = TEXT_TYPES[special]
            readers[-1] = _as_text(readers[-1], size, render)
    return readers


def _name(table: B.TableMap, i: int) -> str:
    name = table.names[i] if table.names else f"#{i + 1}"
    return f"{table.database}.{table.table}.{name}"


ROW_EVENTS = {B.WRITE_ROWS_V1: "insert", B.UPDATE_ROWS_V1: "update", B.DELETE_ROWS_V1: "delete",
              B.WRITE_ROWS_V2: "insert", B.UPDATE_ROWS_V2: "update", B.DELETE_ROWS_V2: "delete"}


def rows_table_id(event: bytes) -> int:
    return int.from_bytes(event[B.HEADER_SIZE:B.HEADER_SIZE + 6], "little")


def decode_rows(event: bytes, readers: list[Reader]) -> Iterator[tuple[str, list[Any] | None, list[Any] | None]]:
    """(op, before, after) per row of a row event; a value per column, None for NULL or an absent column."""
    kind = event[4]
    op = ROW_EVENTS[kind]
    pos = B.HEADER_SIZE + 8
    if kind >= B.WRITE_ROWS_V2:
        pos += struct.unpack_from("<H", event, pos)[0]  # extra data, its length included
    count, pos = B.lenenc(event, pos)
    width = (count + 7) // 8
    present = [event[pos:pos + width]]
    pos += width
    if op == "update":
        present.append(event[pos:pos + width])
        pos += width
    images = [[i for i in range(count) if bits[i >> 3] >> (i & 7) & 1] for bits in present]
    while pos < len(event):
        row = []
        for columns in images:
            values: list[Any] = [None] * count
            nulls_width = (len(columns) + 7) // 8
            nulls = event[pos:pos + nulls_width]
            pos += nulls_width
            for k, i in enumerate(columns):
                if not nulls[k >> 3] >> (k & 7) & 1:
                    values[i], pos = readers[i](event, pos)
            row.append(values)
        if op == "insert":
            yield op, None, row[0]
        elif op == "delete":
            yield op, row[0], None
        else:
            yield op, row[0], row[1]


class RowDecoder:
    """Table maps and their compiled readers, kept by the map's bytes, and the row events read with them.

    A writer that changes one row per statement makes the server log a table map before every row
    event; parsing and compiling each of them cost ~3 times the row's own decoding (measured:
    benchmarks/binlog_decode.py), so an identical map (same table id, same columns and metadata) reuses
    what the last one compiled. ``mariadb``: see :func:`.binlog.parse_table_map`. ``column_types``: (database,
    table) -> column name -> the catalog's type name (``information_schema.COLUMNS.DATA_TYPE``), asked once per
    new table map, for the types the log cannot tell from BINARY(n) (:data:`TEXT_TYPES`); None: read as bytes."""

    MAX_CACHED = 4096  # distinct table maps kept (a table id changes with each table definition)

    def __init__(self, charsets: dict[int, str], mariadb: bool,
                 column_types: Callable[[str, str], Mapping[str, str]] | None = None) -> None:
        self._charsets = charsets
        self._column_types = column_types
        self._mariadb = mariadb
        self._by_body: dict[bytes, tuple[B.TableMap, list[Reader]]] = {}
        self._by_id: dict[int, tuple[B.TableMap, list[Reader]]] = {}

    def table_map(self, event: bytes) -> B.TableMap:
        """Read a ``TABLE_MAP`` event; the row events after it with its table id use it."""
        body = bytes(event[B.HEADER_SIZE:])
        hit = self._by_body.get(body)
        if hit is None:
            table = B.parse_table_map(event, self._mariadb)
            hit = (table, compile_readers(table, self._charsets, self._text_types(table)))
            if len(self._by_body) >= self.MAX_CACHED:
                self._by_body.clear()
            self._by_body[body] = hit
        self._by_id[hit[0].table_id] = hit
        return hit[0]

    def text_types(self, table: B.TableMap) -> dict[int, str]:
        """Column index -> the catalog type of the columns of ``table`` read as text though logged as binary."""
        return self._text_types(table)

    def _text_types(self, table: B.TableMap) -> dict[int, str]:
        if self._column_types is None or table.names is None or B.STRING not in table.types:
            return {}
        catalog = self._column_types(table.database, table.table)
        return {i: catalog[name].lower() for i, name in enumerate(table.names)
                if name in catalog and catalog[name].lower() in TEXT_TYPES}

    def rows(self, event: bytes) -> tuple[B.TableMap, Iterator[tuple[str, list[Any] | None, list[Any] | None]]]:
        """The table of a row event (from the table map before it) and its rows."""
        table, readers = self._by_id[rows_table_id(event)]
        return table, decode_rows(event, readers)
