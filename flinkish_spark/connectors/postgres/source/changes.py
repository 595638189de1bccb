"""Reading the slot without consuming it (peek), and the text values of pgoutput as Python values.

:func:`peek` returns a range's messages as one list; :func:`peek_pieces` hands them out in pieces of a bounded
number, so a reader of a range holds one piece at a time whatever the range holds -- the server decodes a
transaction only whole (a peek stops only at a transaction's end), so a range holds at least one whole
transaction, and one ``UPDATE`` of millions of rows is millions of messages (docs/postgres-source.md, "Big
transactions").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Callable, Generator

from flinkish_spark.connectors.postgres.pgoutput import format_lsn
from flinkish_spark.connectors.postgres.source.tables import ColumnInfo

#: How long a reader waits for a slot that a killed run's backend still holds.
SLOT_BUSY_WAIT_S = 60.0


def peek(conn: Any, slot: str, publication: str, upto: int, nchanges: int | None) -> list[bytes]:
    def run() -> list[bytes]:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            "'proto_version', '1', 'publication_names', %s)",
            (slot, format_lsn(upto), nchanges, publication),
        ).fetchall()
        return [bytes(r[0]) for r in rows]

    return with_busy_slot(run)


#: Messages per piece of :func:`peek_pieces` (~100-200 bytes each for a row of a few columns: a piece is a few MB).
PEEK_PIECE = 20_000


def peek_pieces(conn: Any, slot: str, publication: str, upto: int, nchanges: int | None = None,
                piece: int = PEEK_PIECE) -> Generator[list[bytes], None, None]:
    """The messages of :func:`peek`, ``piece`` at a time, through a server-side cursor ``WITH HOLD``.

    The server decodes the range when the cursor is declared and keeps the result (a tuple store, which spills to a
    temporary file past ``work_mem``) until the cursor is closed; the client holds one piece. ``WITH HOLD`` on the
    autocommit connection: no transaction -- no snapshot holding back vacuum -- stays open while a big range is
    read at the pace of its consumer, and ``conn`` takes other queries (the catalog's) between two pieces. The same
    messages in the same order as :func:`peek`. The cursor is closed when the last piece is fetched, or when the
    generator is closed.
    """
    sql = ("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
           "'proto_version', '1', 'publication_names', %s)")
    params = (slot, format_lsn(upto), nchanges, publication)

    def declare() -> Any:
        cur = conn.cursor(name="flinkish_peek", binary=True, withhold=True)
        try:
            cur.execute(sql, params)  # a busy slot fails here: tried again
        except BaseException:
            cur.close()
            raise
        return cur

    cur = with_busy_slot(declare)
    try:
        while True:
            rows = [bytes(r[0]) for r in cur.fetchmany(piece)]
            if len(rows) < piece:
                cur.close()  # the last piece: the server's copy of the range goes before the consumer takes it
                if rows:
                    yield rows
                return
            yield rows
    finally:
        cur.close()


#: The most bytes of messages a bounding peek keeps for the epoch's planning read (:func:`keep_peeked`); past it, the
#: planning read peeks the range again. About two epochs of the mirror's default 200,000 changes of narrow rows.
KEEP_PEEKED_BYTES = 64 << 20


@dataclass(frozen=True)
class PeekedRange:
    """The messages a bounding peek fetched: every message of the slot up to the range ending at ``end``."""

    slot: str
    end: int
    pieces: tuple[list[bytes], ...]


_peeked: PeekedRange | None = None


def keep_peeked(range_: PeekedRange | None) -> None:
    """Keep (or, with None, drop) the messages of the range just bounded, for :func:`take_peeked` in this process.

    Why it is exact: a peek returns whole transactions in commit order from the slot's confirmed position, which
    never passes an epoch not yet committed; so the messages a peek fetched that stopped at the range's last
    transaction (or at ``end``) are the messages a later peek up to ``end`` returns -- the same transactions, plus
    perhaps older ones the slot has not yet been advanced past, which every read skips by their commit position.
    """
    global _peeked
    _peeked = range_


def has_peeked(slot: str, end: int) -> bool:
    """Whether this process keeps the messages of the range ending at ``end`` on ``slot``."""
    return _peeked is not None and (_peeked.slot, _peeked.end) == (slot, end)


def take_peeked(slot: str, end: int) -> list[list[bytes]] | None:
    """The kept messages of the range ending at ``end`` on ``slot`` (once: they are dropped), or None."""
    global _peeked
    kept, _peeked = _peeked, None
    if kept is None or kept.slot != slot or kept.end != end:
        return None
    return list(kept.pieces)


def with_busy_slot(fn: Callable[[], Any]) -> Any:
    """Run ``fn``, waiting while the slot is held by another backend (a killed run's peek ends soon)."""
    psycopg = __import__("psycopg")
    deadline = time.time() + SLOT_BUSY_WAIT_S
    while True:
        try:
            return fn()
        except psycopg.errors.ObjectInUse:
            if time.time() >= deadline:
                raise
            time.sleep(0.5)


def text_converter(col: ColumnInfo) -> Callable[[str], object]:
    t = col.pg_type
    if t in ("int2", "int4", "int8"):
        return int
    if t in ("float4", "float8"):
        return float
    if t == "bool":
        return lambda v: v == "t"
    if t == "date":
        return date.fromisoformat
    if t == "timestamp":
        return datetime.fromisoformat
    if t == "timestamptz":
        return lambda v: datetime.fromisoformat(v).astimezone(timezone.utc)
    if t == "bytea":
        return lambda v: bytes.fromhex(v[2:]) if v.startswith("\\x") else v.encode()
    if col.spark_type.startswith("decimal"):
        return Decimal
    return str
