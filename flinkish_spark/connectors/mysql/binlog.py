"""The binary log over the replication protocol: raw events, and the table map events parsed.

The first layer of the project's own row event decoder (chosen by measurement: docs/benchmarks.md,
"MySQL binary log decoders"), which reads the log the way ``connectors/postgres/pgoutput.py`` reads
pgoutput: bytes sliced in place, one precompiled reader per column.

* :func:`dump_events` asks the server for its log from a :class:`~.position.FilePosition` or a MariaDB
  GTID position (``COM_BINLOG_DUMP`` on a PyMySQL connection, as a replica asks; the connection is used
  for nothing else afterwards) and yields each event's bytes without the protocol's status byte and the
  CRC32 trailer; non-blocking (the iteration ends at the end of the log) or blocking (it waits).
* :func:`parse_table_map` reads a ``TABLE_MAP`` event: the table, each column's binlog type and
  type metadata, and the optional metadata that ``binlog_row_metadata=FULL`` adds -- column names,
  signedness, collations, ENUM and SET labels, the primary key -- so that a row event is decoded with
  the columns it was written with, whatever the catalog says now.

Formats: MySQL's ``libbinlogevents`` (``Table_map_event``, ``Optional_metadata_fields``), which MariaDB
10.5+ writes the same way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Iterator

from flinkish_spark.connectors.mysql.position import FilePosition, MariaGtidPosition
from flinkish_spark.connectors.mysql.socket_blocks import LOST, more

COM_BINLOG_DUMP = 0x12
BINLOG_DUMP_NON_BLOCK = 0x01
HEADER_SIZE = 19

# Event types (the ones the decoder needs).
QUERY_EVENT, ROTATE_EVENT, FORMAT_DESCRIPTION_EVENT, XID_EVENT, TABLE_MAP_EVENT = 2, 4, 15, 16, 19
WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1 = 23, 24, 25  # MariaDB's
WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2 = 30, 31, 32  # MySQL 8's
MARIADB_GTID_EVENT, MARIADB_GTID_LIST_EVENT = 162, 163

# Column types of the binary log (``enum_field_types``).
TINY, SHORT, LONG, FLOAT, DOUBLE, TIMESTAMP, LONGLONG, INT24 = 1, 2, 3, 4, 5, 7, 8, 9
DATE, TIME, DATETIME, YEAR, VARCHAR, BIT, TIMESTAMP2, DATETIME2, TIME2 = 10, 11, 12, 13, 15, 16, 17, 18, 19
JSON, NEWDECIMAL, ENUM, SET, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB = 245, 246, 247, 248, 249, 250, 251
BLOB, VAR_STRING, STRING, GEOMETRY = 252, 253, 254, 255

# Bytes of type metadata per column type in a table map (0 for the others).
_META_SIZE = {FLOAT: 1, DOUBLE: 1, BLOB: 1, GEOMETRY: 1, JSON: 1, TIMESTAMP2: 1, DATETIME2: 1, TIME2: 1,
              VARCHAR: 2, VAR_STRING: 2, STRING: 2, BIT: 2, NEWDECIMAL: 2, ENUM: 2, SET: 2}
_NUMERIC = frozenset({TINY, SHORT, INT24, LONG, LONGLONG, NEWDECIMAL, FLOAT, DOUBLE, YEAR})
_CHARACTER = frozenset({STRING, VAR_STRING, VARCHAR, BLOB})

# Optional metadata field types (``Optional_metadata_field_type``).
SIGNEDNESS, DEFAULT_CHARSET, COLUMN_CHARSET, COLUMN_NAME, SET_STR_VALUE, ENUM_STR_VALUE = 1, 2, 3, 4, 5, 6
GEOMETRY_TYPE, SIMPLE_PRIMARY_KEY, PRIMARY_KEY_WITH_PREFIX = 7, 8, 9
ENUM_AND_SET_DEFAULT_CHARSET, ENUM_AND_SET_COLUMN_CHARSET, COLUMN_VISIBILITY = 10, 11, 12

_U16 = struct.Struct("<H").unpack_from


def lenenc(buf: bytes, pos: int) -> tuple[int, int]:
    """A length-encoded integer at ``pos``: (value, position after it)."""
    first = buf[pos]
    if first < 0xFB:
        return first, pos + 1
    size = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
    return int.from_bytes(buf[pos + 1:pos + 1 + size], "little"), pos + 1 + size


def _lenenc_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = lenenc(buf, pos)
    return buf[pos:pos + n], pos + n


@dataclass(frozen=True)
class EventHeader:
    timestamp: int
    type: int
    server_id: int
    size: int
    log_pos: int  # the position of the next event in the same file
    flags: int

    @classmethod
    def parse(cls, event: bytes) -> EventHeader:
        return cls(*struct.unpack_from("<IBIIIH", event, 0))


def dump_events(conn: Any, start: FilePosition | MariaGtidPosition, server_id: int,
                blocking: bool = False) -> Iterator[bytes]:
    """The events of the log from ``start``, each without status byte and checksum.

    ``conn``: a PyMySQL connection of its own (after the dump request it carries nothing else).
    ``start``: a file position, or a MariaDB GTID position (the server sends the transactions after it:
    ``@slave_connect_state`` and an empty file name, as a MariaDB replica asks; strict mode, so that a
    position the server's log does not hold is an error, not a silent jump).
    ``server_id``: this reader's replica id, distinct from the server's and from other readers'.
    ``blocking``: False ends the iteration at the end of the log; True waits for new events (the caller
    bounds the wait with the connection's read timeout)."""
    with conn.cursor() as cur:
        # Events with their CRC32 as the server writes them (the trailer is cut below), and MariaDB's
        # GTID events as they are (capability 4: a reader that knows them).
        cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum, @mariadb_slave_capability = 4")
        cur.execute("SELECT @@global.binlog_checksum")
        trailer = 0 if str(cur.fetchone()[0]).upper() == "NONE" else 4
        if isinstance(start, MariaGtidPosition):
            cur.execute("SET @slave_connect_state = %s, @slave_gtid_strict_mode = 1, "
                        "@slave_gtid_ignore_duplicates = 0", (str(start),))
    file, offset = (start.file, start.offset) if isinstance(start, FilePosition) else ("", 4)
    flags = 0 if blocking else BINLOG_DUMP_NON_BLOCK
    body = bytes([COM_BINLOG_DUMP]) + struct.pack("<IHI", offset, flags, server_id) + file.encode()
    # PyMySQL has no replication API: the packet is written as mysql-replication writes it.
    conn._write_bytes(struct.pack("<I", len(body))[:3] + b"\x00" + body)
    conn._next_seq_id = 1
    if not blocking:
        yield from _block_events(conn, trailer)
        return
    for data in _pymysql_packets(conn):
        if data[0] == 0xFE and len(data) < 9:  # EOF
            return
        yield data[1:len(data) - trailer] if trailer else data[1:]


_MAX_PACKET = 0xFFFFFF


def _pymysql_packets(conn: Any) -> Iterator[bytes]:
    while True:
        yield conn._read_packet().get_all_data()


def _block_events(conn: Any, trailer: int) -> Iterator[bytes]:
    """A non-blocking dump's events (status byte and ``trailer`` cut) read off the connection's buffered socket file
    in blocks (:func:`.socket_blocks.more`), each event one slice of a block: what PyMySQL's ``_read_packet`` does
    (a 4-byte header, the payload, one of 16 MiB and more continued in the next packet, the sequence number checked,
    an error packet raised as PyMySQL's error, a lost connection as its OperationalError) without a packet object,
    nor two socket reads and two copies, per event -- ~40 % of a range's planning read, ~15 % of a change task's
    (benchmarks: ``mysql_source_parts.py``, ``mysql_decode.py``). Bytes past the dump's end may be taken off the
    socket: the dump's connection carries nothing else. Not for a blocking dump, whose caller bounds each read with
    the connection's read timeout (PyMySQL sets it per packet)."""
    if getattr(conn, "_current_timeout", object()) != conn._read_timeout:
        conn._sock.settimeout(conn._read_timeout)
        conn._current_timeout = conn._read_timeout
    rfile, seq = conn._rfile, conn._next_seq_id
    buf, pos, n = b"", 0, 0
    while True:
        if n - pos < 4:
            buf, pos, n = _refill(conn, rfile, buf, pos, 4)
        size = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
        if n - pos < 4 + size:
            buf, pos, n = _refill(conn, rfile, buf, pos, 4 + size)
        if buf[pos + 3] != seq:
            _check_seq(conn, buf[pos + 3], seq)
        seq = (seq + 1) & 255
        start, pos = pos + 4, pos + 4 + size
        if size == _MAX_PACKET:  # continued in the next packets (an event of 16 MiB and more): joined
            parts = [buf[start:pos]]
            while size == _MAX_PACKET:
                if n - pos < 4:
                    buf, pos, n = _refill(conn, rfile, buf, pos, 4)
                size = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
                if n - pos < 4 + size:
                    buf, pos, n = _refill(conn, rfile, buf, pos, 4 + size)
                seq = _check_seq(conn, buf[pos + 3], seq)
                parts.append(buf[pos + 4:pos + 4 + size])
                pos += 4 + size
            conn._next_seq_id = seq
            data = b"".join(parts)
            _check_end(conn, data)
            if data[0] == 0xFE and len(data) < 9:
                return
            yield data[1:len(data) - trailer]
            continue
        conn._next_seq_id = seq
        first = buf[start]
        if first == 0xFF or (first == 0xFE and size < 9):
            _check_end(conn, buf[start:pos])
            return  # EOF: the end of the log
        yield buf[start + 1:pos - trailer]


def _refill(conn: Any, rfile: Any, buf: bytes, pos: int, need: int) -> tuple[bytes, int, int]:
    """``buf`` from ``pos`` on and what the socket has after it, at least ``need`` bytes: (buffer, 0, its length)."""
    joined = more(conn, rfile, buf[pos:], need)
    return joined, 0, len(joined)


def _check_seq(conn: Any, number: int, seq: int) -> int:
    """The sequence number after a packet numbered ``number`` where ``seq`` is expected (else PyMySQL's errors)."""
    if number != seq:
        pymysql = __import__("pymysql")
        conn._force_close()
        if number == 0:  # MariaDB's error packet when it shuts down (as PyMySQL reads it)
            raise pymysql.err.OperationalError(2013, LOST)
        raise pymysql.err.InternalError(f"Packet sequence number wrong - got {number} expected {seq}")
    return (seq + 1) & 255


def _check_end(conn: Any, data: bytes) -> None:
    """An error packet raised as PyMySQL raises it."""
    if data[:1] == b"\xff":
        pymysql = __import__("pymysql")
        pymysql.protocol.MysqlPacket(data, conn.encoding).raise_for_error()


@dataclass(frozen=True)
class TableMap:
    """One ``TABLE_MAP`` event: what the row events that follow it (same ``table_id``) are made of."""

    table_id: int
    database: str
    table: str
    types: tuple[int, ...]  # binlog column types; STRING columns holding ENUM/SET carry ENUM/SET here
    meta: tuple[tuple[int, ...], ...]  # per column: its type metadata (see _column_meta)
    nullable: tuple[bool, ...]
    names: tuple[str, ...] | None = None  # binlog_row_metadata=FULL
    unsigned: tuple[bool, ...] = ()  # per column (False for non-numeric); empty without metadata
    collations: dict[int, int] = field(default_factory=dict)  # column index -> collation id (character columns)
    enum_labels: dict[int, tuple[str, ...]] = field(default_factory=dict)  # column index -> labels
    set_labels: dict[int, tuple[str, ...]] = field(default_factory=dict)
    primary_key: tuple[int, ...] = ()


def _column_meta(col_type: int, meta: bytes, pos: int) -> tuple[int, tuple[int, ...], int]:
    """(real type, metadata values, position after) of one column's type metadata."""
    size = _META_SIZE.get(col_type, 0)
    raw = meta[pos:pos + size]
    if col_type in (VARCHAR, VAR_STRING):
        return col_type, (_U16(raw)[0],), pos + size  # max length in bytes
    if col_type == STRING:
        real, length = raw[0], raw[1]
        if real in (ENUM, SET):
            return real, (length,), pos + size  # storage bytes of the index / bitmap
        # CHAR(n) over 255 bytes: the high bits of the length live in the type byte.
        return col_type, ((((real & 0x30) ^ 0x30) << 4) | length,), pos + size
    if col_type == BIT:
        return col_type, (raw[1] * 8 + raw[0],), pos + size  # bits = bytes * 8 + remaining bits
    if col_type == NEWDECIMAL:
        return col_type, (raw[0], raw[1]), pos + size  # precision, scale
    return col_type, tuple(raw), pos + size


def parse_table_map(event: bytes, mariadb: bool) -> TableMap:
    """A ``TABLE_MAP`` event's bytes (header included, as :func:`dump_events` yields them). ``mariadb``: the
    server is MariaDB (:attr:`.server.ServerInfo.mariadb`), which counts GEOMETRY columns among the character
    columns of the collation fields (a latin1 column after a POINT got the POINT's collation otherwise)."""
    pos = HEADER_SIZE
    table_id = int.from_bytes(event[pos:pos + 6], "little")
    pos += 8  # table id, flags
    n = event[pos]
    database = event[pos + 1:pos + 1 + n].decode()
    pos += 1 + n + 1
    n = event[pos]
    table = event[pos + 1:pos + 1 + n].decode()
    pos += 1 + n + 1
    count, pos = lenenc(event, pos)
    wire_types = event[pos:pos + count]
    pos += count
    meta, pos = _lenenc_bytes(event, pos)
    types, metas, m = [], [], 0
    for t in wire_types:
        real, values, m = _column_meta(t, meta, m)
        types.append(real)
        metas.append(values)
    null_bits = event[pos:pos + (count + 7) // 8]
    pos += (count + 7) // 8
    nullable = tuple(bool(null_bits[i >> 3] & (1 << (i & 7))) for i in range(count))
    fields = _optional_fields(event, pos, tuple(types), _CHARACTER | {GEOMETRY} if mariadb else _CHARACTER)
    return TableMap(table_id, database, table, tuple(types), tuple(metas), nullable, **fields)


def _optional_fields(event: bytes, pos: int, types: tuple[int, ...], character_types: frozenset[int]) -> dict[str, Any]:
    """The optional metadata after the null bitmap (type, length, value), as TableMap's fields."""
    out: dict[str, Any] = {}
    numeric = [i for i, t in enumerate(types) if t in _NUMERIC]
    character = [i for i, t in enumerate(types) if t in character_types]
    enums = [i for i, t in enumerate(types) if t == ENUM]
    sets = [i for i, t in enumerate(types) if t == SET]
    while pos < len(event):
        kind = event[pos]
        value, pos = _lenenc_bytes(event, pos + 1)
        if kind == SIGNEDNESS:  # one bit per numeric column, most significant bit first
            unsigned = [False] * len(types)
            for k, i in enumerate(numeric):
                unsigned[i] = bool(value[k >> 3] & (0x80 >> (k & 7)))
            out["unsigned"] = tuple(unsigned)
        elif kind == DEFAULT_CHARSET:  # the table's collation, then (character column number, collation) pairs
            default, p = lenenc(value, 0)
            collations = {i: default for i in character}
            while p < len(value):
                k, p = lenenc(value, p)
                collation, p = lenenc(value, p)
                collations[character[k]] = collation
            out["collations"] = collations
        elif kind == COLUMN_CHARSET:  # one collation per character column
            collations, p = {}, 0
            for i in character:
                collations[i], p = lenenc(value, p)
            out["collations"] = collations
        elif kind == COLUMN_NAME:
            names, p = [], 0
            while p < len(value):
                name, p = _lenenc_bytes(value, p)
                names.append(name.decode())
            out["names"] = tuple(names)
        elif kind in (ENUM_STR_VALUE, SET_STR_VALUE):
            labels: dict[int, tuple[str, ...]] = {}
            p = 0
            for i in (enums if kind == ENUM_STR_VALUE else sets):
                n, p = lenenc(value, p)
                items = []
                for _ in range(n):
                    label, p = _lenenc_bytes(value, p)
                    items.append(label.decode())
                labels[i] = tuple(items)
            out["enum_labels" if kind == ENUM_STR_VALUE else "set_labels"] = labels
        elif kind == SIMPLE_PRIMARY_KEY:
            key, p = [], 0
            while p < len(value):
                i, p = lenenc(value, p)
                key.append(i)
            out["primary_key"] = tuple(key)
        elif kind == PRIMARY_KEY_WITH_PREFIX:
            key, p = [], 0
            while p < len(value):
                i, p = lenenc(value, p)
                _prefix, p = lenenc(value, p)
                key.append(i)
            out["primary_key"] = tuple(key)
        # GEOMETRY_TYPE, the ENUM/SET charsets and COLUMN_VISIBILITY: not needed to decode values.
    return out
