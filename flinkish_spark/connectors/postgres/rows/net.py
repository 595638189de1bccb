"""What one epoch does to a keyed target, per table: the last row of each key, split into upserts and deletes.

A keyed sink (upsert + delete by primary key) that applies an epoch's rows one by one in
stream order ends with the same table as one that applies, after an optional truncate, the
*last* row of each key: an upsert for ``r``/``c``/``u``, a delete for ``d``. :func:`net_changes`
computes that set with pyarrow (no Python per row). A truncate (``t``) in the epoch discards
everything before the last one and says so (``truncate``: empty the target first).
Re-snapshot markers (``B``/``E``) are reported, not applied: at an ``E`` the sink deletes the
keys no ``r`` row since the ``B`` carried (see :mod:`flinkish_spark.connectors.postgres.rows`).
An upsert whose row lists columns as unchanged (``_unchanged``: a TOASTed value an update did not
carry) is null there: these helpers do not fill it (the routing sinks do, from the key's earlier
row or the target's stored value).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.rows.decode import ROW_META, TableRows

_META = ROW_META


@dataclass(frozen=True)
class NetChanges:
    table: str
    key: tuple[str, ...]
    truncate: bool  # empty the target before applying upserts and deletes
    upserts: pa.Table  # the last full row of each key whose last change is r, c or u (table columns only)
    deletes: pa.Table  # the key columns of each key whose last change is d
    resnapshot_begin: bool  # the epoch holds a B row (a re-snapshot after a lost slot starts)
    resnapshot_end: bool  # ... an E row (it ends: delete the keys it did not deliver since B)


def net_changes(rows: TableRows) -> NetChanges:
    """The net effect of one table's rows of an epoch on a target keyed by the table's primary key."""
    key = rows.schema.key
    if not key:
        raise ValueError(f"{rows.table} has no primary key in its newest schema: its rows cannot be applied by key")
    table = rows.rows
    ops = table.column("_op")
    markers = set(pc.unique(pc.filter(ops, pc.is_in(ops, pa.array(["B", "E"])))).to_pylist())
    truncates = pc.indices_nonzero(pc.equal(ops, "t"))
    truncate = len(truncates) > 0
    if truncate:
        table = table.slice(truncates[-1].as_py() + 1)  # what came before the last truncate is gone anyway
    table = table.filter(pc.is_in(table.column("_op"), pa.array(["r", "c", "u", "d"])))
    columns = [n for n in table.column_names if n not in _META]
    if table.num_rows:
        indexed = table.append_column("__pos", pa.array(range(table.num_rows), pa.int64()))
        positions = indexed.group_by(list(key), use_threads=False).aggregate([("__pos", "max")]).column("__pos_max")
        table = table.take(pc.take(positions, pc.sort_indices(positions)))  # each key's last row, in stream order
    is_delete = pc.equal(table.column("_op"), "d")
    return NetChanges(
        rows.table, key, truncate,
        upserts=table.filter(pc.invert(is_delete)).select(columns),
        deletes=table.filter(is_delete).select(list(key)),
        resnapshot_begin="B" in markers, resnapshot_end="E" in markers,
    )
