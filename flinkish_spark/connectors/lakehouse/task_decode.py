"""A routing sink task's stream rows decoded as they arrive, in bounded memory: the task's tables, typed.

What it guarantees: :meth:`TaskDecode.result` holds, per source table, the same schemas and typed rows (in stream
order) as :func:`~flinkish_spark.connectors.postgres.rows.split_tables` of all the task's rows at once, and the
same figures; the JSON texts of the rows are never all held -- a batch's texts are dropped once typed.

Two ways, both decoding while the source's side of the task still reads (the decode overlaps the input):

* a one-table, one-schema task in stream order (a one-table mirror, a big transaction of one table) is typed a
  batch at a time by :class:`~flinkish_spark.connectors.postgres.rows.split_stream.IncrementalSplit`;
* anything else -- from the first batch that does not fit that case on -- is typed ``group_rows`` rows at a time,
  each group with every ``s`` row seen before it (a partition carries a schema's ``s`` row once, before the rows
  that name it); what the first way typed before is kept as the first group. A table's groups are joined at the
  end in the newest group's columns and types.

Why: a task of one transaction of millions of rows held all its JSON texts until its last batch came
(docs/postgres-source.md, "Big transactions"), and decoding only after the last batch added the decode to the
task's time (docs/benchmarks.md).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.figures import Figures, figures_by_table
from flinkish_spark.connectors.postgres.rows import TableRows, split_tables
from flinkish_spark.connectors.postgres.rows.decode import _in_order
from flinkish_spark.connectors.postgres.rows.split_stream import IncrementalSplit


class TaskDecode:
    """Feed it the task's batches in order (:meth:`add`), then take :meth:`result`."""

    def __init__(self, group_rows: int) -> None:
        self.group_rows = group_rows
        self.split: IncrementalSplit | None = IncrementalSplit()  # None once a batch did not fit it
        self.schema_rows: list[pa.Table] = []  # the 's' rows so far, carried into each group
        self.by_change: set[str] = set()  # schemas an 's' row of the change stream announced
        self.figures: dict[str, Figures] = {}
        self.typed: dict[str, list[TableRows]] = {}
        self.group: list[pa.Table] = []
        self.size = 0
        self.fresh = False  # 's' rows came since the last group was decoded (a schema change without rows after it)

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        stream = pa.Table.from_batches([batch])
        for name, f in figures_by_table(stream).items():
            self.figures[name] = self.figures.get(name, Figures()).plus(f)
        ops = stream.column("_op")
        announced = stream.filter(pc.equal(ops, "s"))
        data = stream.filter(pc.not_equal(ops, "s")) if announced.num_rows else stream
        if self.split is not None:
            before = self.split.pieces
            self.split.add(batch)
            if self.split.fits:
                self._announce(announced)
                return
            # Not one table in stream order: what it typed so far is the first group, this batch starts the next.
            if before and self.split.schema is not None:
                schema = self.split.schema
                self.typed.setdefault(schema.table, []).append(TableRows(schema.table, (schema,), pa.concat_tables(before)))
            self.split = None
        self._announce(announced)
        if data.num_rows:
            self.group.append(data)
            self.size += data.num_rows
        if self.size >= self.group_rows:
            self._decode()

    def _announce(self, announced: pa.Table) -> None:
        if announced.num_rows:
            self.schema_rows.append(announced)
            self.fresh = True
            self.by_change.update(announced.filter(pc.is_valid(announced.column("_lsn"))).column("_schema_id").to_pylist())

    def _decode(self) -> None:
        data = pa.concat_tables(self.group) if self.group else None
        self.group, self.size, self.fresh = [], 0, False
        with_schemas = pa.concat_tables([*self.schema_rows, *([data] if data is not None else [])])
        for name, rows in split_tables(with_schemas).items():
            self.typed.setdefault(name, []).append(rows)

    def result(self) -> dict[str, tuple[TableRows, pa.Table, Figures, tuple[str, ...]]]:
        """Per table: its rows of the last group (whose schemas are all the task's), its rows joined, its figures
        and the schemas an ``s`` row of the change stream announced before its newest (what the commit's
        evolution must see of a schema change within the task)."""
        if self.split is not None and self.split.pieces and self.split.schema is not None:
            schema = self.split.schema
            self.typed = {schema.table: [TableRows(schema.table, (schema,), pa.concat_tables(self.split.pieces))]}
        elif self.group or self.fresh:
            self._decode()  # the last group, or 's' rows after it (a task of 's' rows only)
        out = {}
        for name, parts in sorted(self.typed.items()):
            last = parts[-1]
            earlier = tuple(s.to_json() for s in last.schemas[:-1] if s.schema_id in self.by_change)
            out[name] = (last, joined(parts), self.figures.get(name, Figures()), earlier)
        return out


def joined(parts: list[TableRows]) -> pa.Table:
    """One table's typed groups as one table in the newest group's columns and types (the last group has seen every
    schema of the task). A group decoded before a schema change of the task has the columns of the schemas it saw:
    brought to the newest the way :func:`~flinkish_spark.connectors.postgres.rows.split_tables` brings an older row,
    a column the newer schemas lack kept (null in newer rows), a missing one null, the type cast."""
    newest = parts[-1].rows.schema
    out = []
    for p in parts:
        rows = p.rows
        if not rows.schema.equals(newest):
            rows = pa.Table.from_arrays(
                [(rows.column(f.name) if rows.column(f.name).type == f.type else rows.column(f.name).cast(f.type))
                 if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type) for f in newest],
                schema=newest)
        out.append(rows)
    if len(out) == 1:
        return out[0]
    rows = pa.concat_tables(out)
    # Each group is in stream order (snapshot rows first, then by _lsn, _seq); a task holding snapshot rows after
    # changes (a chunk and a WAL range in one task) is put in that order across its groups too.
    order = pc.sort_indices(pa.table({"s": pc.is_null(rows.column("_lsn")), "l": rows.column("_lsn"),
                                      "q": rows.column("_seq")}),
                            sort_keys=[("s", "descending"), ("l", "ascending"), ("q", "ascending")])
    return rows if _in_order(order) else rows.take(order)
