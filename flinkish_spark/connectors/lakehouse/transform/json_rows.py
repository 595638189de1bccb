"""A transformed table's typed rows written as the stream's JSON rows again, column by column (PostgreSQL targets).

The guarantee: :func:`json_rows` gives, row for row, the text
:func:`flinkish_spark.connectors.postgres.rows.packed._row_json` gives (the source's encoding of each value, a
delete's key only, a TOAST-unchanged update without the columns it did not carry and with their list) -- the tests
compare them. Why its own: the routed PostgreSQL sink stages JSON rows, so a ruled table's rows are written again
before staging; per row and per value through the generic writer that was two thirds of the transform's time
(docs/benchmarks.md, "Transforms"). Here each column's name is written once and its values by one function of its
encoding, over the column's Python values.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pyarrow as pa

from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD, Column, TableSchema
from flinkish_spark.connectors.postgres.rows.packed import _value_json

_string: Callable[[str], str] = json.encoder.encode_basestring
_UNCHANGED_KEY = json.dumps(UNCHANGED_FIELD) + ":"


def _writer(column: Column) -> Callable[[Any], str]:
    """The JSON text of a value of ``column`` (not null)."""
    if column.encoding == "string" and column.spark_type == "string":
        return lambda v: _string(v) if isinstance(v, str) else _value_json(v, column)
    if column.encoding == "number" and not column.spark_type.startswith(("float", "double")):
        return str  # ints and decimals: every digit
    if column.encoding == "bool":
        return lambda v: "true" if v else "false"
    return lambda v: _value_json(v, column)


def json_rows(schema: TableSchema, rows: pa.Table) -> list[str | None]:
    """``rows`` (``schema``'s columns -- a missing one is null -- ``_op`` and ``_unchanged``) as JSON row texts
    (None for a row that is no row change: ``t``, ``B``, ``E``)."""
    n = rows.num_rows
    ops = rows.column("_op").to_pylist()
    unchanged = rows.column("_unchanged").to_pylist() if "_unchanged" in rows.column_names else [None] * n
    key = set(schema.key)
    columns = []
    for c in schema.columns:
        values = rows.column(c.name).to_pylist() if c.name in rows.column_names else [None] * n
        write = _writer(c)
        columns.append((c.name, json.dumps(c.name, ensure_ascii=False) + ":",
                        ["null" if v is None else write(v) for v in values], c.name in key))
    out: list[str | None] = []
    for i in range(n):
        op = ops[i]
        if op not in ("r", "c", "u", "d"):
            out.append(None)
            continue
        skip = unchanged[i] or ()
        if op == "d" and key:
            parts = [prefix + texts[i] for _, prefix, texts, is_key in columns if is_key]
        else:
            parts = [prefix + texts[i] for name, prefix, texts, _ in columns if name not in skip]
        if skip:
            parts.append(_UNCHANGED_KEY + json.dumps(list(skip), ensure_ascii=False))
        out.append("{" + ",".join(parts) + "}")
    return out
