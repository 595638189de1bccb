"""PostgreSQL's reads for a multi-table source (executors): stream rows (:mod:`..rows`) from chunks and WAL ranges.

The reader itself -- a task's connection for its chunks, the patterns check, the planned keys of an
epoch -- is the CDC core's (:class:`flinkish_spark.connectors.cdc.tables_reader.TablesReaderCore`),
which calls these through :class:`.dialect.PostgresDialect`.

* **A chunk** is read in one ``REPEATABLE READ`` transaction through ADBC: the table's schema
  from the catalog and its rows as JSON built by the server (``rows.row_sql``), both in the same
  snapshot, so the ``s`` row describes exactly the rows after it. The snapshot is accepted
  only if (1) no transaction it sees as running has already committed (a commit whose WAL
  record is flushed but that is not visible yet, e.g. waiting for a synchronous standby) and
  (2) for a table that joined while running, every transaction older than the moment it
  joined has ended (``after_xid``); otherwise the transaction is rolled back and taken again.
  Why: docs/postgres-source.md, "New tables".
* **A WAL range** ``[start, end)`` is peeked from the slot -- fetched in pieces
  (:func:`.changes.peek_pieces`), so one transaction of millions of rows is never held whole -- and
  decoded in WAL order, yielding Arrow batches as it goes. Every
  change of a table that matches the patterns becomes a row; before a table's first row, and
  whenever its Relation message announces other columns, an ``s`` row with its schema. The key
  of a table with a replica identity other than DEFAULT is the one recorded when it was planned,
  in the registries the epoch's checkpoint names (:func:`flinkish_spark.connectors.cdc.registry.planned_keys`): every read of
  a range -- also a replay after the table was dropped -- gives the same schema.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa

from flinkish_spark.connectors.cdc.stream import (
    RESNAPSHOT_BEGIN, RESNAPSHOT_END, STREAM_ARROW, marker, schema_row, snapshot_rows,
)
from flinkish_spark.connectors.postgres.connection import adbc_connect, connect
from flinkish_spark.connectors.postgres.pgoutput import Relation, relations_in
from flinkish_spark.connectors.postgres.rows import TableSchema, row_sql
from flinkish_spark.connectors.postgres.rows.encode import session_settings_sql
from flinkish_spark.connectors.postgres.source.catalog import RelationSchemas, load_table_schema, psycopg_query
from flinkish_spark.connectors.postgres.source.changes import peek_pieces
from flinkish_spark.connectors.postgres.source.packed_rows import chunk_pack, chunk_select, packed_pieces
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.stream_rows import (  # noqa: F401 (stream_batches: its old home)
    stream_batches, stream_pieces,
)
from flinkish_spark.errors import PostgresSourceError

#: How long a chunk read waits for a snapshot it may use (see the module docstring) before failing.
SNAPSHOT_WAIT_S = 600.0



# -- chunks -------------------------------------------------------------------------------------------


def chunk_connection(src: PostgresSourceHost) -> Any:
    conn = adbc_connect(src.conn_info)
    cur = conn.cursor()
    for statement in session_settings_sql():
        cur.execute(statement)
    cur.close()
    conn.commit()  # session settings, outside any chunk's transaction (a chunk's retry rolls that back)
    return conn


def read_chunk(src: PostgresSourceHost, chunk: dict[str, Any], conn: Any) -> Iterator[pa.RecordBatch]:
    """One chunk's stream rows, in a transaction of its own on ``conn`` (see the module docstring)."""
    cur = conn.cursor()
    try:
        found = _snapshot(src, cur, conn, chunk)
        if found is None:
            conn.rollback()
            return  # the table was dropped: nothing to read
        schema, name = found
        yield pa.RecordBatch.from_pylist([schema_row(schema, None, None, None)], schema=STREAM_ARROW)
        # A re-snapshot after a lost slot is bracketed per table: its first chunk (no lower bound)
        # opens it, its last (no upper bound) closes it (rows.RESNAPSHOT_BEGIN / _END).
        if chunk.get("resnapshot") and chunk.get("lo") is None:
            yield marker(schema, RESNAPSHOT_BEGIN)
        packed = getattr(src, "row_format", "json") == "arrow"  # typed from the columns' text (packed_rows)
        select = chunk_select(schema) if packed else f"{row_sql(schema)} AS row"
        cur.execute(f"SELECT {select} FROM {name} WHERE {_bounds(chunk)}")
        for batch in cur.fetch_record_batch():
            n = batch.num_rows
            if n and packed:
                yield chunk_pack(schema, batch)
            elif n:
                yield snapshot_rows(schema, batch.column(0).cast(pa.string()))
        conn.commit()
        if chunk.get("resnapshot") and chunk.get("hi") is None:
            yield marker(schema, RESNAPSHOT_END)
    except Exception as e:
        if isinstance(e, PostgresSourceError):
            raise
        raise PostgresSourceError(f"{src.component}: reading a chunk of {chunk.get('table')} failed: "
                                  f"{src.conn_info.mask(str(e))}") from None
    finally:
        cur.close()


