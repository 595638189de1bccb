"""Benchmark-only prototype: a pure-Python row event decoder over PyMySQL, compiled per table map.

What would a decoder of the project's own cost (as ``connectors/postgres/pgoutput.py`` is for PostgreSQL)?
This reads the log over the replication protocol (``COM_BINLOG_DUMP``, PyMySQL's packet reader), and
decodes ``TABLE_MAP`` and ``WRITE/UPDATE/DELETE_ROWS`` (v1, MariaDB's; v2, MySQL 8's) for the column types
of ``benchmarks/binlog_decode.py``'s table only (LONGLONG, LONG, VARCHAR, NEWDECIMAL, DATETIME2, DOUBLE):
per column one precompiled reader, values as the text a JSON row needs (DECIMAL and DATETIME as strings,
as mysql-event-stream gives them). Not production code: no other types, no checksum verification, an
update's two images counted as two changes (the benchmark writes inserts only).
"""

from __future__ import annotations

import struct
from typing import Any, Callable

COM_BINLOG_DUMP = 0x12
TABLE_MAP = 19
ROWS_V1 = {23: "insert", 24: "update", 25: "delete"}
ROWS_V2 = {30: "insert", 31: "update", 32: "delete"}
DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]
_Q, _I, _D, _H = struct.Struct("<q").unpack_from, struct.Struct("<i").unpack_from, struct.Struct("<d").unpack_from, \
    struct.Struct("<H").unpack_from

Reader = Callable[[bytes, int], "tuple[Any, int]"]


def _lenenc(buf: bytes, pos: int) -> tuple[int, int]:
    first = buf[pos]
    if first < 0xFB:
        return first, pos + 1
    size = {0xFC: 2, 0xFD: 3, 0xFE: 8}[first]
    return int.from_bytes(buf[pos + 1:pos + 1 + size], "little"), pos + 1 + size


def _decimal_reader(precision: int, scale: int) -> Reader:
    ip = precision - scale
    lead, full_int, full_frac, trail = DIG2BYTES[ip % 9], ip // 9, scale // 9, DIG2BYTES[scale % 9]
    size = lead + full_int * 4 + full_frac * 4 + trail
    trail_digits = scale % 9

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        raw = bytearray(buf[pos:pos + size])
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        if negative:
            raw = bytearray(b ^ 0xFF for b in raw)
        p, parts = 0, []
        if lead:
            parts.append(str(int.from_bytes(raw[p:p + lead], "big")))
            p += lead
        for _ in range(full_int):
            parts.append("%09d" % int.from_bytes(raw[p:p + 4], "big"))
            p += 4
        integer = "".join(parts).lstrip("0") or "0"
        frac = []
        for _ in range(full_frac):
            frac.append("%09d" % int.from_bytes(raw[p:p + 4], "big"))
            p += 4
        if trail:
            frac.append("%0*d" % (trail_digits, int.from_bytes(raw[p:p + trail], "big")))
        text = integer + ("." + "".join(frac) if scale else "")
        return ("-" + text if negative else text), pos + size

    return read


