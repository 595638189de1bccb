"""A MySQL snapshot chunk in the packed shape (``rowFormat=arrow``, :mod:`..postgres.rows.packed`) straight from its
typed Arrow: no JSON text per row, none parsed back.

Today's JSON shape takes a chunk's typed Arrow (:func:`.snapshot.read_chunk`, typed by :mod:`.types`) to Python
values, writes each row as JSON (:func:`.stream_rows.row_encoder`) and the :class:`..postgres.rows.packed.Packer`
decodes that JSON back into the columns of ``TableSchema.arrow_schema()`` (:func:`..postgres.rows.decode.decode_rows`).
:func:`chunk_packs` puts the typed columns into the pack as they are.

What it guarantees: a pack holds the values the JSON shape's pack of the same rows holds, value for value (so a
routed Delta, Iceberg or PostgreSQL sink writes the same target rows): a column goes directly where the chunk's Arrow
type is the pack's type or a signed integer the pack's wider signed integer (TINYINT -> smallint) -- every type of
:mod:`.types` today: integers signed and unsigned (BIGINT UNSIGNED: decimal(20,0) on both sides), DECIMAL (p > 38:
text), FLOAT/DOUBLE, text of any charset (decoded on the read), ENUM, SET, JSON, TIME (text), BINARY/BLOB/BIT(n)/
GEOMETRY (binary), BIT(1) (boolean), DATE/DATETIME/TIMESTAMP with fractions (zero dates are already null in the
chunk's Arrow, as the JSON shape writes them), YEAR. A column of any other pair of types (none today: a type added to
:mod:`.types` whose Arrow type differs from its stream type) falls back to the JSON way for that column alone: its
values written by the JSON shape's encoder and decoded as the Packer decodes them.
``tests/connectors/mysql/test_packed_chunks.py`` compares the two shapes for a table of every type.

The snapshot chunks (change ranges: :mod:`.packed_changes`). The reader's Packer passes these packs through
(:meth:`..postgres.rows.packed.Packer.pack_all`); the chunk's ``s`` row and a re-snapshot's ``B``/``E`` markers stay
stream rows for that Packer (:func:`.chunk_rows.read_chunk_rows` with ``packed=True``).
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from flinkish_spark.connectors.mysql.stream_rows import row_encoder
from flinkish_spark.connectors.postgres.rows.decode import ROW_META, decode_rows
from flinkish_spark.connectors.postgres.rows.packed import PACK_BYTES, PACK_ROWS, PACKED_ARROW
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema

_TS = pa.timestamp("us", tz="UTC")


def direct(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether a chunk's column of Arrow type ``source`` goes into a pack of type ``target`` as it is (see the
    module docstring)."""
    if source == target:
        return True
    return (pa.types.is_signed_integer(source) and pa.types.is_signed_integer(target)
            and source.bit_width < target.bit_width)


def _by_json(arr: pa.Array, col: Column) -> pa.Array:
    """The column the JSON shape's way: each value written by its encoder, the texts decoded as the Packer does."""
    one = TableSchema("packed.column", (dataclasses.replace(col, name="v"),), ())
    encode = row_encoder(one)
    texts = [encode((v,)) for v in arr.to_pylist()]
    return decode_rows(pa.array(texts, pa.string()), one).column(0).combine_chunks()


def typed_columns(schema: TableSchema, batch: pa.RecordBatch) -> list[pa.Array]:
    """A chunk's batch (columns in the schema's order, typed by :mod:`.types`) as the pack's typed columns."""
    target = schema.arrow_schema()
    out = []
    for i, col in enumerate(schema.columns):
        arr, want = batch.column(i), target.field(i).type
        if arr.type == want:
            out.append(arr)
        elif direct(arr.type, want):
            out.append(arr.cast(want))
        else:
            out.append(_by_json(arr, col))
    return out


def chunk_packs(schema: TableSchema, batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of a chunk's rows as packed ``p`` rows of snapshot (``r``) rows, each pack at most
    :data:`PACK_ROWS` rows and about :data:`PACK_BYTES` of Arrow."""
    n = batch.num_rows
    per = max(1, min(PACK_ROWS, int(PACK_BYTES * n // max(1, batch.nbytes))))
    typed = typed_columns(schema, batch)
    names = list(schema.names) + list(ROW_META)
    rows = []
    for at in range(0, n, per):
        k = min(per, n - at)
        meta = [pa.repeat(pa.scalar("r"), k), pa.nulls(k, pa.int64()), pa.nulls(k, pa.int32()), pa.nulls(k, _TS),
                pa.nulls(k, pa.list_(pa.string()))]
        body = pa.Table.from_arrays([c.slice(at, k) for c in typed] + meta, names=names)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, body.schema) as w:
            w.write_table(body)
        rows.append({"_table": schema.table, "_op": "p", "_schema_id": schema.schema_id, "_lsn": None, "_seq": None,
                     "_last_lsn": None, "_count": k, "_changes": 0, "_commit_ts": None,
                     "batch": sink.getvalue().to_pybytes()})
    return pa.RecordBatch.from_pylist(rows, schema=PACKED_ARROW)
