"""A MySQL change range in the packed shape (``rowFormat=arrow``, :mod:`..postgres.rows.packed`) straight from the
decoded values: no JSON text per change, none parsed back.

Today's JSON shape writes each change's values (:class:`.row_values.RowDecoder`) as JSON
(:func:`.stream_rows.row_encoder`) and the reader's :class:`..postgres.rows.packed.Packer` decodes that JSON back into
the columns of ``TableSchema.arrow_schema()``. :class:`PackedRows` is the row collector of
:func:`.change_stream.change_batches` with ``packed=True``: the same rows, added in the same order (the ``s`` rows,
``t`` rows, ``_op``/``_lsn``/``_seq``/``_commit_ts`` are decided there, once for both shapes), kept per table as a
run of one schema and put into packs column by column.

What it guarantees: the packed rows hold what the Packer makes of the JSON rows, value for value -- per table the
same ``s`` rows and the same rows in the same order (a ``t`` inside a pack, its columns null, as the Packer puts
it); ``_unchanged`` null (a MySQL change is a whole row image; a delete carries its whole before image in the pack,
as the Packer decodes it from the JSON). Across tables the order within a read is not kept, as the Packer does not
keep it either (:mod:`..postgres.rows.packed`). A schema change inside a run (an ``ADD COLUMN`` mid-range: a new
``s`` row) ends the run: the rows before it are packed first, then the ``s`` row, then a new run. The statements the
enumerator acts on are not stream rows in either shape (it finds them when it plans the range,
:meth:`.dialect.MysqlDialect.change_target`); a re-snapshot's ``B``/``E`` markers come with its chunks
(:mod:`.chunk_rows`), never inside a change range.

A column goes into its pack directly (``pa.array`` of the values) when every value is of the Python type the decoder
gives for the pack's Arrow type -- int for integers, int or Decimal for decimals, float, str, bytes or str for
binary, bool, date, datetime (naive for DATETIME, aware UTC for TIMESTAMP: the same table map decides the decoder
and the schema) -- which is every type of :mod:`.types` today. Anything else -- a DECIMAL(p > 38) (a Decimal into a
text column), a value Arrow refuses (invalid UTF-8 bytes in a text column) -- falls back to today's path for that
column of that pack: each value written by the JSON shape's encoder and decoded as the Packer decodes it.
``tests/connectors/mysql/test_packed_changes.py`` compares the two shapes on a range of inserts, updates with NULLs,
key moves, deletes, an ADD COLUMN, two tables, a truncate and every type.

A change read's rows mostly come as row images (:class:`.row_images.ImageDecoder`, the dialect's decoder for packed
reads): a run of them is cut into the same columns without a Python value per column (:mod:`.image_columns`, which
takes the path above for the columns it does not cut itself); a run with another row in it (a ``t`` row, an event the
decoder gave values for) is made from the values, each image's :meth:`~.row_images.RowImage.values`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal
from typing import Any, Sequence

import pyarrow as pa

from flinkish_spark.connectors.mysql.image_columns import image_columns
from flinkish_spark.connectors.mysql.row_images import RowImage
from flinkish_spark.connectors.mysql.stream_rows import row_encoder
from flinkish_spark.connectors.postgres.rows.decode import ROW_META, decode_rows
from flinkish_spark.connectors.postgres.rows.packed import PACK_BYTES, PACK_ROWS, PACKED_ARROW
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema

_TS = pa.timestamp("us", tz="UTC")
_NONE = type(None)
#: Rows kept before a flush into packs (all tables): a pack's most, as the Packer's packs -- and at most about
#: :data:`FLUSH_VALUES` values, which bounds the Python objects held for a wide table's rows (~50 MB).
FLUSH_ROWS = PACK_ROWS
FLUSH_VALUES = 1 << 19


def accepted(target: pa.DataType) -> frozenset[type]:
    """The Python types of decoded values that ``pa.array`` puts into ``target`` as the JSON way would."""
    if pa.types.is_integer(target):
        return frozenset({int})
    if pa.types.is_decimal(target):
        return frozenset({int, Decimal})
    if pa.types.is_floating(target):
        return frozenset({float})
    if pa.types.is_string(target):
        return frozenset({str})
    if pa.types.is_binary(target):
        return frozenset({bytes, str})  # str: MariaDB's UUID/INET text in a binary column, UTF-8 as the JSON way
    if pa.types.is_boolean(target):
        return frozenset({bool})
    if pa.types.is_date32(target):
        return frozenset({dt.date})
    if pa.types.is_timestamp(target):
        return frozenset({dt.datetime})
    return frozenset()


def by_json(values: Sequence[Any], col: Column) -> pa.Array:
    """A column the JSON shape's way: each value written by its encoder, the texts decoded as the Packer does."""
    one = TableSchema("packed.column", (dataclasses.replace(col, name="v"),), ())
    encode = row_encoder(one)
    return decode_rows(pa.array([encode((v,)) for v in values], pa.string()), one).column(0).combine_chunks()


