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
column as the source types a long run of one table (:func:`..source.bulk_rows.typed_columns`),
and where that declines (an unchanged TOASTed value, a value that is not UTF-8, a type only
JSON reads) message by message through the per-message path's JSON encoders and the JSON shape's decoder.
``tests/connectors/postgres/test_source_packed.py`` compares the three ways on recorded and generated streams.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.postgres.pgoutput import UNCHANGED_TOAST, _tuple_at
from flinkish_spark.connectors.postgres.rows.decode import ROW_META
from flinkish_spark.connectors.postgres.rows.encode import RowEncoder
from flinkish_spark.connectors.postgres.rows.schema import TableSchema
from flinkish_spark.connectors.postgres.rows.typed import typed_rows

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
    m = bulk_rows.Messages.of_array(msgs)
    if np.any(m.ends - m.starts < 6):
        raise ValueError("a w pack holds a message shorter than a row message")
    idx = np.arange(n, dtype=np.int64)
    ops, is_del = bulk_rows.encode_ops(m, idx)
    meta = [ops, pack.column("_lsn").combine_chunks(), pack.column("_seq").combine_chunks(),
            pack.column("_commit_ts").combine_chunks()]
    try:
        typed = bulk_rows.typed_columns(m, idx, rel_names, schema, is_del)  # as the source types a long run
    except bulk_rows.Declined:
        return _by_message(schema, rel_names, msgs, meta)
    return pa.Table.from_arrays(typed + meta + [pa.nulls(n, pa.list_(pa.string()))],
                                names=list(schema.names) + list(ROW_META))


def _by_message(schema: TableSchema, rel_names: tuple[str, ...], msgs: pa.BinaryArray,
                meta: list[pa.Array]) -> pa.Table:
    """The per-message path's JSON text of each row (:meth:`..source.stream_rows._Stream.per_message`), typed by
    the JSON shape's decoder (:func:`.typed.typed_rows`)."""
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
    return typed_rows(schema, pa.RecordBatch.from_arrays(meta + [pa.array(texts, pa.string())],
                                                         names=["_op", "_lsn", "_seq", "_commit_ts", "row"]))
