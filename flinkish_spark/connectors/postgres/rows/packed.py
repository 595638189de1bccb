"""The packed shape of the multi-table stream (source option ``rowFormat=arrow``): one stream row per up to
:data:`PACK_ROWS` changes of one table, the changes typed inside one Arrow IPC stream.

Why: Spark hands a Python source's rows to a Python writer through the JVM (Arrow -> rows -> Arrow), per row;
with one row per change and the row as JSON text that hand-off and the writer's JSON decode were most of an
epoch (issue 26, docs/benchmarks.md). Packed, Spark moves a few large binary values, and the routing sink reads
typed Arrow without decoding JSON.

Columns (:data:`PACKED_DDL`)::

    _table       string     'schema.table'
    _op          string     's': a schema row -- batch holds the TableSchema JSON (UTF-8), _lsn/_seq as in the
                                 JSON shape (null: a snapshot's);
                            'p': a pack of consecutive rows of _table, all written in _schema_id, typed;
                            'j': the same, not typed yet (the source's ``decodeIn=sink``): ``batch`` holds the rows
                                 as the JSON shape has them (_op, _lsn, _seq, _commit_ts, row), the sink task types
                                 them (:func:`pack_rows`) -- the typing then runs in the tasks the stream is spread
                                 to, not in the one task that reads the change stream;
                            'w': the same, as the pgoutput messages of its changes (``decodeIn=sink``,
                                 :mod:`.wire`): ``batch`` holds each change's message, its _lsn, _seq and _commit_ts
    _schema_id   string     the schema of the pack's rows (of the schema row: its own id)
    _lsn, _seq   bigint/int the first row's (null: snapshot rows)
    _last_lsn    bigint     the last row's _lsn
    _count       int        the pack's data rows (r, c, u, d)
    _changes     int        the pack's changes (c, u, d, t)
    _commit_ts   timestamp  the newest commit time of the pack's changes (null: none); of a schema row: its own
    batch        binary     'p': an Arrow IPC stream of the rows: the table's columns typed as
                            ``TableSchema.arrow_schema()``, then _op (r c u d t B E), _lsn, _seq, _commit_ts and
                            _unchanged (the columns a TOAST-unchanged update did not carry), exactly the columns of
                            :attr:`..decode.TableRows.rows` for one schema

What it guarantees (the same as the JSON shape's, :mod:`flinkish_spark.connectors.postgres.rows`): every row of the
JSON shape is in exactly one pack, typed as :func:`..decode.split_tables` types it (the packer uses the same
decoder: a sink gets the same values from either shape); within a table the packs and schema rows are in stream
order, and a schema row comes before the first pack that names its schema in the same partition. Across tables a
read's rows are grouped per table (a pack holds one table's rows of up to one source batch): no sink relies on an
order between tables within an epoch (each table is applied by key on its own, the decision record is per epoch).
Values the typed columns cannot hold (NaN in a decimal, infinite or BC dates and timestamps) are null, as they are
in the lakehouse targets of the JSON shape; :func:`unpack_json` gives JSON rows back for sinks that read JSON.
"""

from __future__ import annotations

import base64
import functools
import json
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.rows.decode import UNCHANGED
from flinkish_spark.connectors.postgres.rows.encode import UNCHANGED_FIELD
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema
from flinkish_spark.connectors.postgres.rows.typed import typed_rows
from flinkish_spark.connectors.postgres.rows.wire import wire_rows

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

#: Rows of one pack at most; :data:`PACK_BYTES` of JSON text bounds it too (a wide table's rows).
PACK_ROWS = 65_536
PACK_BYTES = 32 << 20

_TS = pa.timestamp("us", tz="UTC")
#: Tuples, not module-level ``pa.array``: building an Arrow array imports pandas (pyarrow's shim) at import.
_ROW_OPS = ("r", "c", "u", "d")
_CHANGE_OPS = ("c", "u", "d", "t")
PACKED_ARROW = pa.schema([
    pa.field("_table", pa.string()), pa.field("_op", pa.string()), pa.field("_schema_id", pa.string()),
    pa.field("_lsn", pa.int64()), pa.field("_seq", pa.int32()), pa.field("_last_lsn", pa.int64()),
    pa.field("_count", pa.int32()), pa.field("_changes", pa.int32()), pa.field("_commit_ts", _TS),
    pa.field("batch", pa.binary()),
])
PACKED_COLUMNS = tuple(PACKED_ARROW.names)
PACKED_DDL = (
    "`_table` string, `_op` string, `_schema_id` string, `_lsn` bigint, `_seq` int, `_last_lsn` bigint, "
    "`_count` int, `_changes` int, `_commit_ts` timestamp, `batch` binary"
)
ROW_FORMATS = ("json", "arrow")
#: The source option ``decodeIn`` (``rowFormat=arrow``): where a change's values are typed (``sink``: ``w`` and ``j``
#: packs, typed by the sink task).
DECODE_IN = ("source", "sink")


