"""A text-protocol result's row packets split into Arrow binary columns, column by column over a block of rows.

:func:`.snapshot.read_chunk` reads a chunk's ``SELECT`` unbuffered. Splitting each row packet's length-encoded values
in a Python loop cost ~1.5 us a row of six columns (most of a snapshot task's CPU, docs/benchmarks.md); here the
socket is read in blocks of :data:`.socket_blocks.BLOCK` bytes (a block's rows are split together), one Python
step per row finds the packets (a 4-byte header each), and then each column is cut out of every row of the block at
once with numpy: the length byte of every row's value at its position, the positions of the next column from it,
the values gathered into one Arrow binary array (its validity from the NULL markers). What it guarantees:

* **The same columns as the server sent**: value for value the bytes of the text protocol (``None`` for NULL), as
  the loop before (tests/connectors/mysql/test_row_packets.py compares both on NULLs, empty values, values of
  250-251 bytes and more -- a length prefix of 3 and 4 bytes -- and rows split across blocks).
* **The protocol's rules**: each packet's sequence number checked, a row of 16 MiB and more (several packets)
  joined, an error packet raised as PyMySQL raises it, a lost connection as PyMySQL's ``OperationalError``; at
  the result's end (the EOF packet) the cursor is left as PyMySQL leaves it. Nothing past the EOF packet is read
  (the server sends nothing more until the next command). A read left part way (its generator closed) reads the
  rest of the result off the connection, as PyMySQL does: the bytes taken in a block are not PyMySQL's to find.
"""

from __future__ import annotations

from typing import Any, Generator, Iterator

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.mysql.socket_blocks import more as _more

_MAX = 0xFFFFFF


def column_blocks(result: Any, ncols: int, rows: int = 8192) -> Iterator[list[pa.Array]]:
    """The rows of an unbuffered PyMySQL ``result`` of ``ncols`` columns as lists of ``ncols`` binary arrays of
    ``rows`` rows each, the last fewer (see the module docstring). Closed before its end, it reads the rest of the
    result off the connection (as PyMySQL does), which stays usable."""
    blocks = _blocks(result, ncols)
    pending: list[list[pa.Array]] = []
    have = 0
    try:
        for block in blocks:
            pending.append(block)
            have += len(block[0])
            while have >= rows:
                joined = _joined(pending)
                yield [a.slice(0, rows) for a in joined]
                have -= rows
                pending = [[a.slice(rows) for a in joined]] if have else []
        if have:
            yield _joined(pending)
    finally:
        blocks.close()


def _joined(parts: list[list[pa.Array]]) -> list[pa.Array]:
    if len(parts) == 1:
        return parts[0]
    return [pa.concat_arrays([p[k] for p in parts]) for k in range(len(parts[0]))]


def _finish(result: Any) -> None:
    """What PyMySQL does at an unbuffered result's end: the cursor closes cleanly, the connection takes commands."""
    result.unbuffered_active = False
    result.connection = None
    result.rows = None


def _blocks(result: Any, ncols: int) -> Generator[list[pa.Array], None, None]:
    conn = result.connection
    rfile = conn._rfile
    seq = conn._next_seq_id
    buf = b""
    pos = 0  # the next packet's header in buf
    done = False  # the result's end (or its error) was read: nothing of it is left on the connection
    try:
        while True:
            tail = buf[pos:]
            # at least the next packet whole (a row over a block is read at once, not a block at a time)
            need = 4 if len(tail) < 4 else 4 + (tail[0] | tail[1] << 8 | tail[2] << 16)
            buf = _more(conn, rfile, tail, min(need, 4 + _MAX))
            pos, n = 0, len(buf)
            starts: list[int] = []
            joined: list[tuple[int, bytes]] = []  # (row index, payload) of rows of several packets
            while pos + 4 <= n:
                size = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
                stop = pos + 4 + size
                if stop > n:
                    break
                if buf[pos + 3] != seq:
                    conn._force_close()
                    from pymysql import err
                    raise err.InternalError(f"Packet sequence number wrong - got {buf[pos + 3]} expected {seq}")
                if size == _MAX:
                    payload, stop, seq, buf, n = _long_row(conn, rfile, buf, pos, seq)
                    joined.append((len(starts), payload))
                    starts.append(-1)
                    pos = stop
                    continue
                seq = (seq + 1) & 255
                first = buf[pos + 4]
                if first == 0xFE and size < 9:  # EOF: the end of the rows
                    done = True
                    pos = stop
                    break
                if first == 0xFF:  # an error ends the result: the rows before it are of no use
                    done = True
                    conn._next_seq_id = seq
                    _raise_error(conn, buf[pos + 4:stop])
                starts.append(pos + 4)
                pos = stop
            conn._next_seq_id = seq
            block = _columns(buf, starts, joined, ncols) if starts else None
            if done:
                _finish(result)
            if block is not None:
                yield block
            if done:
                return
    finally:
        if not done and conn._sock is not None:  # left part way (or failed in between): read the rest off
            _drain(conn, rfile, buf[pos:], seq)
            _finish(result)