def _compile(types: bytes, meta: bytes) -> list[Reader]:
    readers: list[Reader] = []
    m = 0
    for t in types:
        if t == 8:  # LONGLONG
            readers.append(lambda b, p: (_Q(b, p)[0], p + 8))
        elif t == 3:  # LONG
            readers.append(lambda b, p: (_I(b, p)[0], p + 4))
        elif t == 5:  # DOUBLE
            m += 1
            readers.append(lambda b, p: (_D(b, p)[0], p + 8))
        elif t == 15:  # VARCHAR: max length in 2 bytes of metadata
            max_len = _H(meta, m)[0]
            m += 2
            if max_len < 256:
                readers.append(lambda b, p: (b[p + 1:p + 1 + b[p]].decode(), p + 1 + b[p]))
            else:
                def read_long(b: bytes, p: int) -> tuple[Any, int]:
                    n = _H(b, p)[0]
                    return b[p + 2:p + 2 + n].decode(), p + 2 + n
                readers.append(read_long)
        elif t == 246:  # NEWDECIMAL: precision, scale
            readers.append(_decimal_reader(meta[m], meta[m + 1]))
            m += 2
        elif t == 18:  # DATETIME2: fsp
            fsp = meta[m]
            m += 1
            frac_bytes = (fsp + 1) // 2
            mult = {1: 10000, 2: 100, 3: 1}.get(frac_bytes, 0)

            def read_dt(b: bytes, p: int, frac_bytes: int = frac_bytes, mult: int = mult) -> tuple[Any, int]:
                v = int.from_bytes(b[p:p + 5], "big") - 0x8000000000
                ym = (v >> 22) & 0x1FFFF
                text = "%04d-%02d-%02d %02d:%02d:%02d" % (ym // 13, ym % 13, (v >> 17) & 0x1F, (v >> 12) & 0x1F,
                                                          (v >> 6) & 0x3F, v & 0x3F)
                if frac_bytes:
                    text += ".%06d" % (int.from_bytes(b[p + 5:p + 5 + frac_bytes], "big") * mult)
                return text, p + 5 + frac_bytes
            readers.append(read_dt)
        else:
            raise NotImplementedError(f"prototype: column type {t}")
    return readers


def read_rows(port: int, log_file: str, changes: int, server_id: int) -> tuple[int, Any]:
    """Read ``log_file`` from its start over TCP until ``changes`` row changes were decoded; (count, last row)."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", password="", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            cur.execute("SET @mariadb_slave_capability = 4")
            cur.execute("SELECT @@global.binlog_checksum")
            checksum = 4 if str(cur.fetchone()[0]).upper() != "NONE" else 0
        body = bytes([COM_BINLOG_DUMP]) + struct.pack("<IHI", 4, 1, server_id) + log_file.encode()
        conn._write_bytes(struct.pack("<I", len(body))[:3] + b"\x00" + body)  # packet: 3-byte length, seq 0
        conn._next_seq_id = 1
        tables: dict[int, tuple[list[Reader], list[str]]] = {}
        count, last = 0, None
        while count < changes:
            packet = conn._read_packet()
            data = packet.get_all_data()
            if data[0] == 0xFE and len(data) < 9:
                break  # end of the log (non-blocking dump)
            event_type = data[1 + 4]
            end = len(data) - checksum
            if event_type == TABLE_MAP:
                pos = 20  # OK byte + 19-byte header
                table_id = int.from_bytes(data[pos:pos + 6], "little")
                pos += 8
                pos += 1 + data[pos] + 1  # database
                pos += 1 + data[pos] + 1  # table
                n, pos = _lenenc(data, pos)
                types = data[pos:pos + n]
                pos += n
                meta_len, pos = _lenenc(data, pos)
                tables[table_id] = (_compile(types, data[pos:pos + meta_len]), [])
            elif event_type in ROWS_V1 or event_type in ROWS_V2:
                pos = 20
                table_id = int.from_bytes(data[pos:pos + 6], "little")
                pos += 8
                if event_type in ROWS_V2:
                    pos += _H(data, pos)[0]
                n, pos = _lenenc(data, pos)
                bitmap_len = (n + 7) // 8
                pos += bitmap_len * (2 if ROWS_V1.get(event_type) == "update" or ROWS_V2.get(event_type) == "update"
                                     else 1)
                readers = tables[table_id][0]
                while pos < end:
                    nulls = data[pos:pos + bitmap_len]
                    pos += bitmap_len
                    row: list[Any] = []
                    for i, read in enumerate(readers):
                        if nulls[i >> 3] & (1 << (i & 7)):
                            row.append(None)
                        else:
                            value, pos = read(data, pos)
                            row.append(value)
                    count += 1
                    last = row
        return count, last
    finally:
        conn.close()
