"""Reading the multi-table stream back: typed Arrow per table (sinks) and typed Spark columns (SQL users).

:func:`decode_rows` turns JSON rows of one schema into a typed Arrow table with pyarrow's
C++ JSON reader (a Python fallback only for values that reader refuses, e.g. NaN in a
decimal column). :func:`split_tables` does what a routing sink needs for one epoch: group
the rows per table, decode each row with the schema it names, and bring all of a table's
rows to one Arrow schema. :func:`mirror_rows` is the Spark SQL equivalent for one table.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.rows.encode import UNCHANGED_FIELD
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema, arrow_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The columns every row of the stream has besides ``row`` (see :mod:`flinkish_spark.connectors.postgres.rows`).
META_COLUMNS = ("_table", "_op", "_lsn", "_seq", "_commit_ts", "_schema_id")
#: The column of :attr:`TableRows.rows` that lists, per row, the columns its change did not carry (an update that
#: left a TOASTed value unchanged; null: it carries every column). A keyed target keeps its value for them.
UNCHANGED = "_unchanged"
#: The columns of :attr:`TableRows.rows` besides the table's own.
ROW_META = ("_op", "_lsn", "_seq", "_commit_ts", UNCHANGED)
_UNCHANGED_TEXT = json.dumps(UNCHANGED_FIELD)  # how the field's name appears in a row's JSON text


def _read_type(column: Column) -> pa.DataType:
    """The type pyarrow's JSON reader reads the column as (dates via timestamps; bytea as its base64 text)."""
    t = arrow_type(column.spark_type)
    if pa.types.is_date32(t):
        return pa.timestamp("s")
    if pa.types.is_binary(t):
        return pa.string()
    return t


