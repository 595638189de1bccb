"""Snapshot chunks: ranges of the split column of about ``splitSize`` rows, planned once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from flinkish_spark.connectors.postgres.source.tables import TableInfo, quote_ident


@dataclass(frozen=True)
class Chunk:
    lo: str | None  # inclusive, as text; None = from the start
    hi: str | None  # exclusive, as text; None = to the end (and the NULLs of a nullable split column)

    def to_payload(self) -> str:
        return json.dumps({"lo": self.lo, "hi": self.hi})

    @classmethod
    def from_payload(cls, payload: str | None) -> "Chunk":
        d = json.loads(payload or "{}")
        return cls(d.get("lo"), d.get("hi"))


def chunk_boundaries(conn: Any, info: TableInfo, split_size: int) -> list[Chunk]:
    """Ranges of the split column holding about ``split_size`` rows each (equal values stay together).

    A dense integer key (as many rows as values between its minimum and maximum, by the
    planner's row estimate) is split arithmetically: two index look-ups. Any other column is
    walked through its index, one ``OFFSET split_size LIMIT 1`` step per chunk (a single pass
    over the index in all, several times cheaper than numbering every row).
    """
    bounds = _dense_integer_bounds(conn, info, split_size)
    if bounds is None:
        bounds = _walked_bounds(conn, info, split_size)
    edges: list[str | None] = [None, *bounds, None]
    return [Chunk(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _dense_integer_bounds(conn: Any, info: TableInfo, split_size: int) -> list[str] | None:
    if info.column(info.split_column).pg_type not in ("int2", "int4", "int8"):
        return None
    col = quote_ident(info.split_column)
    lo, hi, estimate = conn.execute(
        f"SELECT min({col}), max({col}), (SELECT reltuples FROM pg_class WHERE oid = %s::regclass) FROM {info.qualified}",
        (info.qualified,),
    ).fetchone()
    if lo is None or estimate is None or estimate <= 0:
        return None  # empty, or never analysed: walk
    span = int(hi) - int(lo) + 1
    if span > 1.1 * float(estimate):
        return None  # gaps (or a stale estimate): walk, so that chunks stay about split_size rows
    return [str(v) for v in range(int(lo) + split_size, int(hi) + 1, split_size)]


def _walked_bounds(conn: Any, info: TableInfo, split_size: int) -> list[str]:
    col, cast = quote_ident(info.split_column), _cast_type(info, info.split_column)
    bounds: list[str] = []
    # The output is aliased: named like the column, ORDER BY would sort the text, not the values.
    while True:
        if not bounds:
            row = conn.execute(
                f"SELECT {col}::text AS b FROM {info.qualified} WHERE {col} IS NOT NULL ORDER BY {col} OFFSET %s LIMIT 1",
                (split_size,),
            ).fetchone()
        else:
            row = conn.execute(
                f"SELECT {col}::text AS b FROM {info.qualified} WHERE {col} >= %s::{cast} ORDER BY {col} OFFSET %s LIMIT 1",
                (bounds[-1], split_size),
            ).fetchone()
            if row is not None and row[0] == bounds[-1]:
                # More than split_size rows share this value: they stay in one chunk.
                row = conn.execute(
                    f"SELECT min({col})::text FROM {info.qualified} WHERE {col} > %s::{cast}", (bounds[-1],)
                ).fetchone()
                row = None if row is None or row[0] is None else row
        if row is None:
            return bounds
        bounds.append(row[0])


def _cast_type(info: TableInfo, column: str) -> str:
    return info.column(column).pg_type
