"""``w`` packs: a table's pgoutput row messages as read from the slot, typed by the sink task that gets them.

Why: a mirror's change stream is read by one task (one replication slot, in WAL order). With many tables each
transaction touches a few of them, so nearly every change goes the source's per-message way (parse, a JSON text,
typed again), ~1 s per 100,000 changes in that one task however many tasks the epoch is spread over (issue 26,
docs/benchmarks.md). With the source's ``decodeIn=sink`` the reading task only frames the messages, finds each
one's transaction, table and ``_seq`` (numpy over the whole read: :mod:`..source.wire_rows`) and ships each
table's messages as they are; the sink task that holds the table types them here.

Layout of a ``w`` pack's ``batch`` (an Arrow IPC stream): ``msg`` (binary: one Insert, Update without an old
tuple, or Delete message, whole), ``_lsn``, ``_seq``, ``_commit_ts`` (the row's, as in the JSON shape), and the
schema metadata ``relation``: the JSON list of the columns the messages carry, in the order they carry them
(the Relation message's; a table's schema may leave some out: the option ``transforms``).

What it guarantees: :func:`wire_rows` gives the rows a ``p`` pack of the same changes holds -- the same typed
values, ``_op``, ``_lsn``, ``_seq``, ``_commit_ts`` and ``_unchanged`` -- because it is the same code: column by
column as the source types a long run of one table (:mod:`..source.bulk_rows`, :func:`.typed.typed_column`),
and where that declines (an unchanged TOASTed value, a value that is not UTF-8, a type only
JSON reads) message by message through the per-message path's JSON encoders and the JSON shape's decoder.
``tests/connectors/postgres/test_source_packed.py`` compares the three ways on recorded and generated streams.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.pgoutput import UNCHANGED_TOAST, _tuple_at
from flinkish_spark.connectors.postgres.rows.decode import ROW_META, _unchanged, decode_rows
from flinkish_spark.connectors.postgres.rows.encode import RowEncoder
from flinkish_spark.connectors.postgres.rows.schema import TableSchema, arrow_type
from flinkish_spark.connectors.postgres.rows.typed import typed_column

_TS = pa.timestamp("us", tz="UTC")
RELATION_KEY = b"relation"
WIRE_FIELDS = (pa.field("msg", pa.binary()), pa.field("_lsn", pa.int64()), pa.field("_seq", pa.int32()),
               pa.field("_commit_ts", _TS))


def wire_schema(rel_names: Sequence[str]) -> pa.Schema:
    """The IPC schema of a ``w`` pack of messages carrying ``rel_names``."""
    return pa.schema(list(WIRE_FIELDS), metadata={RELATION_KEY: json.dumps(list(rel_names)).encode()})


def wire_rows(schema: TableSchema, pack: pa.Table) -> pa.Table:
    """A ``w`` pack's rows typed in ``schema`` (the one its ``_schema_id`` names): a ``p`` pack's rows."""
    # The source's column decoder: pure numpy over message bytes, no server access; imported here, not at the top,
    # so that the rows package (which every sink imports) does not load the source package.
    from flinkish_spark.connectors.postgres.source import bulk_rows

    rel_names = tuple(json.loads((pack.schema.metadata or {})[RELATION_KEY]))
    msgs = pack.column("msg").combine_chunks()
    n = len(msgs)
    m = _messages(bulk_rows, msgs)
    idx = np.arange(n, dtype=np.int64)
    ops, is_del = bulk_rows.encode_ops(m, idx)
    meta = [ops, pack.column("_lsn").combine_chunks(), pack.column("_seq").combine_chunks(),
            pack.column("_commit_ts").combine_chunks()]
    try:
        vals = bulk_rows.columns(m, idx, len(rel_names))
        index = {name: i for i, name in enumerate(rel_names)}
        key = set(schema.key)
        masked = pa.array(is_del) if schema.key and is_del.any() else None  # a delete carries its key only
        typed = []
        for col in schema.columns:  # what the source's typed runs do (packed_rows._PackedStream._typed_run)
            i = index.get(col.name)
            if i is None:
                typed.append(pa.nulls(n, arrow_type(col.spark_type)))
                continue
            arr = typed_column(bulk_rows._strings(m.buf, vals[i])[0], col)
            if masked is not None and col.name not in key:
                arr = pc.if_else(masked, pa.scalar(None, arr.type), arr)
            typed.append(arr)
    except bulk_rows.Declined:
        return _by_message(schema, rel_names, msgs, meta)
    return pa.Table.from_arrays(typed + meta + [pa.nulls(n, pa.list_(pa.string()))],
                                names=list(schema.names) + list(ROW_META))


def _messages(bulk_rows: ModuleType, msgs: pa.BinaryArray) -> Any:
    """The messages as ``bulk_rows.Messages`` (their bytes copied once, padded as it wants)."""
    offsets = np.frombuffer(msgs.buffers()[1], np.int32, len(msgs) + 1, msgs.offset * 4).astype(np.int64)
    data = msgs.buffers()[2]
    lo, hi = int(offsets[0]), int(offsets[-1])
    raw = np.frombuffer(data, np.uint8, hi - lo, lo) if data is not None and hi > lo else np.zeros(0, np.uint8)
    buf = np.concatenate([raw, np.zeros(16, np.uint8)])
    starts, ends = offsets[:-1] - lo, offsets[1:] - lo
    if np.any(ends - starts < 6):
        raise ValueError("a w pack holds a message shorter than a row message")
    return bulk_rows.Messages(buf, starts, ends, buf[starts], buf[starts + 5], bulk_rows._be32(buf, starts + 1))


def _by_message(schema: TableSchema, rel_names: tuple[str, ...], msgs: pa.BinaryArray,
                meta: list[pa.Array]) -> pa.Table:
    """The per-message path's JSON text of each row (:meth:`..source.stream_rows._Stream.per_message`), typed by
    the JSON shape's decoder (:func:`.packed.typed_rows`)."""
    encoder = RowEncoder(schema)
    encode_row = encoder.compile(rel_names)
    encode_key = encoder.compile(rel_names, schema.key) if schema.key else None
    names = set(schema.names)
    texts = []
    for data in msgs.to_pylist():
        values, _ = _tuple_at(data, 6)
        if data[:1] == b"D" and encode_key is not None:
            texts.append(encode_key(values))  # a delete carries the key (the rest may be null)
        elif UNCHANGED_TOAST in values:
            unchanged = [n for n, v in zip(rel_names, values) if v is UNCHANGED_TOAST and n in names]
            texts.append(encoder.encode(dict(zip(rel_names, values)), unchanged=unchanged))
        else:
            texts.append(encode_row(values))
    body = pa.RecordBatch.from_arrays(meta + [pa.array(texts, pa.string())],
                                      names=["_op", "_lsn", "_seq", "_commit_ts", "row"])
    texts_col = pa.chunked_array([body.column("row")])
    typed = decode_rows(texts_col, schema)
    cols = list(typed.columns) + meta + [_unchanged(texts_col)]
    return pa.Table.from_arrays(cols, names=typed.column_names + list(ROW_META))
