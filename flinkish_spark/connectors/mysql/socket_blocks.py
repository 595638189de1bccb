"""A PyMySQL connection's socket read in blocks, for the readers that cut packets out of the bytes themselves.

:mod:`.row_packets` (a chunk's result rows) and :mod:`.binlog` (a non-blocking dump's events) find the packets in
blocks of :data:`BLOCK` bytes instead of PyMySQL's two reads and a packet object per packet. What :func:`more`
guarantees them: the bytes they had and what the socket has after, at least the bytes asked for, in one join
however many reads it took; a socket that fails or closes is PyMySQL's ``OperationalError`` (2013, "Lost
connection ..."), the connection closed, as PyMySQL's own reader raises it -- so the callers' lost-session
handling (:func:`.connection.lost_session`) sees what it would see from PyMySQL.
"""

from __future__ import annotations

from typing import Any

#: bytes asked of the socket at a time
BLOCK = 1 << 20
LOST = "Lost connection to MySQL server during query"


def more(conn: Any, rfile: Any, tail: bytes, need: int) -> bytes:
    """``tail`` and what the socket has after it, at least ``need`` bytes in all (one join, however many reads)."""
    parts, have = [tail], len(tail)
    while True:
        chunk = _read(conn, rfile, max(BLOCK, need - have))
        parts.append(chunk)
        have += len(chunk)
        if have >= need:
            return b"".join(parts)


def _read(conn: Any, rfile: Any, size: int) -> bytes:
    try:
        chunk = rfile.read1(size)
    except OSError as e:
        conn._force_close()
        from pymysql import err
        raise err.OperationalError(2013, f"{LOST} ({e})") from None
    if not chunk:
        conn._force_close()
        from pymysql import err
        raise err.OperationalError(2013, LOST)
    return bytes(chunk)