def packed_schema() -> "StructType":
    """:data:`PACKED_DDL` as a Spark ``StructType`` (built without a Spark session)."""
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("_table", T.StringType()), T.StructField("_op", T.StringType()),
        T.StructField("_schema_id", T.StringType()), T.StructField("_lsn", T.LongType()),
        T.StructField("_seq", T.IntegerType()), T.StructField("_last_lsn", T.LongType()),
        T.StructField("_count", T.IntegerType()), T.StructField("_changes", T.IntegerType()),
        T.StructField("_commit_ts", T.TimestampType()), T.StructField("batch", T.BinaryType()),
    ])


def is_packed(names: Iterable[str]) -> bool:
    """Whether a stream with these columns is the packed shape."""
    return tuple(names) == PACKED_COLUMNS


# -- packing (the source's reader) --------------------------------------------------------------------------------


class Packer:
    """Packs one read's stream batches (JSON shape, in stream order); the schema rows seen so far name the
    schemas of the rows after them (a read carries the ``s`` row of every schema its rows name, ahead of them).
    ``defer``: ``j`` packs (rows as they are, typed by the sink task) instead of ``p`` packs."""

    def __init__(self, defer: bool = False) -> None:
        self.schemas: dict[str, TableSchema] = {}
        self.defer = defer

    def pack_all(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if b.num_rows:
                yield b if is_packed(b.schema.names) else self.pack(b)  # packed where it was read

    def pack(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One stream batch as packed rows: per table (in the order tables first appear), its rows in stream order,
        a pack per run of one schema, a schema row as it is."""
        n = batch.num_rows
        tidx = np.asarray(pc.dictionary_encode(batch.column("_table")).indices, np.int64)
        sidx = np.asarray(pc.dictionary_encode(batch.column("_schema_id")).indices.fill_null(-1), np.int64)
        is_s = np.asarray(pc.equal(batch.column("_op"), "s").fill_null(False), bool)
        first = np.full(int(tidx.max()) + 1, n, np.int64)
        np.minimum.at(first, tidx, np.arange(n))
        rank = np.empty(len(first), np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        order = np.argsort(rank[tidx], kind="stable")
        t, s, k = tidx[order], sidx[order], is_s[order]
        cut = np.flatnonzero((t[1:] != t[:-1]) | (s[1:] != s[:-1]) | k[1:] | k[:-1]) + 1
        bounds = np.concatenate([[0], cut, [n]]).tolist()
        contiguous = bool(np.array_equal(order, np.arange(n)))
        ordered = batch if contiguous else batch.take(pa.array(order))  # one take; each part a slice of it
        fig = _Figures.of(ordered)
        rows: list[dict[str, Any]] = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            part = ordered.slice(a, b - a)
            if k[a]:
                rows.append(self._schema_row(part))
            else:
                rows.extend(self._packs(part, fig, a))
        return pa.RecordBatch.from_pylist(rows, schema=PACKED_ARROW)

    def _schema_row(self, part: pa.RecordBatch) -> dict[str, Any]:
        r = part.to_pylist()[0]
        schema = _schema_of(r["row"])
        self.schemas[schema.schema_id] = schema
        return {"_table": r["_table"], "_op": "s", "_schema_id": schema.schema_id, "_lsn": r["_lsn"],
                "_seq": r["_seq"], "_last_lsn": r["_lsn"], "_count": 0, "_changes": 0, "_commit_ts": r["_commit_ts"],
                "batch": r["row"].encode()}

    def _packs(self, part: pa.RecordBatch, fig: "_Figures", at0: int) -> Iterator[dict[str, Any]]:
        sid = part.column("_schema_id")[0].as_py()
        schema = self.schemas.get(sid)
        table = part.column("_table")[0].as_py()
        if schema is None:
            raise ValueError(f"rows of {table} name schema {sid} without an 's' row before them in the same read")
        per = max(1, min(PACK_ROWS, int(PACK_BYTES * part.num_rows // max(1, part.column("row").nbytes))))
        for at in range(0, part.num_rows, per):
            rows = part.slice(at, per)
            yield self._pack(table, schema, rows, fig.of_rows(at0 + at, rows.num_rows))

    def _pack(self, table: str, schema: TableSchema, rows: pa.RecordBatch, figures: dict[str, Any]) -> dict[str, Any]:
        body = rows.select(_JSON_PACK) if self.defer else typed_rows(schema, rows)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, body.schema) as w:
            w.write(body)
        return {"_table": table, "_op": "j" if self.defer else "p", "_schema_id": schema.schema_id, **figures,
                "batch": sink.getvalue().to_pybytes()}


@functools.lru_cache(maxsize=4096)
def _schema_of(text: str) -> TableSchema:
    """A schema row's schema (the same text every read of a table carries: parsed once per process)."""
    return TableSchema.from_json(text)


class _Figures:
    """What a packed row says of its rows, for every row of a batch at once (numpy), then per pack by slicing."""

    def __init__(self, lsn: np.ndarray, has_lsn: np.ndarray, seq: np.ndarray, has_seq: np.ndarray, ts: np.ndarray,
                 is_row: np.ndarray, is_change: np.ndarray) -> None:
        self.lsn, self.has_lsn, self.seq, self.has_seq, self.ts = lsn, has_lsn, seq, has_seq, ts
        self.is_row, self.is_change = is_row, is_change

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> "_Figures":
        ops = batch.column("_op")
        lsn, seq = batch.column("_lsn"), batch.column("_seq")
        ts = batch.column("_commit_ts").cast(pa.int64())
        return cls(lsn.fill_null(0).to_numpy(), lsn.is_valid().to_numpy(zero_copy_only=False),
                   seq.fill_null(0).to_numpy(), seq.is_valid().to_numpy(zero_copy_only=False),
                   np.where(ts.is_valid().to_numpy(zero_copy_only=False), ts.fill_null(0).to_numpy(), np.iinfo(np.int64).min),
                   pc.is_in(ops, pa.array(_ROW_OPS, pa.string())).to_numpy(zero_copy_only=False),
                   pc.is_in(ops, pa.array(_CHANGE_OPS, pa.string())).to_numpy(zero_copy_only=False))

    def of_rows(self, a: int, n: int) -> dict[str, Any]:
        """The packed row's columns but ``batch`` for the rows [a, a + n): first and last LSN, first seq, counts,
        the newest commit time of its changes (see the module docstring)."""
        b = a + n
        changes = self.is_change[a:b]
        newest = int(self.ts[a:b][changes].max()) if changes.any() else None
        return {"_lsn": int(self.lsn[a]) if self.has_lsn[a] else None,
                "_seq": int(self.seq[a]) if self.has_seq[a] else None,
                "_last_lsn": int(self.lsn[b - 1]) if self.has_lsn[b - 1] else None,
                "_count": int(np.count_nonzero(self.is_row[a:b])), "_changes": int(np.count_nonzero(changes)),
                "_commit_ts": None if newest is None or newest == np.iinfo(np.int64).min else newest}


#: The columns of a ``j`` pack's rows: the JSON shape's, without what the packed row itself says (table, schema id).
_JSON_PACK = ("_op", "_lsn", "_seq", "_commit_ts", "row")


def packing(row_format: str, defer: bool = False) -> "Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] | None":
    """What a multi-table source's reader applies to its stream rows for ``rowFormat`` (None: ``json``, as they are);
    a fresh :class:`Packer` per read, as a read's runs end with it. ``defer``: the source's ``decodeIn=sink``."""
    return (lambda rows: Packer(defer).pack_all(rows)) if row_format == "arrow" else None


def read_pack(blob: pa.Buffer | bytes) -> pa.Table:
    """A pack's rows (its ``batch`` value) as they are: typed for ``p``, JSON-shape for ``j``."""
    return pa.ipc.open_stream(blob).read_all()


def pack_rows(op: str, schema: TableSchema, blob: pa.Buffer | bytes) -> pa.Table:
    """A ``p``, ``j`` or ``w`` pack's rows typed (``schema``: the one its ``_schema_id`` names)."""
    rows = read_pack(blob)
    if op == "j":
        return typed_rows(schema, rows)
    if op == "w":
        return wire_rows(schema, rows)
    return rows


# -- back to the JSON shape (sinks that read JSON rows) --------------------------------------------------------------


def unpack_json(stream: pa.Table) -> pa.Table:
    """Packed stream rows as the JSON shape's rows (:data:`..STREAM_DDL`), in the same order: a schema row as it
    was, each packed row's rows with their ``row`` written again from the typed values (a delete: its key only;
    a TOAST-unchanged update: without the columns it did not carry)."""
    from flinkish_spark.connectors.postgres.source.stream_rows import STREAM_ARROW

    schemas: dict[str, TableSchema] = {}
    out: list[pa.RecordBatch] = []
    for batch in stream.to_batches():
        blobs = batch.column("batch")
        for i, r in enumerate(batch.select([n for n in PACKED_COLUMNS if n != "batch"]).to_pylist()):
            blob = blobs[i].as_buffer()
            if r["_op"] == "s":
                text = blob.to_pybytes().decode()
                schemas[r["_schema_id"]] = TableSchema.from_json(text)
                out.append(pa.RecordBatch.from_pylist([{
                    "_table": r["_table"], "_op": "s", "_lsn": r["_lsn"], "_seq": r["_seq"], "_commit_ts": r["_commit_ts"],
                    "_schema_id": r["_schema_id"], "row": text}], schema=STREAM_ARROW))
                continue
            schema = schemas[r["_schema_id"]]
            if r["_op"] == "j":  # not typed: the JSON rows as they were read
                rows = read_pack(blob)
                texts = rows.column("row").to_pylist()
            else:
                rows = pack_rows(r["_op"], schema, blob)
                texts = [_row_json(schema, row) for row in rows.to_pylist()]
            n = rows.num_rows
            out.append(pa.RecordBatch.from_arrays([
                pa.array([r["_table"]] * n, pa.string()), rows.column("_op").combine_chunks(),
                rows.column("_lsn").combine_chunks(), rows.column("_seq").combine_chunks(),
                rows.column("_commit_ts").combine_chunks().cast(_TS), pa.array([r["_schema_id"]] * n, pa.string()),
                pa.array(texts, pa.string())], schema=STREAM_ARROW))
    return pa.Table.from_batches(out, schema=STREAM_ARROW)


def _row_json(schema: TableSchema, row: dict[str, Any]) -> str | None:
    op = row["_op"]
    if op not in ("r", "c", "u", "d"):
        return None  # t, B, E carry no row
    unchanged = row.get(UNCHANGED) or []
    names = schema.key if op == "d" and schema.key else tuple(c.name for c in schema.columns if c.name not in unchanged)
    by_name = {c.name: c for c in schema.columns}
    parts = [f"{json.dumps(n, ensure_ascii=False)}:{_value_json(row.get(n), by_name[n])}" for n in names]
    if unchanged:
        parts.append(f"{json.dumps(UNCHANGED_FIELD)}:{json.dumps(list(unchanged), ensure_ascii=False)}")
    return "{" + ",".join(parts) + "}"


def _value_json(v: Any, col: Column) -> str:
    if v is None:
        return "null"
    kind = col.element if col.encoding == "array" else col.encoding
    if isinstance(v, list):
        return "[" + ",".join(_scalar_json(x, kind) for x in v) + "]"
    return _scalar_json(v, col.encoding)


def _scalar_json(v: Any, kind: str | None) -> str:
    if v is None:
        return "null"
    if isinstance(v, list):
        return "[" + ",".join(_scalar_json(x, kind) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, Decimal)):
        return str(v)
    if isinstance(v, float):
        return json.dumps(v)  # NaN, Infinity as bare tokens, as the source writes them
    if isinstance(v, bytes):
        return json.dumps(base64.b64encode(v).decode())
    if isinstance(v, datetime):
        text = v.isoformat(sep=" ")
        return json.dumps(text[:-6] + "+00" if text.endswith("+00:00") else text)
    if isinstance(v, date):
        return json.dumps(v.isoformat())
    return json.dumps(str(v), ensure_ascii=False)
