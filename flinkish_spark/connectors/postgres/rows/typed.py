"""PostgreSQL's text of a column's values as the typed Arrow array the JSON shape decodes them to.

What it guarantees: :func:`typed_column` gives, value for value, what :func:`.decode.decode_rows` gives for the
same texts written as JSON by :func:`.encode.value_encoder` (both start from PostgreSQL's text output of a value
under the same session settings): Arrow's cast where it reads the texts as the JSON decoder reads their JSON
(integers, floats, decimals, booleans, ISO dates and timestamps, text), else JSON value by value (NaN in a
numeric, infinite or BC dates, bytea, arrays). Used where changes are typed from pgoutput's bytes: the source's
long runs (:mod:`..source.packed_rows`) and the sink's ``w`` packs (:mod:`.wire`). :func:`typed_rows` is the same
for JSON-shape rows: a ``p`` pack's rows of them (the ``Packer``, ``j`` packs, ``w`` rows typed message by message).
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.rows.decode import ROW_META, UNCHANGED, _unchanged, decode_rows
from flinkish_spark.connectors.postgres.rows.encode import value_encoder
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema, arrow_type


def typed_column(texts: pa.Array, col: Column) -> pa.Array:
    """A column's PostgreSQL texts (null: SQL NULL) as its typed Arrow array, the values the JSON shape decodes to."""
    target = arrow_type(col.spark_type)
    if col.encoding == "string" and pa.types.is_string(target):
        return texts
    if col.encoding == "bool":
        # 't'/'f' from pgoutput (the type's output function), 'true'/'false' from a ::text cast (booltext)
        return pc.if_else(pc.is_valid(texts), pc.is_in(texts, pa.array(["t", "true"])), pa.scalar(None, pa.bool_()))
    if col.encoding == "number" or (col.encoding == "string" and (pa.types.is_date32(target)
                                                                   or pa.types.is_timestamp(target))):
        try:
            return texts.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # NaN in a decimal, infinity, BC, a year past 9999: as the JSON shape reads them
    return _by_json(texts, col)


def _by_json(texts: pa.Array, col: Column) -> pa.Array:
    """The column written as JSON value by value (the encoder of the JSON shape) and decoded as that shape is."""
    enc = value_encoder(col)
    rows = [None if v is None else '{"v":' + enc(v) + "}" for v in texts.to_pylist()]
    one = TableSchema("packed.column", (dataclasses.replace(col, name="v"),), ())
    out = decode_rows(pa.chunked_array([pa.array([r if r is not None else "{}" for r in rows], pa.string())]), one)
    return out.column(0).combine_chunks()


def typed_rows(schema: TableSchema, rows: pa.RecordBatch | pa.Table) -> pa.Table:
    """JSON-shape rows of one schema (``_op``, ``_lsn``, ``_seq``, ``_commit_ts``, ``row``) as a ``p`` pack's rows:
    the columns typed by the JSON shape's own decoder, then :data:`..decode.ROW_META`."""
    texts = pa.chunked_array([rows.column("row")]) if isinstance(rows, pa.RecordBatch) else rows.column("row")
    typed = decode_rows(texts, schema)
    cols = list(typed.columns) + [rows.column(m) for m in ROW_META if m != UNCHANGED] + [_unchanged(texts)]
    return pa.Table.from_arrays(cols, names=typed.column_names + list(ROW_META))
