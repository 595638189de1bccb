"""A widening during a table's snapshot, as the multi-table stream delivers it: the rows every routing
sink's test drives through its prepare and commit (Delta, Iceberg, PostgreSQL).

The table ``public.w`` (``id int`` key, ``n numeric(12,2)``) is widened to ``(id bigint, n
numeric(14,2))`` after the slot exists. Chunks and changes are read side by side, so a chunk read
after the ``ALTER`` carries the wide schema while the change stream still delivers changes from
before it, announced with the narrow one -- in a later epoch, or in the same epoch in another task
(either task first). Then the changes reach the ``ALTER`` (wide), and at last the source really
narrows ``n`` back to ``(12,2)``: a change the sink must refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

TABLE = "public.w"
NARROW = table_schema(TABLE, [("id", "int"), ("n", "numeric(12,2)")], ("id",))
WIDE = table_schema(TABLE, [("id", "bigint"), ("n", "numeric(14,2)")], ("id",))
#: ``n`` narrowed again by the source (the key stays bigint).
NARROWED = table_schema(TABLE, [("id", "bigint"), ("n", "numeric(12,2)")], ("id",))
#: How the chunk after the ALTER and the older change arrive.
LAYOUTS = ("later epochs", "one epoch, chunk task first", "one epoch, change task first")


@dataclass(frozen=True)
class Widening:
    epochs: tuple[tuple[pa.Table, ...], ...]  # each epoch's tasks' rows
    rows: tuple[dict[str, Any], ...]  # the table afterwards, by id
    narrowing: pa.Table  # one task's rows, after the epochs: the source narrowed n


def widening_during_the_snapshot(layout: str, existing: bool) -> Widening:
    """``existing``: a chunk read before the ALTER created the target (else the chunk after it does)."""
    s = StreamBuilder()
    epochs: list[tuple[pa.Table, ...]] = []
    if existing:
        epochs.append((s.snapshot(NARROW, [{"id": 1, "n": "1.00"}]).batch(),))
    chunk = s.snapshot(WIDE, ([] if existing else [{"id": 1, "n": "1.00"}]) + [{"id": 2, "n": "123456789012.34"}]).batch()
    older = s.transaction((NARROW, "u", {"id": 1, "n": "1.50"}), (NARROW, "c", {"id": 3, "n": "3.00"})).batch()
    if layout == "later epochs":
        epochs += [(chunk,), (older,)]
    elif layout == "one epoch, chunk task first":
        epochs.append((chunk, older))
    elif layout == "one epoch, change task first":
        epochs.append((older, chunk))
    else:
        raise ValueError(layout)
    epochs.append((s.transaction((WIDE, "u", {"id": 1, "n": "2.50"}), (WIDE, "c", {"id": 2**40, "n": "999999999999.99"})).batch(),))
    rows = ({"id": 1, "n": Decimal("2.50")}, {"id": 2, "n": Decimal("123456789012.34")}, {"id": 3, "n": Decimal("3.00")},
            {"id": 2**40, "n": Decimal("999999999999.99")})
    return Widening(tuple(epochs), rows, s.transaction((NARROWED, "u", {"id": 3, "n": "4.00"})).batch())
