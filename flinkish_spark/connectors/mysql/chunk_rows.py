"""A snapshot chunk of a MySQL/MariaDB table, read in a consistent snapshot of its own: typed Arrow, or stream rows.

What it guarantees: :func:`read_chunk_rows` yields the chunk's ``s`` row and then its ``r`` rows (``B``/``E``
around a re-snapshot's chunks), the ``s`` row describing exactly the rows after it -- the columns come from
``information_schema``, which is not part of the snapshot, so a DDL statement that overtakes the snapshot
makes InnoDB refuse the chunk's query ("Table definition has changed", 1412) and the chunk is taken again in
a new snapshot. A table that is gone gives nothing. Chunk bounds travel as JSON in the split's payload
(:func:`bound_to_json`, :func:`bound_of_json`). With ``rowFormat=arrow`` the ``r`` rows come as packs made from
the chunk's typed Arrow (:mod:`.packed_chunks`: the values the JSON rows would be packed to).
"""

from __future__ import annotations

import base64
import datetime
from decimal import Decimal
from typing import Any, Iterator

import pyarrow as pa

from flinkish_spark.connectors.cdc.stream import (
    RESNAPSHOT_BEGIN, RESNAPSHOT_END, STREAM_ARROW, marker, schema_row, snapshot_rows,
)
from flinkish_spark.connectors.mysql.packed_chunks import chunk_packs
from flinkish_spark.connectors.mysql.snapshot import Chunk, TableInfo, begin_snapshot, read_chunk, table_info
from flinkish_spark.connectors.mysql.stream_rows import row_encoder, schema_of_info

#: How often a chunk is taken again when a DDL statement overtook its snapshot (:func:`read_chunk_rows`).
CHUNK_ATTEMPTS = 20
_ER_TABLE_DEF_CHANGED = 1412


def _definition_changed(exc: BaseException) -> bool:
    return bool(exc.args) and exc.args[0] == _ER_TABLE_DEF_CHANGED


def bound_to_json(value: Any) -> Any:
    """A key value as JSON (the chunk's payload); :func:`bound_of_json` gives a query parameter back."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return {"text": str(value)}  # as the server prints it: compares as the column's type
    raise TypeError(f"a primary key value of type {type(value).__name__} cannot be a chunk bound")


def bound_of_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "decimal" in value:
            return Decimal(value["decimal"])
        if "bytes" in value:
            return base64.b64decode(value["bytes"])
        return value["text"]
    return value


def chunk_table(chunk: dict[str, Any], conn: Any) -> tuple[TableInfo, Chunk] | None:
    """In the chunk's snapshot (begun on ``conn``): the table's info and the chunk, None when it is gone."""
    db, table = str(chunk["database"]), str(chunk["name"])
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (db, table))
        if cur.fetchone() is None:
            return None
    lo, hi = chunk.get("lo"), chunk.get("hi")
    return table_info(conn, db, table), Chunk(None if lo is None else tuple(bound_of_json(v) for v in lo),
                                               None if hi is None else tuple(bound_of_json(v) for v in hi))


def read_chunk_arrow(chunk: dict[str, Any], conn: Any) -> Iterator[pa.RecordBatch]:
    """A chunk (its split's payload) in a consistent snapshot of its own, as Arrow typed by :mod:`.types`;
    nothing when the table is gone."""
    begin_snapshot(conn)
    try:
        found = chunk_table(chunk, conn)
        if found is not None:
            yield from read_chunk(conn, *found)
    finally:
        conn.rollback()


def read_chunk_rows(chunk: dict[str, Any], conn: Any, packed: bool = False) -> Iterator[pa.RecordBatch]:
    """A chunk as stream rows: its ``s`` row (the columns in the chunk's own snapshot), then its ``r`` rows, with
    ``B`` before a re-snapshot's first chunk and ``E`` after its last (as the PostgreSQL source). ``packed``
    (``rowFormat=arrow``): the ``r`` rows as packs made from the typed Arrow (:mod:`.packed_chunks`), the ``s``
    and ``B``/``E`` rows as they are (the reader's Packer packs them and passes the packs through).

    The columns come from ``information_schema``, which is not part of the snapshot: a DDL statement between
    the snapshot's start and the chunk's query makes InnoDB refuse the query ("Table definition has changed",
    1412), and the chunk is taken again in a new snapshot -- so the ``s`` row always describes the rows after it."""
    for attempt in range(CHUNK_ATTEMPTS):
        begin_snapshot(conn)
        try:
            found = chunk_table(chunk, conn)
            if found is None:
                return
            info, part = found
            batches = read_chunk(conn, info, part)
            try:
                first = next(batches, None)  # the query runs here: a changed definition fails before any row
            except Exception as e:
                if _definition_changed(e) and attempt + 1 < CHUNK_ATTEMPTS:
                    continue
                raise
            schema = schema_of_info(info)
            yield pa.RecordBatch.from_pylist([schema_row(schema, None, None, None)], schema=STREAM_ARROW)
            bracketed = bool(chunk.get("resnapshot"))
            if bracketed and part.lo is None:
                yield marker(schema, RESNAPSHOT_BEGIN)
            encode = row_encoder(schema)
            for batch in ([] if first is None else [first]), batches:
                for b in batch:
                    if not b.num_rows:
                        continue
                    if packed:
                        yield chunk_packs(schema, b)
                        continue
                    columns = [c.to_pylist() for c in b.columns]
                    yield snapshot_rows(schema, pa.array([encode(v) for v in zip(*columns)], pa.string()))
        finally:
            conn.rollback()
        if bracketed and part.hi is None:
            yield marker(schema, RESNAPSHOT_END)
        return
