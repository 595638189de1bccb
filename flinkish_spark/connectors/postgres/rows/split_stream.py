""":func:`.decode.split_tables` of a task's rows, decoded batch by batch as they arrive where it can.

What it guarantees: :meth:`IncrementalSplit.result` is ``split_tables`` of the task's rows -- the same tables, schemas
and typed rows (its chunks may differ). Why: a sink's task receives its rows as a stream of batches while the
source's side of the task is still reading; decoding each batch's JSON when it comes overlaps that work with the
read, where decoding after the last batch adds it to the task's time. The common case of a one-table mirror (one
table, one schema, rows in stream order) is decoded that way; anything else -- a second table or schema in the
task, rows out of order -- stops the early decode at that batch and the task's rows are split at the end as before
(what was decoded early is then wasted: at most the batches before the first that did not fit, and nothing for a
task of many tables, whose first batch already holds several).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.rows.decode import ROW_META, UNCHANGED, TableRows, _unchanged, decode_rows, split_tables
from flinkish_spark.connectors.postgres.rows.schema import TableSchema


class IncrementalSplit:
    """Feed it the task's batches in order (:meth:`add`), then take :meth:`result`."""

    def __init__(self) -> None:
        self.fits = True
        self.schema: TableSchema | None = None
        self.pieces: list[pa.Table] = []
        self.changes_seen = False  # a row with an LSN came: rows without one (a snapshot's) may not follow
        self.last: tuple[int, int] | None = None  # (lsn, seq) of the last change row

    def add(self, batch: pa.RecordBatch) -> None:
        if not self.fits or not batch.num_rows:
            return
        try:
            piece = self._decode(batch)
        except _Unfit:
            self.fits, self.pieces = False, []
            return
        if piece is not None:
            self.pieces.append(piece)

    def result(self, stream: pa.Table) -> dict[str, TableRows]:
        """``split_tables(stream)``, where ``stream`` holds the batches given to :meth:`add`, in order."""
        if not self.fits or self.schema is None or not self.pieces:
            return split_tables(stream)
        return {self.schema.table: TableRows(self.schema.table, (self.schema,), pa.concat_tables(self.pieces))}

    def _decode(self, batch: pa.RecordBatch) -> pa.Table | None:
        ops = batch.column("_op")
        is_schema = pc.equal(ops, "s")
        if pc.any(is_schema).as_py():
            for text in pc.filter(batch.column("row"), is_schema).to_pylist():
                schema = TableSchema.from_json(text)
                if self.schema is None:
                    self.schema = schema
                elif schema.schema_id != self.schema.schema_id:
                    raise _Unfit  # a second table or schema: split_tables orders and unites them
            data = pa.Table.from_batches([batch]).filter(pc.invert(is_schema))
        else:
            data = pa.Table.from_batches([batch])
        if not data.num_rows:
            return None
        current = self.schema
        if current is None:
            raise _Unfit  # rows before their 's' row: not in stream order
        sids = pc.unique(data.column("_schema_id")).to_pylist()
        tables = pc.unique(data.column("_table")).to_pylist()
        if sids != [current.schema_id] or tables != [current.table]:
            raise _Unfit
        self._check_order(data)
        decoded = decode_rows(data.column("row"), current)
        cols = list(decoded.columns) + [data.column(m) for m in ROW_META if m != UNCHANGED] + [_unchanged(data.column("row"))]
        return pa.Table.from_arrays(cols, names=decoded.column_names + list(ROW_META))

    def _check_order(self, data: pa.Table) -> None:
        """The rows are in split_tables' order after those before: rows without an LSN first, then by (LSN, seq)."""
        lsn = data.column("_lsn")
        nulls = pc.is_null(lsn).to_numpy(zero_copy_only=False)
        if nulls.any():
            if self.changes_seen or not nulls[:int(nulls.sum())].all():
                raise _Unfit
            if nulls.all():
                return
        if pc.any(pc.is_null(data.column("_seq").slice(int(nulls.sum())))).as_py():
            raise _Unfit
        l = lsn.slice(int(nulls.sum())).to_numpy().astype(np.int64)
        q = data.column("_seq").slice(int(nulls.sum())).to_numpy().astype(np.int64)
        if self.last is not None:
            l, q = np.concatenate([[self.last[0]], l]), np.concatenate([[self.last[1]], q])
        dl = np.diff(l)
        if (dl < 0).any() or ((dl == 0) & (np.diff(q) < 0)).any():
            raise _Unfit
        self.changes_seen, self.last = True, (int(l[-1]), int(q[-1]))


class _Unfit(Exception):
    pass
