"""Reading the slot without consuming it (peek), and the text values of pgoutput as Python values.

:func:`peek` returns a range's messages as one list; :func:`peek_pieces` hands them out in pieces of a bounded
number, so a reader of a range holds one piece at a time whatever the range holds -- the server decodes a
transaction only whole (a peek stops only at a transaction's end), so a range holds at least one whole
transaction, and one ``UPDATE`` of millions of rows is millions of messages (docs/postgres-source.md, "Big
transactions").
"""

from __future__ import annotations

import time
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
    """The messages of :func:`peek`, ``piece`` at a time, through a server-side cursor.

    The server still decodes the whole range before the first piece (into its own tuple store, which spills to a
    temporary file past ``work_mem``); the client holds one piece. The cursor lives in a transaction of its own on
    ``conn`` (an autocommit connection), open until the generator ends or is closed: other queries on ``conn`` (the
    catalog's) may run between two pieces. The same messages in the same order as :func:`peek`.
    """
    sql = ("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
           "'proto_version', '1', 'publication_names', %s)")
    params = (slot, format_lsn(upto), nchanges, publication)

    def first() -> tuple[Any, Any, list[bytes]]:
        tx = conn.transaction()
        tx.__enter__()
        try:
            cur = conn.cursor(name="flinkish_peek", binary=True)
            cur.execute(sql, params)
            return tx, cur, [bytes(r[0]) for r in cur.fetchmany(piece)]
        except BaseException as e:
            tx.__exit__(type(e), e, e.__traceback__)  # rolled back: a busy slot is tried again
            raise

    tx, cur, rows = with_busy_slot(first)
    try:
        while rows:
            yield rows
            if len(rows) < piece:
                break
            rows = [bytes(r[0]) for r in cur.fetchmany(piece)]
        cur.close()
    except BaseException as e:
        tx.__exit__(type(e), e, e.__traceback__)
        raise
    tx.__exit__(None, None, None)


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
