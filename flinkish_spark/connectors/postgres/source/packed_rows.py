"""The packed shape (``rowFormat=arrow``, :mod:`..rows.packed`) made without JSON where it can: PostgreSQL's text of
the values straight into typed Arrow.

What it guarantees: the packs hold the values the JSON shape's rows decode to (:func:`..rows.decode.decode_rows`),
value for value. Both start from PostgreSQL's text output of a value under the same session settings (pgoutput's
for changes, ``::text`` for snapshot chunks, :mod:`..rows.encode`): :func:`..rows.typed.typed_column` casts a column's texts with
Arrow where the cast reads them as the JSON decoder reads their JSON (integers, floats, decimals, booleans, ISO dates
and timestamps, text); a column whose cast refuses a value (NaN in a numeric, infinite or BC dates, bytea, arrays) is
written as JSON per value and decoded as the JSON shape decodes it. ``tests/connectors/lakehouse/
test_packed_rows.py`` and ``tests/connectors/postgres/test_source_packed.py`` compare the two.

* **Changes**: :func:`packed_pieces` is :func:`.stream_rows.stream_pieces` whose bulk runs (long stretches of one
  table's inserts, updates without an old tuple, deletes: :mod:`.bulk_rows`) become a pack each, typed from the
  messages' bytes; every other row goes the JSON way and is packed after (:class:`..rows.packed.Packer`), in
  stream order per table.
* **Snapshot chunks**: :func:`chunk_packs` types a chunk's ``SELECT col::text, ...`` batches into packs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.pgoutput import DecodeState, Relation
from flinkish_spark.connectors.postgres.rows.packed import PACKED_ARROW, Packer, is_packed
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema, arrow_type
from flinkish_spark.connectors.postgres.rows.typed import typed_column
from flinkish_spark.connectors.postgres.source import bulk_rows
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.stream_rows import _Stream
from flinkish_spark.connectors.postgres.source.wire_rows import WireRows

_TS = pa.timestamp("us", tz="UTC")
#: A tuple, not a module-level ``pa.array``: building an Arrow array imports pandas (pyarrow's shim), which every
#: Python worker importing the source (the planning ones included) would then pay for.
_ROW_OPS = ("r", "c", "u", "d")


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def pack_row(schema: TableSchema, body: pa.Table) -> dict[str, Any]:
    """The packed row of one table's typed rows (``body``: the columns of :mod:`..rows.packed`'s batch)."""
    ops, lsns = body.column("_op"), body.column("_lsn")
    changes = pc.is_valid(lsns)
    ts = pc.max(pc.filter(body.column("_commit_ts"), changes)).as_py() if body.num_rows else None
    return {"_table": schema.table, "_op": "p", "_schema_id": schema.schema_id, "_lsn": lsns[0].as_py(),
            "_seq": body.column("_seq")[0].as_py(), "_last_lsn": lsns[-1].as_py(),
            "_count": int(pc.sum(pc.is_in(ops, pa.array(_ROW_OPS, pa.string()))).as_py() or 0),
            "_changes": int(pc.sum(pc.and_(changes, pc.is_in(ops, pa.array(["c", "u", "d", "t"])))).as_py() or 0),
            "_commit_ts": ts, "batch": _ipc(body)}


def _body(schema: TableSchema, typed: list[pa.Array], meta: list[pa.Array]) -> pa.Table:
    return pa.Table.from_arrays(typed + meta, names=list(schema.names) + ["_op", "_lsn", "_seq", "_commit_ts", "_unchanged"])


# -- changes ---------------------------------------------------------------------------------------------------------


def packed_pieces(src: PostgresSourceHost, pieces: Iterable[list[bytes]], start: int, end: int,
                  relations: Mapping[int, Relation], resolve: Callable[[Relation], TableSchema | None],
                  bulk: bool = True) -> Iterator[pa.RecordBatch]:
    """:func:`.stream_rows.stream_pieces`, packed (see the module docstring); with the source's ``decodeIn=sink``
    a piece of plain changes goes in ``w`` packs as its pgoutput messages (:mod:`.wire_rows`) and any other
    piece's rows in ``j`` packs, all typed by the sink tasks."""
    out = _PackedStream(src, relations, resolve, getattr(src, "decode_in", "source") == "sink")
    state = DecodeState()
    for messages in pieces:
        yield from out.packed(out.piece(messages, start, end, state, bulk))
    yield from out.packed(out.finish())