def _snapshot(src: PostgresSourceHost, cur: Any, conn: Any, chunk: dict[str, Any]) -> tuple[TableSchema, str] | None:
    """Open the chunk's transaction on a snapshot it may use; the table's schema in it and its name as SQL
    (quoted where needed), or None when it was dropped."""
    oid, after = int(chunk["oid"]), chunk.get("after_xid")

    def query(sql: str) -> list[Any]:
        cur.execute(sql)
        return list(cur.fetchall())

    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while True:
        rows = query(f"SELECT oid::regclass::text FROM pg_class WHERE oid = {oid}")
        conn.rollback()
        if not rows:
            return None
        name = str(rows[0][0])
        # The lock before the first query (which takes the snapshot): the columns stay as the snapshot sees them.
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        try:
            cur.execute(f"LOCK TABLE {name} IN ACCESS SHARE MODE")
        except Exception:  # dropped or renamed in between: look again
            conn.rollback()
            continue
        xmin, hung, same = query(
            "SELECT pg_snapshot_xmin(s)::text, (SELECT count(*) FROM pg_snapshot_xip(s) x "
            f"WHERE pg_xact_status(x) = 'committed'), to_regclass({_literal(name)}) = {oid}::oid "
            "FROM pg_current_snapshot() s")[0]
        if not same:
            conn.rollback()
            continue
        if int(hung) == 0 and (after is None or int(xmin) >= int(after)):
            schema = load_table_schema(query, oid)
            assert schema is not None  # locked and present in this snapshot
            schema = _kept(src, schema)  # the option 'transforms': the columns left out are never read
            return schema, name
        conn.rollback()
        if time.monotonic() >= deadline:
            waiting = query("SELECT pid, (now() - xact_start)::text FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
                            "ORDER BY xact_start LIMIT 3")
            raise PostgresSourceError(
                f"{src.component}: the snapshot of {chunk.get('table')} waited {SNAPSHOT_WAIT_S:.0f}s for "
                + ("transactions that were open when the table joined" if int(hung) == 0 else
                   "committed transactions to become visible (a synchronous standby that does not answer?)")
                + f" to end; the oldest open transactions: {', '.join(f'pid {p} ({a})' for p, a in waiting) or 'none'}. "
                "End them (or wait), then restart"
            )
        time.sleep(0.2)


def _kept(src: PostgresSourceHost, schema: TableSchema) -> TableSchema:
    """``schema`` with the columns the option ``transforms`` keeps (source.columns); a host without the option (a
    reader's test double) keeps every one."""
    columns = getattr(src, "source_columns", None)
    return schema if not columns else columns.schema(schema, src.component)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _bounds(chunk: dict[str, Any]) -> str:
    """The chunk's WHERE condition, its bounds as literals (ADBC streams only a query without parameters)."""
    from psycopg import sql

    col = '"' + str(chunk["column"]).replace('"', '""') + '"'
    cast = str(chunk["type"])
    where = []
    if chunk.get("lo") is not None:
        where.append(f"{col} >= {sql.Literal(chunk['lo']).as_string().strip()}::{cast}")
    if chunk.get("hi") is not None:
        where.append(f"{col} < {sql.Literal(chunk['hi']).as_string().strip()}::{cast}")
    cond = " AND ".join(where) if where else "TRUE"
    return f"({cond}) OR {col} IS NULL" if chunk.get("hi") is None else cond


# -- changes --------------------------------------------------------------------------------------------


def read_changes(src: PostgresSourceHost, start: int, end: int,
                 planned_keys: Callable[[], Mapping[int, tuple[str, ...]]] | None = None,
                 peeked: list[list[bytes]] | None = None) -> Iterator[pa.RecordBatch]:
    """The stream rows of the WAL range ``[start, end)``; ``planned_keys``: the tables' keys as the epoch was
    planned (see the module docstring; None -- a read outside an epoch -- takes them from the catalog); ``peeked``:
    the slot's messages up to ``end`` if they were already fetched (:func:`.changes.take_peeked`), else peeked."""
    assert src.patterns is not None
    patterns = src.patterns
    with connect(src.conn_info, autocommit=True) as conn:
        for statement in session_settings_sql():
            conn.execute(statement)
        planned = None if planned_keys is None else functools.cache(planned_keys)
        schemas = RelationSchemas(psycopg_query(conn), planned)
        relations: dict[int, Relation] = {}

        def pieces() -> Iterator[list[bytes]]:
            # The range piece by piece (one big transaction is millions of messages): each piece's new relations
            # resolved at once (one catalog query for a piece of many tables), before any of its changes.
            for piece in peek_pieces(conn, src.slot_name, src.publication, end) if peeked is None else peeked:
                found = relations_in(piece)
                schemas.prepare(r for r in found.values() if patterns.matches(f"{r.namespace}.{r.name}"))
                relations.update(found)
                yield piece

        def resolve(rel: Relation) -> TableSchema | None:
            if not patterns.matches(f"{rel.namespace}.{rel.name}"):
                return None
            # The option 'transforms': a column the publication still sends (PostgreSQL before 15, REPLICA IDENTITY
            # FULL, a publication given) is dropped here, before any row is made -- it never leaves the source task.
            schema = _kept(src, schemas.schema(rel))
            if not schema.key and planned is not None and rel.relid not in planned():
                # A table left out for want of a key (the enumerator warns), published by a publication
                # the user gave (FOR ALL TABLES): not followed. A followed table that lost its key is
                # planned, and its keyless schema reaches the sink, which says what to do.
                return None
            return schema

        packed = getattr(src, "row_format", "json") == "arrow"  # bulk runs typed from the messages (packed_rows)
        yield from (packed_pieces if packed else stream_pieces)(src, pieces(), start, end, relations, resolve)