def _drain(conn: Any, rfile: Any, tail: bytes, seq: int) -> None:
    """The rest of a result read and dropped, from ``tail`` (the bytes read after the last packet taken) on."""
    continued = False  # the packet before was 16 MiB: this one continues its row (its first byte is no marker)
    while True:
        if len(tail) < 4:
            tail = _more(conn, rfile, tail, 4)
        size = tail[0] | tail[1] << 8 | tail[2] << 16
        if len(tail) < 4 + size:
            tail = _more(conn, rfile, tail, 4 + size)
        seq = (seq + 1) & 255
        first = tail[4] if size else -1
        conn._next_seq_id = seq
        if not continued and (first == 0xFF or (first == 0xFE and size < 9)):
            return
        continued = size == _MAX
        tail = tail[4 + size:]


def _long_row(conn: Any, rfile: Any, buf: bytes, pos: int, seq: int) -> tuple[bytes, int, int, bytes, int]:
    """A row of several packets (16 MiB and more) starting at ``pos``: (its payload, where the packet after it
    starts, the next sequence number, the buffer -- grown by what was read --, its length)."""
    parts = []
    while True:
        if pos + 4 > len(buf):
            buf = _more(conn, rfile, buf, pos + 4)
        if pos + 4 + (buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16) > len(buf):
            buf = _more(conn, rfile, buf, pos + 4 + (buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16))
        size = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
        if buf[pos + 3] != seq:
            conn._force_close()
            from pymysql import err
            raise err.InternalError(f"Packet sequence number wrong - got {buf[pos + 3]} expected {seq}")
        seq = (seq + 1) & 255
        parts.append(buf[pos + 4:pos + 4 + size])
        pos += 4 + size
        if size < _MAX:
            return b"".join(parts), pos, seq, buf, len(buf)


def _raise_error(conn: Any, payload: bytes) -> None:
    from pymysql.protocol import MysqlPacket

    if conn._result is not None:
        conn._result.unbuffered_active = False
    MysqlPacket(payload, conn.encoding).raise_for_error()
    raise AssertionError("unreachable")  # raise_for_error raises


def _columns(buf: bytes, starts: list[int], joined: list[tuple[int, bytes]], ncols: int) -> list[pa.Array]:
    """The rows at ``starts`` in ``buf`` (rows of several packets: ``joined``, at ``-1``) cut into columns."""
    if joined:  # rare: put every row in a buffer of its own rows, contiguous
        long_rows = dict(joined)
        parts, at, moved = [], 0, []
        for i, s in enumerate(starts):
            if s >= 0:
                size = buf[s - 4] | buf[s - 3] << 8 | buf[s - 2] << 16
                parts.append(buf[s:s + size])
            else:
                parts.append(long_rows[i])
            moved.append(at)
            at += len(parts[-1])
        buf, starts = b"".join(parts), moved
    data = np.frombuffer(buf, dtype=np.uint8)
    pos = np.array(starts, dtype=np.int64)
    out = []
    for _ in range(ncols):
        first = data[pos]
        lengths = first.astype(np.int64)
        offsets = pos + 1
        odd = first >= 251
        valid = None
        if odd.any():
            null = first == 251
            lengths[null] = 0
            valid = ~null
            for width, mark in ((2, 252), (3, 253), (8, 254)):
                rows = np.nonzero(first == mark)[0]
                if len(rows):
                    value = np.zeros(len(rows), dtype=np.int64)
                    for b in range(width):
                        value |= data[pos[rows] + 1 + b].astype(np.int64) << (8 * b)
                    lengths[rows] = value
                    offsets[rows] = pos[rows] + 1 + width
        out.append(_binary(data, offsets, lengths, valid))
        pos = offsets + lengths
    return out


def _binary(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """A binary array of the ``lengths`` bytes at ``offsets`` of ``data`` (null where ``valid`` is False)."""
    n = len(lengths)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if n else 0  # < 2 GiB: a block of socket_blocks.BLOCK and a row (max_allowed_packet <= 1 GiB)
    value_offsets = np.zeros(n + 1, dtype=np.int32)
    value_offsets[1:] = ends
    if total:
        # every value byte's place in data: its value's offset, plus its place within the value
        index = np.repeat(offsets - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)
        values = pa.py_buffer(data[index].tobytes())
    else:
        values = pa.py_buffer(b"")
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    nulls = 0 if valid is None else int(n - valid.sum())
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(value_offsets.tobytes()), values],
                                 null_count=nulls)
