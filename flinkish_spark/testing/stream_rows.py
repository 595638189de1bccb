"""Multi-table stream rows made by hand, for routing-sink tests and benchmarks without a database.

:class:`StreamBuilder` writes what the multi-table ``flinkish.postgres`` source would: an ``s``
row ahead of a table's rows in every batch (and again after a schema change), ``_lsn`` /
``_seq`` increasing along the stream, key-only deletes, ``t`` truncates and ``B``/``E``
markers -- as the Arrow table a sink task receives (:data:`~flinkish_spark.connectors.postgres.rows.STREAM_DDL`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from flinkish_spark.connectors.postgres.rows import TableSchema, make_column

ARROW = pa.schema([
    pa.field("_table", pa.string()), pa.field("_op", pa.string()), pa.field("_lsn", pa.int64()),
    pa.field("_seq", pa.int32()), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_schema_id", pa.string()), pa.field("row", pa.string()),
])

_TYPES = {"int": ("integer", "int4", -1), "bigint": ("bigint", "int8", -1), "smallint": ("smallint", "int2", -1),
          "text": ("text", "text", -1), "float8": ("double precision", "float8", -1), "bool": ("boolean", "bool", -1)}


def table_schema(table: str, columns: list[tuple[str, str]], key: tuple[str, ...]) -> TableSchema:
    """A schema from (name, type) pairs: int, bigint, smallint, text, float8, bool, numeric(p,s), varchar(n)."""
    cols = []
    for name, t in columns:
        if t.startswith("numeric("):
            p, s = (int(x) for x in t[len("numeric("):-1].split(","))
            cols.append(make_column(name, t, "numeric", ((p << 16) | s) + 4, None))
        elif t.startswith("varchar("):
            cols.append(make_column(name, f"character varying({t[8:-1]})", "varchar", int(t[8:-1]) + 4, None))
        else:
            display, pg, typmod = _TYPES[t]
            cols.append(make_column(name, display, pg, typmod, None))
    return TableSchema(table, tuple(cols), key)


class StreamBuilder:
    """Rows of one epoch after another; :meth:`batch` returns and clears the rows so far."""

    def __init__(self, lsn: int = 1000) -> None:
        self.lsn = lsn
        self.rows: list[dict[str, Any]] = []
        self.announced: set[tuple[str, str]] = set()  # (table, schema id) with an 's' row in this batch

    def _schema_row(self, schema: TableSchema, lsn: int | None, seq: int | None) -> None:
        if (schema.table, schema.schema_id) not in self.announced:
            self.announced.add((schema.table, schema.schema_id))
            self.rows.append({"_table": schema.table, "_op": "s", "_lsn": lsn, "_seq": seq, "_commit_ts": None,
                              "_schema_id": schema.schema_id, "row": schema.to_json()})

    def snapshot(self, schema: TableSchema, rows: list[dict[str, Any]]) -> "StreamBuilder":
        self._schema_row(schema, None, None)
        for r in rows:
            self.rows.append({"_table": schema.table, "_op": "r", "_lsn": None, "_seq": None, "_commit_ts": None,
                              "_schema_id": schema.schema_id, "row": json.dumps(r)})
        return self

    def transaction(self, *changes: tuple[TableSchema, str, dict[str, Any] | None]) -> "StreamBuilder":
        """One transaction of (schema, op, row) changes: op c/u/d/t/B/E (row None for t, B, E)."""
        self.lsn += 100
        ts = datetime.fromtimestamp(self.lsn, tz=timezone.utc)
        seq = 0
        for schema, op, row in changes:
            if (schema.table, schema.schema_id) not in self.announced:
                self._schema_row(schema, self.lsn, seq)
                seq += 1
            self.rows.append({"_table": schema.table, "_op": op, "_lsn": self.lsn, "_seq": seq, "_commit_ts": ts,
                              "_schema_id": schema.schema_id, "row": None if row is None else json.dumps(row)})
            seq += 1
        return self

    def marker(self, schema: TableSchema, op: str) -> "StreamBuilder":
        """A re-snapshot marker (B or E) as the source writes it: no LSN, row null."""
        self._schema_row(schema, None, None)
        self.rows.append({"_table": schema.table, "_op": op, "_lsn": None, "_seq": None, "_commit_ts": None,
                          "_schema_id": schema.schema_id, "row": None})
        return self

    def batch(self) -> pa.Table:
        out = pa.Table.from_pylist(self.rows, schema=ARROW)
        self.rows = []
        self.announced = set()
        return out
