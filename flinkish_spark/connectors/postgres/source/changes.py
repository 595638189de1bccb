"""Reading the slot without consuming it (peek), and the text values of pgoutput as Python values."""

from __future__ import annotations

import time
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Callable

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