class _PackedStream(_Stream):
    """A stream whose bulk runs come out as packs (and whose JSON batches the caller packs)."""

    def __init__(self, src: PostgresSourceHost, relations: Mapping[int, Relation],
                 resolve: Callable[[Relation], TableSchema | None], defer: bool = False) -> None:
        super().__init__(src, relations, resolve)
        self.packer = Packer(defer)
        self.wire = WireRows() if defer else None  # decodeIn=sink: pieces that qualify as w packs (.wire_rows)

    def piece(self, messages: list[bytes], start: int, end: int, state: DecodeState,
              bulk: bool) -> Iterator[pa.RecordBatch]:
        if self.wire is not None:
            taken = self.wire.piece(self, messages, start, end, state)
            if taken is not None:
                yield from taken
                return
            yield from self.wire.flush()  # the w rows before this piece's rows: stream order within each table
        yield from super().piece(messages, start, end, state, bulk)

    def finish(self) -> Iterator[pa.RecordBatch]:
        yield from super().finish()
        if self.wire is not None:
            yield from self.wire.flush()

    def packed(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if b.num_rows:
                yield b if is_packed(b.schema.names) else self.packer.pack(b)

    def bulk(self, m: bulk_rows.Messages, messages: list[bytes], a: int, b: int, start: int, end: int,
             state: DecodeState) -> Iterator[pa.RecordBatch]:
        before = dataclasses.replace(state)
        try:
            packed = self._typed_run(m, a, b, start, end, state)
        except bulk_rows.Declined:
            packed = None
        if packed is None:  # declined, or its table's first row goes message by message: the JSON shape's way
            for f in dataclasses.fields(state):
                setattr(state, f.name, getattr(before, f.name))
            yield from super().bulk(m, messages, a, b, start, end, state)
            return
        if len(self.rows) or self.parts_n:
            yield self._flush()  # the rows before the run first: stream order within the table
        if packed.num_rows:
            yield packed

    def _typed_run(self, m: bulk_rows.Messages, a: int, b: int, start: int, end: int,
                   state: DecodeState) -> pa.RecordBatch | None:
        pos = bulk_rows.locate(m, a, b, state, start, end)
        n = len(pos.msgs)
        if not n:
            return pa.RecordBatch.from_pylist([], schema=PACKED_ARROW)
        relid = int(m.relids[pos.msgs[0]])
        rel = state.relations.get(relid)
        if rel is None:
            raise bulk_rows.Declined("no Relation message")
        entry = self.resolved.get(relid)
        if entry is None or entry[0] is not rel or (entry[1] is not None and self.emitted.get(relid) != entry[1].schema_id):
            return None
        schema = entry[1]
        if schema is None:
            raise bulk_rows.Declined("not followed")
        ops, is_del = bulk_rows.encode_ops(m, pos.msgs)
        typed = bulk_rows.typed_columns(m, pos.msgs, rel.names, schema, is_del)
        seq, self.txn, self.seq = bulk_rows.seqs(pos.lsns, self.txn, self.seq)
        meta = [ops, pa.array(pos.lsns, pa.int64()), pa.array(seq.astype(np.int32), pa.int32()),
                pa.array(pos.ts, pa.int64()).cast(_TS), pa.nulls(n, pa.list_(pa.string()))]
        return pa.RecordBatch.from_pylist([pack_row(schema, _body(schema, typed, meta))], schema=PACKED_ARROW)


# -- snapshot chunks -------------------------------------------------------------------------------------------------


#: Types a chunk reads as they are (ADBC's binary COPY gives the value the JSON shape decodes to): no text made on the
#: server, none parsed here. Dates and timestamps only within years 1-9999 -- outside (infinity, BC, year 10000+)
#: the JSON shape decodes null, and so do these (the CASE below).
_RAW = {"int2", "int4", "int8", "float4", "float8", "bool", "text", "varchar"}
_TEMPORAL = {"date": "date", "timestamp": "timestamp", "timestamptz": "timestamptz"}
_SUFFIX = {"timestamptz": "+00"}


def chunk_select(schema: TableSchema) -> str:
    """The select list of a packed chunk read: a column as its base type where Arrow holds it as the JSON shape
    decodes it, else its text (what the JSON shape's ``row_sql`` starts from)."""
    def expr(c: Column) -> str:
        name = '"' + c.name.replace('"', '""') + '"'
        if c.pg_type in _RAW:
            return f"{name}::{c.pg_type}"
        if c.pg_type in _TEMPORAL:
            lo, hi = (f"'{y}-01-01{_SUFFIX.get(c.pg_type, '')}'::{c.pg_type}" for y in ("0001", "10000"))
            return f"CASE WHEN {name} >= {lo} AND {name} < {hi} THEN {name}::{c.pg_type} END"
        if c.pg_type == "bpchar":
            return f"bpcharout({name})::text"  # ::text would drop the padding that pgoutput keeps
        return f"{name}::text"

    return ", ".join(expr(c) for c in schema.columns) or "NULL"


def chunk_pack(schema: TableSchema, batch: pa.RecordBatch) -> pa.RecordBatch:
    """One batch of a chunk's :func:`chunk_select` rows as one packed row of snapshot rows."""
    n = batch.num_rows
    typed = [_chunk_column(batch.column(i), c) for i, c in enumerate(schema.columns)]
    meta = [pa.repeat(pa.scalar("r"), n), pa.nulls(n, pa.int64()), pa.nulls(n, pa.int32()), pa.nulls(n, _TS),
            pa.nulls(n, pa.list_(pa.string()))]
    return pa.RecordBatch.from_pylist([pack_row(schema, _body(schema, typed, meta))], schema=PACKED_ARROW)


def _chunk_column(arr: pa.Array, col: Column) -> pa.Array:
    if col.pg_type in _RAW or col.pg_type in _TEMPORAL:
        target = arrow_type(col.spark_type)
        if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
            return arr if arr.type == target else arr.cast(target)
    return typed_column(arr.cast(pa.string()), col)