def decode_rows(rows: Iterable[str] | pa.Array | pa.ChunkedArray, schema: TableSchema) -> pa.Table:
    """The JSON rows (``row`` values of one ``_schema_id``) as a typed table of ``schema.arrow_schema()``.

    Values without an Arrow equivalent -- NaN in a decimal column, +-infinity and BC dates and
    timestamps, a multi-dimensional array (the column's type says one dimension) -- become null
    (as in Spark's ``from_json``); the JSON text keeps them exactly.
    A key-only delete row has nulls in its other columns.
    """
    def texts() -> list[str]:
        return [t if t is not None else "{}" for t in  # a truncate row has no row: all null
                (rows.to_pylist() if isinstance(rows, (pa.Array, pa.ChunkedArray)) else list(rows))]

    target = schema.arrow_schema()
    lines = None
    if isinstance(rows, (pa.Array, pa.ChunkedArray)):
        if not len(rows):
            return target.empty_table()
        lines = _lines(rows)
    if lines is None:
        listed = texts()
        if not listed:
            return target.empty_table()
        lines = pa.py_buffer("\n".join(listed).encode())
    import pyarrow.json as pj

    read_schema = pa.schema([pa.field(c.name, _read_type(c)) for c in schema.columns])
    try:
        table = pj.read_json(
            pa.BufferReader(lines),
            read_options=pj.ReadOptions(block_size=1 << 24),
            parse_options=pj.ParseOptions(explicit_schema=read_schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _decode_slowly(texts(), schema)
    arrays = []
    for column, field in zip(schema.columns, target):
        arr = table.column(column.name)
        if pa.types.is_date32(field.type):
            arr = arr.cast(field.type)
        elif pa.types.is_binary(field.type):
            arr = pa.chunked_array([pa.array([None if v is None else base64.b64decode(v) for v in arr.to_pylist()],
                                             pa.binary())])
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=target)


#: Above this many bytes of JSON text the rows are joined in Python (Arrow's string offsets are 32-bit).
_ARROW_LINES_MAX = 1 << 30


def _lines(rows: pa.Array | pa.ChunkedArray) -> pa.Buffer | None:
    """The rows as newline-delimited JSON (a null row -- a truncate's -- is ``{}``), joined by Arrow without a
    Python string per row; None when the rows are too large for that."""
    if rows.nbytes >= _ARROW_LINES_MAX:
        return None
    joined = pc.binary_join_element_wise(pc.fill_null(rows, "{}"), "\n", "")
    if isinstance(joined, pa.ChunkedArray):
        joined = joined.combine_chunks() if joined.num_chunks != 1 else joined.chunk(0)
    if not len(joined):
        return pa.py_buffer(b"")
    offsets = np.frombuffer(joined.buffers()[1], np.int32, len(joined) + 1, joined.offset * 4)
    return joined.buffers()[2][int(offsets[0]):int(offsets[-1])]


def _decode_slowly(texts: list[str], schema: TableSchema) -> pa.Table:
    """One value at a time in Python: for the rare rows pyarrow's reader refuses."""
    target = schema.arrow_schema()
    parsed = [json.loads(t) for t in texts]
    arrays = []
    for column, field in zip(schema.columns, target):
        convert = _converter(field.type)
        arrays.append(pa.array([convert(r.get(column.name)) for r in parsed], field.type))
    return pa.Table.from_arrays(arrays, schema=target)


def _converter(t: pa.DataType) -> Callable[[Any], Any]:
    def guard(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(v: Any) -> Any:
            if v is None:
                return None
            try:
                return fn(v)
            except (ValueError, ArithmeticError, InvalidOperation):
                return None  # infinity, BC, NaN in a decimal: nothing Arrow can hold

        return run

    if pa.types.is_decimal(t):
        return guard(lambda v: None if isinstance(v, float) and math.isnan(v) else Decimal(str(v)))
    if pa.types.is_date32(t):
        return guard(lambda v: date.fromisoformat(v))
    if pa.types.is_timestamp(t):
        if t.tz is None:
            return guard(lambda v: datetime.fromisoformat(v))
        return guard(lambda v: datetime.fromisoformat(v).astimezone(timezone.utc))
    if pa.types.is_binary(t):
        return guard(lambda v: base64.b64decode(v))
    if pa.types.is_list(t):
        inner = _converter(t.value_type)
        nested = pa.types.is_list(t.value_type)

        def items(v: Any) -> list[Any]:
            if not nested and any(isinstance(x, list) for x in v):
                raise ValueError("a multi-dimensional array in a one-dimensional column")
            return [inner(x) for x in v]

        return guard(items)
    return lambda v: v


@dataclass(frozen=True)
class TableRows:
    """One table's rows of an epoch, decoded.

    ``schemas``: every schema the epoch's rows of the table used, oldest first (a schema
    change in the epoch gives two or more). ``schema``: the newest, the one to evolve the
    target to. ``rows``: the data rows (``_op`` r, c, u, d, t, and B/E) in stream order -- snapshot
    rows first, then changes by (``_lsn``, ``_seq``) -- with the columns of every schema
    (newest first, then columns only older schemas had, null in newer rows) in the newest
    type, plus ``_op``, ``_lsn``, ``_seq``, ``_commit_ts`` and ``_unchanged`` (:data:`UNCHANGED`: the
    columns an update did not carry -- null in ``rows`` -- or null).
    """

    table: str
    schemas: tuple[TableSchema, ...]
    rows: pa.Table

    @property
    def schema(self) -> TableSchema:
        return self.schemas[-1]


def split_tables(batch: pa.Table | pa.RecordBatch) -> dict[str, TableRows]:
    """An epoch's stream rows (Arrow, as a sink receives them) per table, each decoded and typed.

    Every partition of the stream carries an ``_op = 's'`` row for each schema its data rows
    name, so the rows of one epoch always hold every schema they need.
    """
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    ops = table.column("_op")
    schemas: dict[str, TableSchema] = {}
    order: dict[str, list[tuple[Any, ...]]] = {}  # table -> [(sort key, schema_id)] of its schema rows
    for s in table.filter(pc.equal(ops, "s")).to_pylist():
        ts = TableSchema.from_json(s["row"])
        schemas[ts.schema_id] = ts
        order.setdefault(ts.table, []).append((_sort_key(s), ts.schema_id))
    data = table.filter(pc.not_equal(ops, "s"))
    in_data = pc.unique(data.column("_table")).to_pylist()
    out: dict[str, TableRows] = {}
    for name in sorted(set(in_data) | set(order)):
        # One table in the rows (a one-table mirror, or a task of one table's changes): they are all its own, no
        # copy of the JSON texts by a filter.
        mine = data if in_data == [name] else data.filter(pc.equal(data.column("_table"), name))
        versions = _versions(order.get(name, []))
        missing = set(mine.column("_schema_id").to_pylist()) - set(versions) - {None}
        if missing:
            raise ValueError(f"rows of {name} name schemas {sorted(missing)} without an 's' row in the same batch")
        out[name] = TableRows(name, tuple(schemas[v] for v in versions), _typed(mine, [schemas[v] for v in versions]))
    return out


def _sort_key(row: dict[str, Any]) -> tuple[int, int, int]:
    lsn, seq = row.get("_lsn"), row.get("_seq")
    return (0, 0, 0) if lsn is None else (1, int(lsn), int(seq or 0))


def _versions(entries: list[tuple[Any, str]]) -> list[str]:
    seen: list[str] = []
    for _, sid in sorted(entries, key=lambda e: e[0]):
        if sid in seen:
            seen.remove(sid)
        seen.append(sid)
    return seen


def union_fields(schemas: list[TableSchema]) -> list[pa.Field]:
    """The columns of a table's rows under several schemas: the newest schema's, in its types, then the columns
    only older ones had (a dropped column's values stay in the rows written before the drop)."""
    fields = list(schemas[-1].arrow_schema())
    for s in reversed(schemas[:-1]):
        for f in s.arrow_schema():
            if f.name not in {x.name for x in fields}:
                fields.append(f)
    return fields


def conformed(table: pa.Table, fields: Iterable[pa.Field]) -> list[Any]:
    """``table``'s columns as ``fields`` say: cast where the type differs, nulls for a column it lacks."""
    cols: list[Any] = []
    for f in fields:
        if f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return cols


def _typed(rows: pa.Table, schemas: list[TableSchema]) -> pa.Table:
    """Decode each row with its schema, then bring them to the union of columns in the newest types."""
    union = pa.schema(union_fields(schemas))
    meta = list(ROW_META)
    indices = pc.sort_indices(
        pa.table({"s": pc.is_null(rows.column("_lsn")), "l": rows.column("_lsn"), "q": rows.column("_seq")}),
        sort_keys=[("s", "descending"), ("l", "ascending"), ("q", "ascending")],
    )
    if not _in_order(indices):  # the rows of one task come in stream order: then no copy by a take
        rows = rows.take(indices)
    parts = []
    by_id = {s.schema_id: s for s in schemas}
    ids = rows.column("_schema_id")
    for sid, schema in by_id.items():
        positions = pc.indices_nonzero(pc.equal(ids, sid))
        if len(positions) == 0:
            continue
        whole = len(positions) == rows.num_rows  # every row of this schema (nearly always): no copy by a take
        part = rows if whole else rows.take(positions)
        decoded = decode_rows(part.column("row"), schema)
        cols = conformed(decoded, union)
        cols += [part.column(m) for m in meta if m != UNCHANGED] + [_unchanged(part.column("row"))]
        parts.append((positions, pa.Table.from_arrays(cols, names=union.names + meta)))
    if not parts:
        return pa.schema(list(union) + [rows.schema.field(m) for m in meta if m != UNCHANGED]
                         + [pa.field(UNCHANGED, pa.list_(pa.string()))]).empty_table()
    if len(parts) == 1 and len(parts[0][0]) == rows.num_rows:
        return parts[0][1]
    merged = pa.concat_tables([p for _, p in parts])
    order = pc.sort_indices(pa.concat_arrays([pos for pos, _ in parts]))
    return merged.take(order)


def _in_order(indices: pa.Array) -> bool:
    """Whether sort indices are 0, 1, 2, ...: the rows are sorted already."""
    n = len(indices)
    return n == 0 or bool(np.array_equal(indices.to_numpy(zero_copy_only=False), np.arange(n, dtype=np.uint64)))


def _contains(texts: pa.ChunkedArray, needle: bytes) -> bool:
    """Whether any value holds ``needle`` (a search through the values' bytes; a match across two values only
    costs the exact search after it)."""
    for chunk in texts.chunks:
        if len(chunk) == 0 or chunk.buffers()[2] is None:
            continue
        offsets = np.frombuffer(chunk.buffers()[1], np.int32, len(chunk) + 1, chunk.offset * 4)
        if needle in chunk.buffers()[2][int(offsets[0]):int(offsets[-1])].to_pybytes():
            return True
    return False


def _unchanged(texts: pa.ChunkedArray) -> pa.Array:
    """Per JSON row, the columns it lists in ``UNCHANGED_FIELD`` (null when none: nearly every row, found by a
    substring search without parsing)."""
    if not _contains(texts, _UNCHANGED_TEXT.encode()):
        return pa.nulls(len(texts), pa.list_(pa.string()))
    marked = pc.fill_null(pc.match_substring(texts, _UNCHANGED_TEXT), False)
    out: list[list[str] | None] = [None] * len(texts)
    for i in pc.indices_nonzero(marked).to_pylist():
        listed = json.loads(texts[i].as_py()).get(UNCHANGED_FIELD)
        out[i] = [str(c) for c in listed] if listed else None
    return pa.array(out, pa.list_(pa.string()))


def mirror_rows(df: "DataFrame", schema: TableSchema) -> "DataFrame":
    """The data rows of one table of a stream DataFrame as typed Spark columns plus ``_op``,
    ``_lsn``, ``_seq``, ``_commit_ts`` -- ``from_json(row, schema.spark_ddl())`` on that table's rows."""
    from pyspark.sql import functions as F

    rows = df.where((F.col("_table") == schema.table) & (F.col("_op") != "s"))
    parsed = F.from_json(F.col("row"), schema.spark_ddl())
    return rows.select("_op", "_lsn", "_seq", "_commit_ts", parsed.alias("__row")).select(
        *[F.col("__row").getField(c.name).alias(c.name) for c in schema.columns], "_op", "_lsn", "_seq", "_commit_ts"
    )