def typed_values(values: Sequence[Any], col: Column, target: pa.DataType) -> pa.Array:
    """A column's decoded values as the pack's typed column (see the module docstring)."""
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    if kinds <= accepted(target):
        try:
            return pa.array(values, target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass  # e.g. bytes that are not UTF-8 in a text column: the JSON way replaces them
    return by_json(values, col)


def _same(values: Any) -> Any:
    return values


@dataclasses.dataclass
class _Run:
    """One table's rows since its last ``s`` row (or flush), all in ``schema``."""

    schema: TableSchema
    width: int
    values: list[Any] = dataclasses.field(default_factory=list)
    ops: list[str] = dataclasses.field(default_factory=list)
    lsns: list[int] = dataclasses.field(default_factory=list)
    seqs: list[int] = dataclasses.field(default_factory=list)
    ts: list[int] = dataclasses.field(default_factory=list)


class PackedRows:
    """The row collector of :func:`.change_stream.change_batches` for the packed shape (the JSON shape's is
    :class:`.change_stream.JsonRows`): rows per table in runs, flushed as :data:`PACKED_ARROW` batches."""

    def __init__(self) -> None:
        self.runs: dict[str, _Run] = {}
        self.out: list[dict[str, Any]] = []
        self.pending = 0
        self.cells = 0

    def encoder(self, schema: TableSchema) -> Any:
        return _same  # the decoded values as they are: typed per column when packed

    def add_schema(self, schema: TableSchema, lsn: int, seq: int, ts: int) -> None:
        self._pack_run(schema.table)  # the table's rows in the schema before, ahead of the new 's' row
        self.out.append({"_table": schema.table, "_op": "s", "_schema_id": schema.schema_id, "_lsn": lsn,
                         "_seq": seq, "_last_lsn": lsn, "_count": 0, "_changes": 0, "_commit_ts": ts,
                         "batch": schema.to_json().encode()})
        self.runs[schema.table] = _Run(schema, len(schema.columns))

    def add_truncate(self, schema: TableSchema, lsn: int, seq: int, ts: int) -> None:
        self.add(schema.table, "t", lsn, seq, ts, schema.schema_id, None)

    def add(self, table: str, op: str, lsn: int, seq: int, ts: int, schema_id: str, values: Any) -> None:
        run = self.runs[table]  # change_batches adds the table's 's' row before its first row of a read
        run.values.append(values)
        run.ops.append(op)
        run.lsns.append(lsn)
        run.seqs.append(seq)
        run.ts.append(ts)
        self.pending += 1
        self.cells += run.width

    def full(self) -> bool:
        return self.pending >= FLUSH_ROWS or self.cells >= FLUSH_VALUES

    def __len__(self) -> int:
        return self.pending + len(self.out)

    def flush(self) -> pa.RecordBatch:
        for table in self.runs:
            self._pack_run(table)
        out, self.out = self.out, []
        return pa.RecordBatch.from_pylist(out, schema=PACKED_ARROW)

    def _pack_run(self, table: str) -> None:
        run = self.runs.get(table)
        if run is None or not run.ops:
            return
        self.pending -= len(run.ops)
        self.cells -= len(run.ops) * run.width
        self.out.extend(packs(run))
        self.runs[table] = _Run(run.schema, run.width)


def _columns(values: list[Any], schema: TableSchema, target: pa.Schema) -> list[pa.Array]:
    """A run's rows as the pack's typed columns: row images (:mod:`.row_images`) cut column by column
    (:mod:`.image_columns`), else each column from the decoded values."""
    if all(type(v) is RowImage for v in values):
        cut = image_columns(values, schema.columns, target, typed_values)
        if cut is not None:
            return cut
    nulls = [None] * len(schema.columns)
    rows = [nulls if v is None else v.values() if type(v) is RowImage else v for v in values]  # 't': columns null
    return [typed_values(vals, col, target.field(i).type)
            for i, (col, vals) in enumerate(zip(schema.columns, zip(*rows)))]


def packs(run: _Run) -> list[dict[str, Any]]:
    """A run's rows as packed rows, each at most :data:`PACK_ROWS` rows and about :data:`PACK_BYTES` of Arrow."""
    schema, n = run.schema, len(run.ops)
    width = len(schema.columns)
    target = schema.arrow_schema()
    typed = _columns(run.values, schema, target) if width else []
    meta = [pa.array(run.ops, pa.string()), pa.array(run.lsns, pa.int64()), pa.array(run.seqs, pa.int32()),
            pa.array(run.ts, pa.int64()).cast(_TS), pa.nulls(n, pa.list_(pa.string()))]
    body = pa.Table.from_arrays(typed + meta, names=list(schema.names) + list(ROW_META))
    per = max(1, min(PACK_ROWS, int(PACK_BYTES * n // max(1, body.nbytes))))
    out = []
    for at in range(0, n, per):
        part = body.slice(at, per)
        k = part.num_rows
        ops = run.ops[at:at + k]
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as w:
            w.write_table(part)
        out.append({"_table": schema.table, "_op": "p", "_schema_id": schema.schema_id, "_lsn": run.lsns[at],
                    "_seq": run.seqs[at], "_last_lsn": run.lsns[at + k - 1], "_count": k - ops.count("t"),
                    "_changes": k, "_commit_ts": max(run.ts[at:at + k]), "batch": sink.getvalue().to_pybytes()})
    return out
