"""A binary log range as rows of the CDC core's stream: the MySQL dialect's ``read_changes`` body.

What it guarantees, given :func:`.changes.read_range`'s whole transactions in log order (the same on every read of
a range): the changes of the followed tables (the patterns match ``database.table`` and the table has a primary
key) become stream rows in log order -- ``_op`` ``c``/``u``/``d`` (an update that moves a row's key is a ``d`` of
the old key, then a ``u`` of the new one, as the PostgreSQL source does), ``_lsn`` the transaction's first position
(:func:`.changes.position_key`: within ``[start, end)``, non-decreasing), ``_seq`` its ordinal in the transaction,
``_commit_ts`` its commit time; an ``s`` row before a table's first row of the read and whenever its table map
names other columns or types (an ``ADD COLUMN`` is a new ``s`` row, then rows with the column). The rows are the
whole images (a delete: the row before), as JSON of :mod:`.stream_rows` -- or, with ``packed``
(``rowFormat=arrow``), the same rows already in the packed shape, typed straight from the decoded values
(:mod:`.packed_changes`).

DDL: ``TRUNCATE`` of a followed table is a ``t`` row (its ``s`` row first when the read has not named the table
yet: the schema then comes from the catalog, the only place that has it). A statement that rewrites rows
without row events (``MODIFY`` to another type, ``ADD COLUMN ... DEFAULT x``) is the catalog signature's
(:meth:`.dialect.MysqlDialect.signatures`): the enumerator re-snapshots the table, as the PostgreSQL source
does for a table rewrite; ``DROP``/``RENAME TABLE`` are the catalog poll's (the table leaves; a new name that
matches joins with a snapshot); partition statements and key changes are the enumerator's (it re-snapshots the
table, or leaves it out when its key is gone: its rows written without a key are not in the stream). Nothing here
stops: the statements the stream does not carry are all seen there.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

import pyarrow as pa

from flinkish_spark.connectors.cdc.stream import StreamRows
from flinkish_spark.connectors.mysql.changes import Statement, Transaction, position_key
from flinkish_spark.connectors.mysql.packed_changes import PackedRows
from flinkish_spark.connectors.mysql.stream_rows import map_key, row_encoder, schema_of_map
from flinkish_spark.connectors.postgres.rows import TableSchema

BATCH_ROWS = 8192
Encoder = Callable[[Any], Any]  # the row as the collector keeps it: JSON text, or the values


def change_batches(txns: Iterable[Transaction], follows: Callable[[str], bool],
                   planned_key: Callable[[str], tuple[str, ...] | None],
                   catalog_schema: Callable[[str, str], TableSchema | None],
                   text_types: Callable[[Any], Mapping[int, str]] | None = None,
                   packed: bool = False) -> Iterator[pa.RecordBatch]:
    """The stream rows of ``txns`` (see the module docstring). ``follows``: whether ``database.table`` matches the
    patterns; ``planned_key``: its key as the epoch was planned, for a table map that names none; ``catalog_schema``:
    a table's schema now (a ``t`` row's, when the range has no table map of it); ``text_types``: a table map's
    columns the decoder reads as text (:meth:`.row_values.RowDecoder.text_types`); ``packed``: the rows in the packed
    shape (:class:`.packed_changes.PackedRows`), the same rows in the same order per table."""
    rows: JsonRows | PackedRows = PackedRows() if packed else JsonRows()
    emitted: dict[str, str] = {}  # table -> the schema id of its last 's' row in this read
    maps: dict[int, tuple[Any, TableSchema | None, Encoder | None]] = {}  # id(table map) -> (map, schema, encoder)
    by_name: dict[str, TableSchema] = {}
    for txn in txns:
        lsn, ts, seq = position_key(txn.begin), txn.commit_ts_us, 0
        items: list[Any] = list(txn.changes)
        if txn.statements:
            items = sorted(items + list(txn.statements), key=lambda x: x.seq)
        for item in items:
            if isinstance(item, Statement):
                for sc in item.changes:
                    if sc.kind != "truncate" or sc.table is None or not follows(f"{sc.database}.{sc.table}"):
                        continue
                    name = f"{sc.database}.{sc.table}"
                    schema = by_name.get(name) or catalog_schema(sc.database, sc.table)
                    if schema is None:
                        continue
                    if emitted.get(name) != schema.schema_id:
                        emitted[name] = schema.schema_id
                        rows.add_schema(schema, lsn, seq, ts)
                        seq += 1
                    rows.add_truncate(schema, lsn, seq, ts)
                    seq += 1
                continue
            tm = item.table
            entry = maps.get(id(tm))
            if entry is None or entry[0] is not tm:
                name = f"{tm.database}.{tm.table}"
                # A map with column names (binlog_row_metadata=FULL) names the key the row was written under: none
                # after DROP PRIMARY KEY, whose rows are not applied by the old key (it may no longer be unique; the
                # enumerator leaves the table out). The planned key only stands in for a map without names.
                key = map_key(tm) or (() if tm.names else planned_key(name)) or ()
                text = None if text_types is None else text_types(tm)
                schema = schema_of_map(tm, key, text) if follows(name) and key else None
                entry = (tm, schema, None if schema is None else rows.encoder(schema))
                maps[id(tm)] = entry
            _, schema, encode = entry
            if schema is None or encode is None:
                continue
            name, sid = schema.table, schema.schema_id
            by_name[name] = schema
            if emitted.get(name) != sid:
                emitted[name] = sid
                rows.add_schema(schema, lsn, seq, ts)
                seq += 1
            op = item.op
            if op == "i":
                rows.add(name, "c", lsn, seq, ts, sid, encode(item.after))
            elif op == "d":
                rows.add(name, "d", lsn, seq, ts, sid, encode(item.before))
            else:
                if _key(schema, item.before) != _key(schema, item.after):
                    rows.add(name, "d", lsn, seq, ts, sid, encode(item.before))
                    seq += 1
                rows.add(name, "u", lsn, seq, ts, sid, encode(item.after))
            seq += 1
            if rows.full():
                yield rows.flush()
    if len(rows):
        yield rows.flush()


class JsonRows(StreamRows):
    """The JSON shape: a change's row as its JSON text (:func:`.stream_rows.row_encoder`)."""

    def encoder(self, schema: TableSchema) -> Encoder:
        return row_encoder(schema)

    def full(self) -> bool:
        return len(self) >= BATCH_ROWS

    def add_schema(self, schema: TableSchema, lsn: int, seq: int, ts: int) -> None:
        self.add(schema.table, "s", lsn, seq, ts, schema.schema_id, schema.to_json())

    def add_truncate(self, schema: TableSchema, lsn: int, seq: int, ts: int) -> None:
        self.add(schema.table, "t", lsn, seq, ts, schema.schema_id, None)


def _key(schema: TableSchema, values: list[Any]) -> list[Any]:
    names = schema.names
    return [values[names.index(k)] for k in schema.key]
