"""The stream rows of a WAL range's pgoutput messages (the change half of the multi-table reader).

What it guarantees: :func:`stream_batches` is a pure function of its arguments; a row per change in WAL order,
an ``s`` row with the table's schema before its first row and whenever its Relation message announces other
columns, ``_seq`` the ordinal within the transaction. Two paths give the same rows byte for byte (and the same
batches): long stretches of inserts, updates without an old tuple and deletes of one followed table are decoded
in bulk (:mod:`.bulk_rows`, column by column with numpy and Arrow), everything else message by message
(:func:`..pgoutput.raw_changes` and the encoders of :meth:`..rows.RowEncoder.compile`); where the bulk path
declines a stretch (see its docstring) the per-message path takes it. ``tests/connectors/postgres/
test_source_stream_rows.py`` replays recorded streams through both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.cdc.stream import STREAM_ARROW, StreamRows
from flinkish_spark.connectors.postgres.pgoutput import (
    UNCHANGED_TOAST, Change, DecodeState, Relation, Truncate, format_lsn, raw_changes,
)
from flinkish_spark.connectors.postgres.rows import RowEncoder, TableSchema
from flinkish_spark.connectors.postgres.source import bulk_rows
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.errors import PostgresSourceError

BATCH_ROWS = 65_536
#: Fewer row messages in a stretch than this go message by message: the bulk path's fixed cost (a few dozen numpy
#: and Arrow calls per column) is worth it from a few hundred rows on.
MIN_BULK_ROWS = 256

Resolved = tuple[Relation, "TableSchema | None", "RowEncoder | None", Any, Any]


def stream_batches(src: PostgresSourceHost, messages: list[bytes], start: int, end: int,
                   relations: Mapping[int, Relation], resolve: Callable[[Relation], TableSchema | None],
                   bulk: bool = True) -> Iterator[pa.RecordBatch]:
    """The stream rows of the pgoutput ``messages`` of ``[start, end)`` (a pure function of its arguments);
    ``relations``: every Relation message of ``messages`` by relid (the tables of a truncate);
    ``resolve``: a relation's schema, None when the table is not followed (called once per Relation message);
    ``bulk``: False takes every message by the per-message path (tests compare the two)."""
    return stream_pieces(src, [messages], start, end, relations, resolve, bulk)


def stream_pieces(src: PostgresSourceHost, pieces: Iterable[list[bytes]], start: int, end: int,
                  relations: Mapping[int, Relation], resolve: Callable[[Relation], TableSchema | None],
                  bulk: bool = True) -> Iterator[pa.RecordBatch]:
    """:func:`stream_batches` of the messages of ``pieces`` one after another (:func:`.changes.peek_pieces`): the
    same batches as of one list of them, wherever the pieces are cut (a transaction, a run of one table's rows,
    a Relation message before its rows in the piece before), and only one piece is held at a time.
    ``relations``: at least the Relation messages up to the end of the piece being decoded (the caller fills it
    as the pieces arrive). Where the decode stands between two pieces is :class:`..pgoutput.DecodeState` (the
    open transaction, the Relation messages) and the rows not yet a full batch."""
    out = _Stream(src, relations, resolve)
    state = DecodeState()
    for messages in pieces:
        yield from out.piece(messages, start, end, state, bulk)
    yield from out.finish()


class _Stream:
    """The rows made so far: Python lists (the per-message path) after Arrow batches (the bulk path), cut into
    batches where the per-message path alone would cut them (when a change takes them to ``BATCH_ROWS``)."""

    def __init__(self, src: PostgresSourceHost, relations: Mapping[int, Relation],
                 resolve: Callable[[Relation], TableSchema | None]) -> None:
        self.src, self.relations, self.resolve = src, relations, resolve
        self.rows = StreamRows()
        self.parts: list[pa.RecordBatch] = []  # the bulk path's rows, before those in self.rows
        self.parts_n = 0
        self.emitted: dict[int, str] = {}  # relid -> schema id of its last 's' row in this range
        # relid -> the Relation it was resolved for, its schema (None: not followed), its encoder and the compiled
        # encodings of a full row and of a delete's key; compared by identity: raw_changes hands out the same
        # Relation object until the next Relation message.
        self.resolved: dict[int, Resolved] = {}
        self.txn, self.seq = -1, 0  # the commit LSN of the last change and the _seq of the next row

    def _resolve_entry(self, rel: Relation) -> Resolved:
        schema = self.resolve(rel)
        if schema is None:
            entry: Resolved = (rel, None, None, None, None)
        else:
            encoder = RowEncoder(schema)
            entry = (rel, schema, encoder, encoder.compile(rel.names),
                     encoder.compile(rel.names, schema.key) if schema.key else None)
        self.resolved[rel.relid] = entry
        return entry

    def _flush(self) -> pa.RecordBatch:
        if len(self.rows):
            self.parts.append(self.rows.flush())
        batch = self.parts[0] if len(self.parts) == 1 else pa.Table.from_batches(self.parts).combine_chunks().to_batches()[0]
        self.parts, self.parts_n = [], 0
        return batch

    def piece(self, messages: list[bytes], start: int, end: int, state: DecodeState,
              bulk: bool) -> Iterator[pa.RecordBatch]:
        """The rows of the next piece of the stream (``state``: where the pieces before it left off): its runs of
        one table's rows in bulk, the rest message by message. A run cut by a piece's end is two runs (each
        message by message when shorter than ``MIN_BULK_ROWS``): the same rows, and batches are cut by count."""
        at = 0
        if bulk and len(messages) >= MIN_BULK_ROWS:
            m = bulk_rows.Messages.of(messages)
            for a, b in m.runs(MIN_BULK_ROWS, BATCH_ROWS):
                if a > at:
                    yield from self.per_message(messages[at:a], start, end, state)
                yield from self.bulk(m, messages, a, b, start, end, state)
                at = b
        if at < len(messages):
            yield from self.per_message(messages[at:], start, end, state)

    def finish(self) -> Iterator[pa.RecordBatch]:
        if len(self.rows) or self.parts_n:
            yield self._flush()

    def per_message(self, messages: list[bytes], start: int, end: int, state: DecodeState) -> Iterator[pa.RecordBatch]:
        """Per change this is the hot path of the per-message decode: the row's JSON comes from encoders compiled once
        per Relation message (values by position, no dict per change), the columns are plain lists until a batch is
        full."""
        rows, emitted, resolved, relations = self.rows, self.emitted, self.resolved, self.relations
        tables, ops, lsns, seqs, tss, sids, texts = (rows.cols[f.name] for f in STREAM_ARROW)
        limit = BATCH_ROWS - self.parts_n
        txn, seq = self.txn, self.seq
        for change in raw_changes(messages, start, end, state):
            if isinstance(change, Truncate):
                lsn, ts = change.commit_lsn, change.commit_ts_us
                if lsn != txn:
                    txn, seq = lsn, 0
                for rel in [relations[r] for r in change.relids]:
                    entry = resolved.get(rel.relid)
                    if entry is None or entry[0] is not rel:
                        entry = self._resolve_entry(rel)
                    schema = entry[1]
                    if schema is None:
                        continue
                    if emitted.get(rel.relid) != schema.schema_id:
                        emitted[rel.relid] = schema.schema_id
                        rows.add(schema.table, "s", lsn, seq, ts, schema.schema_id, schema.to_json())
                        seq += 1
                    rows.add(schema.table, "t", lsn, seq, ts, schema.schema_id, None)
                    seq += 1
            else:
                op, rel, values, lsn, ts, _, moved = change
                if lsn != txn:
                    txn, seq = lsn, 0
                entry = resolved.get(rel.relid)
                if entry is None or entry[0] is not rel:
                    entry = self._resolve_entry(rel)
                _, schema, encoder, encode_row, encode_key = entry
                if schema is None or encoder is None:
                    continue
                sid = schema.schema_id
                if emitted.get(rel.relid) != sid:
                    emitted[rel.relid] = sid
                    rows.add(schema.table, "s", lsn, seq, ts, sid, schema.to_json())
                    seq += 1
                if op == "d" and encode_key is not None:
                    text = encode_key(values)  # a delete carries the key (the rest may be null)
                elif UNCHANGED_TOAST in values:
                    text = _encode(self.src, encoder, Change(op, rel, dict(zip(rel.names, values)), lsn, ts, 0, moved))
                else:
                    text = encode_row(values)
                tables.append(schema.table)
                ops.append(op)
                lsns.append(lsn)
                seqs.append(seq)
                tss.append(ts)
                sids.append(sid)
                texts.append(text)
                seq += 1
            if len(texts) >= limit:
                yield self._flush()
                limit = BATCH_ROWS
                tables, ops, lsns, seqs, tss, sids, texts = (rows.cols[f.name] for f in STREAM_ARROW)
        self.txn, self.seq = txn, seq

    def bulk(self, m: bulk_rows.Messages, messages: list[bytes], a: int, b: int, start: int, end: int,
             state: DecodeState) -> Iterator[pa.RecordBatch]:
        """The run ``[a, b)`` (:meth:`.bulk_rows.Messages.runs`) in bulk, or message by message where declined."""
        before = dataclasses.replace(state)
        try:
            batch, first = self._bulk_batch(m, a, b, start, end, state)
        except bulk_rows.Declined:
            batch, first = None, b
        if batch is None:
            # Declined, or the run holds the first row of its table (resolve it and write its 's' row message by
            # message, then the rest in bulk).
            for f in dataclasses.fields(state):
                setattr(state, f.name, getattr(before, f.name))
            yield from self.per_message(messages[a:first], start, end, state)
            if first < b:
                yield from self.bulk(m, messages, first, b, start, end, state)
            return
        if not batch.num_rows:
            return
        if len(self.rows):
            self.parts_n += len(self.rows)
            self.parts.append(self.rows.flush())
        self.parts.append(batch)
        self.parts_n += batch.num_rows
        while self.parts_n >= BATCH_ROWS:
            table = pa.Table.from_batches(self.parts)
            head = table.slice(0, BATCH_ROWS).combine_chunks().to_batches()[0]
            rest = table.slice(BATCH_ROWS)
            self.parts = [b for b in rest.to_batches() if b.num_rows]
            self.parts_n = rest.num_rows
            yield head

    def _bulk_batch(self, m: bulk_rows.Messages, a: int, b: int, start: int, end: int,
                    state: DecodeState) -> tuple[pa.RecordBatch | None, int]:
        """The run's rows (an empty batch when none is wanted), or (None, the message after the run's first row)
        when that row must go message by message first; raises Declined."""
        pos = bulk_rows.locate(m, a, b, state, start, end)
        n = len(pos.msgs)
        if not n:
            return pa.RecordBatch.from_pylist([], schema=STREAM_ARROW), b
        relid = int(m.relids[pos.msgs[0]])
        rel = state.relations.get(relid)
        if rel is None:
            raise bulk_rows.Declined("no Relation message")
        entry = self.resolved.get(relid)
        if entry is None or entry[0] is not rel or (entry[1] is not None and self.emitted.get(relid) != entry[1].schema_id):
            return None, int(pos.msgs[0]) + 1
        schema = entry[1]
        if schema is None:
            raise bulk_rows.Declined("not followed")  # the per-message path skips its changes
        ops, is_del = bulk_rows.encode_ops(m, pos.msgs)
        if schema.key and is_del.any():
            full, key = np.flatnonzero(~is_del), np.flatnonzero(is_del)
            texts = pa.concat_arrays([bulk_rows.rows_json(m, pos.msgs[full], rel.names, schema, None),
                                      bulk_rows.rows_json(m, pos.msgs[key], rel.names, schema, schema.key)])
            order = np.empty(n, np.int64)
            order[full] = np.arange(len(full))
            order[key] = len(full) + np.arange(len(key))
            texts = texts.take(pa.array(order))
        else:
            texts = bulk_rows.rows_json(m, pos.msgs, rel.names, schema, None)
        seq, self.txn, self.seq = bulk_rows.seqs(pos.lsns, self.txn, self.seq)
        arrays = [pa.repeat(pa.scalar(schema.table), n),
                  ops, pa.array(pos.lsns, pa.int64()), pa.array(seq.astype(np.int32), pa.int32()),
                  pa.array(pos.ts, pa.int64()).cast(STREAM_ARROW.field("_commit_ts").type),
                  pa.repeat(pa.scalar(schema.schema_id), n), texts]
        return pa.RecordBatch.from_arrays(arrays, schema=STREAM_ARROW), b


def _encode(src: PostgresSourceHost, encoder: RowEncoder, change: Change) -> str:
    """The change's JSON row. An update that left TOASTed values unchanged (the server did not send them) lists
    those columns in the row (``rows.UNCHANGED_FIELD``): a keyed target keeps its stored value for them."""
    schema = encoder.schema
    if change.op == "d" and schema.key:
        return encoder.encode(change.values, schema.key)  # a delete carries the key (the rest may be null)
    # Of the schema's columns only: a column the option 'transforms' leaves out is not even named.
    unchanged = [name for name, value in change.values.items() if value is UNCHANGED_TOAST and name in schema.names]
    if unchanged and change.moved:
        # The value is the old key's row's, which a target applying by key does not look at for the new key.
        raise PostgresSourceError(
            f"{src.component}: an update of {schema.table} at LSN {format_lsn(change.commit_lsn)} changed the row's key "
            f"and left the TOASTed value of column {unchanged[0]!r} unchanged, and the server did not send it; the new "
            f"key's row cannot be completed. Run ALTER TABLE {schema.table} REPLICA IDENTITY FULL (the server then sends "
            f"the old row, which holds the value) and start over with a new snapshot, since this change is already in "
            f"the WAL without it: SELECT pg_drop_replication_slot('{src.slot_name}') and restart with "
            f"onSlotLost=resnapshot, or use a new uid"
        )
    return encoder.encode(change.values, unchanged=unchanged)
