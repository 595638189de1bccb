"""Per-column statistics of a written Parquet file, from its footer: what the table logs record.

Both formats keep min/max/null counts per data file (Delta ``add.stats``, Iceberg manifest
bounds); readers skip files with them, and the keyed sinks prune key lookups with them. A
statistic is only given where it is exact: a wrong maximum would make readers skip files
that hold matching rows, a missing one only costs a read.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any


def stat_value(value: Any) -> Any:
    """A min/max statistic as a table log can store it exactly, or None when it is safer to leave it out.

    Timestamps are left out: Delta keeps them in milliseconds, and a truncated maximum
    would make readers skip files that hold matching rows. Long strings too (readers
    compare prefixes), and decimals (their JSON form is a float).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal) or isinstance(value, dt.datetime):
        return None
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return value if len(value) <= 32 else None
    return None


def column_stats(metadata: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """(minValues, maxValues, nullCount) of the top-level columns of a ``pyarrow.parquet.FileMetaData``."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    if metadata is None:
        return mins, maxs, nulls
    schema = metadata.schema
    for j in range(metadata.num_columns):
        column = schema.column(j)
        if "." in column.path:
            continue  # nested fields: no statistics
        name = column.path
        lo: Any = None
        hi: Any = None
        null_count = 0
        exact = True
        for i in range(metadata.num_row_groups):
            st = metadata.row_group(i).column(j).statistics
            if st is None or not st.has_null_count:
                exact = False
                break
            null_count += st.null_count
            if st.has_min_max:
                a, b = stat_value(st.min), stat_value(st.max)
                if a is None or b is None:
                    exact = False
                    continue
                lo = a if lo is None or a < lo else lo
                hi = b if hi is None or b > hi else hi
        if not exact and lo is None:
            continue
        nulls[name] = null_count
        if exact and lo is not None:
            mins[name], maxs[name] = lo, hi
    return mins, maxs, nulls
