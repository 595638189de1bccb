"""The rows of a multi-table ``flinkish.postgres`` stream (option ``tables``): one Spark schema for every table.

This module is the contract between the source and whatever consumes the stream (routing
sinks, ``foreachBatch`` code, Spark SQL). Every row has these columns
(:data:`STREAM_DDL`)::

    _table      string     'schema.table' (unquoted)
    _op         string     r  snapshot read            (a full row)
                           c  insert, u  update        (a full row, the new image)
                           d  delete                   (the key columns only)
                           t  truncate                 (every row of the table is gone; row is null)
                           s  schema                   (row holds the TableSchema JSON)
                           B, E  a re-snapshot after a lost slot (onSlotLost=resnapshot) of the table
                              begins / ends (row is null): a keyed target deletes, at the end of the
                              epoch holding E, every key that no r row of the epochs from B's to E's
                              carried -- the deletes of the gap are lost with the slot; no change of
                              any table comes between B and E
    _lsn        bigint     commit LSN of the change's transaction; null for snapshot rows (r and their s)
    _seq        int        ordinal of the row in its transaction (s rows included); null for snapshot rows
    _commit_ts  timestamp  commit time of the transaction; null for snapshot rows
    _schema_id  string     the schema ``row`` is written in (a content hash of table, columns, key)
    row         string     the row as a JSON object, keys = column names (encoding: :mod:`.schema`); an
                           update that left a TOASTed value unchanged omits that column and lists it in the
                           field ``"\\u0000unchanged"`` (:data:`UNCHANGED_FIELD`): a keyed target keeps its
                           stored value (:func:`split_tables` gives the list as the column ``_unchanged``)

Guarantees a consumer can build on:

1. **WAL order.** An epoch's change rows are one Spark partition in commit order, then order
   within the transaction; ``(_lsn, _seq)`` is strictly increasing along the stream, across
   epochs too. An update of a key is a ``d`` of the old key followed by a ``u`` of the new row.
2. **Self-describing epochs.** Every partition holds an ``s`` row for each schema its data rows
   name, ahead of them (for changes: right before the first row that uses it, with that row's
   ``_lsn`` and the ``_seq`` before it). So one epoch's rows always contain every schema needed to
   decode them: a sink on any machine, on a replay too, needs no registry and no earlier epoch.
3. **Schema changes in order.** After ``ALTER TABLE`` the first change of the table comes after an
   ``s`` row with its new columns (pgoutput's Relation message, decoded with the catalog of that
   moment). Rows of the old and the new schema may share an epoch; each names its own.
   The ``s`` row's ``key`` is the table's primary key at that moment.
4. **Snapshot rows and changes.** A table's snapshot rows (``r``) can share an epoch with its
   changes when it joined while the stream ran; a keyed sink may apply them in any interleaving
   that keeps the change rows in ``(_lsn, _seq)`` order (docs/postgres-source.md, "New tables").

The source option ``rowFormat=arrow`` gives the same rows in a packed shape instead: one row per run of up to
65,536 changes of one table, typed inside an Arrow IPC stream (:mod:`.packed`, :data:`.packed.PACKED_DDL`), with the
same guarantees within a table; the routing sinks read both.

Helpers: :func:`split_tables` (one epoch, Arrow, per table: typed rows and schemas),
:func:`net_changes` (one table's epoch as a keyed target sees it: upserts, deletes, truncate),
:func:`decode_rows` (JSON rows of one schema to typed Arrow), :func:`mirror_rows` (Spark:
one table's typed columns), :func:`table_schema` (a table's current :class:`TableSchema`
from the server, e.g. for ``from_json(row, schema.spark_ddl())`` in Spark SQL).
"""

from __future__ import annotations

from flinkish_spark.connectors.cdc.stream import RESNAPSHOT_BEGIN, RESNAPSHOT_END, STREAM_DDL, stream_schema
from flinkish_spark.connectors.postgres.rows.decode import (
    META_COLUMNS,
    UNCHANGED,
    TableRows,
    decode_rows,
    mirror_rows,
    split_tables,
)
from flinkish_spark.connectors.postgres.rows.encode import UNCHANGED_FIELD, RowEncoder, row_sql
from flinkish_spark.connectors.postgres.rows.net import NetChanges, net_changes
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema, arrow_type, make_column

def table_schema(url: str, table: str, password_env: str | None = None) -> TableSchema:
    """The current :class:`TableSchema` of ``table`` on the server at ``url`` (needs psycopg).

    For Spark SQL over the stream: ``from_json(row, '<table_schema(...).spark_ddl()>')``.
    """
    from flinkish_spark.connectors.postgres.connection import connect, parse_url
    from flinkish_spark.connectors.postgres.source.catalog import load_table_schema, psycopg_query, table_oid

    info = parse_url(url, password_env, "table_schema: url")
    with connect(info, autocommit=True) as conn:
        schema = load_table_schema(psycopg_query(conn), table_oid(conn, table, "table_schema"))
    assert schema is not None
    return schema


__all__ = [
    "Column", "META_COLUMNS", "NetChanges", "RESNAPSHOT_BEGIN", "RESNAPSHOT_END", "RowEncoder", "STREAM_DDL",
    "TableRows", "TableSchema", "arrow_type", "decode_rows", "make_column", "mirror_rows", "net_changes", "row_sql",
    "split_tables", "stream_schema", "table_schema", "UNCHANGED", "UNCHANGED_FIELD",
]
