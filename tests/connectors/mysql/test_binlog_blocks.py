"""A non-blocking dump's packets read off the socket in blocks (binlog._block_events) are the events PyMySQL's packet
reader gives, whatever the socket hands over at a time: each event without its status byte and CRC32, an event of
16 MiB and more joined from its packets, the end at the EOF packet; an error packet is PyMySQL's error, a lost
connection its OperationalError (2013), a packet out of sequence its InternalError -- the connection closed."""

from __future__ import annotations

import pymysql
import pytest

from flinkish_spark.connectors.mysql.binlog import _block_events

_MAX = 0xFFFFFF


class _Conn:
    """What _block_events uses of a PyMySQL connection, its socket handing over at most ``chunk`` bytes a read."""

    def __init__(self, stream: bytes, chunk: int) -> None:
        self._rfile, self._stream, self._at, self._chunk = self, stream, 0, chunk
        self._read_timeout = self._current_timeout = None
        self._next_seq_id, self.encoding, self.closed = 1, "utf8", False

    def read1(self, size: int) -> bytes:
        out = self._stream[self._at:self._at + min(size, self._chunk)]
        self._at += len(out)
        return out

    def _force_close(self) -> None:
        self.closed = True


def _packets(payloads: list[bytes], seq: int = 1) -> bytes:
    out = []
    for payload in payloads:
        pieces = [payload[i:i + _MAX] for i in range(0, len(payload), _MAX)]
        if len(payload) % _MAX == 0:
            pieces.append(b"")  # a payload of a multiple of 16 MiB - 1 ends with an empty packet
        for piece in pieces:
            out.append(len(piece).to_bytes(3, "little") + bytes([seq & 255]) + piece)
            seq += 1
    return b"".join(out)


_EOF = b"\xfe\x00\x00\x02\x00"


@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_events_are_cut_out_of_blocks_whatever_the_socket_gives_at_a_time(chunk: int) -> None:
    events = [bytes([i % 256]) * (19 + i * 37) for i in range(300)]  # 300 packets: the sequence number wraps
    conn = _Conn(_packets([b"\x00" + e + b"CRC!" for e in events] + [_EOF]) + b"next", chunk)
    assert list(_block_events(conn, 4)) == events
    assert not conn.closed
    assert list(_block_events(_Conn(_packets([b"\x00" + e for e in events[:3]] + [_EOF]), chunk), 0)) == events[:3]


def test_an_event_of_16_mib_and_more_is_joined_from_its_packets() -> None:
    big, exact = b"b" * (_MAX + 10), b"e" * (_MAX - 5)  # the second's payload (status, event, CRC) is 16 MiB - 1
    conn = _Conn(_packets([b"\x00" + big + b"CRC!", b"\x00smallCRC!", b"\x00" + exact + b"CRC!", _EOF]), 1 << 20)
    assert list(_block_events(conn, 4)) == [big, b"small", exact]


def test_an_error_packet_a_lost_connection_and_a_packet_out_of_sequence_are_pymysqls_errors() -> None:
    error = b"\xff" + (1236).to_bytes(2, "little") + b"#HY000" + b"could not find next log"
    with pytest.raises(pymysql.MySQLError) as raised:
        list(_block_events(_Conn(_packets([b"\x00event-1CRC!", error]), 3), 4))
    assert raised.value.args == (1236, "could not find next log")

    conn = _Conn(_packets([b"\x00event-1CRC!", b"\x00event-2CRC!"])[:-3], 3)
    events = _block_events(conn, 4)
    assert next(events) == b"event-1"
    with pytest.raises(pymysql.err.OperationalError) as lost:
        next(events)
    assert lost.value.args[0] == 2013 and conn.closed

    conn = _Conn(_packets([b"\x00event-1CRC!"]) + _packets([b"\x00event-2CRC!"], seq=7), 4096)
    with pytest.raises(pymysql.err.InternalError, match="got 7 expected 2"):
        list(_block_events(conn, 4))
    assert conn.closed
