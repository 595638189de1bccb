"""A routing sink task's packed stream rows (:mod:`flinkish_spark.connectors.postgres.rows.packed`) as its tables.

What it guarantees: :meth:`PackedDecode.result` has the form of :meth:`.task_decode.TaskDecode.result` and, for the
same changes, the same content: per source table the schemas its rows used (oldest first), its rows typed in the
newest schema's columns and types (columns only older schemas had kept, null in newer rows) in stream order
(snapshot rows first, then by ``_lsn``, ``_seq``), its figures and the older schemas its changes announced. A ``p``
pack is typed already (by the same decoder the JSON shape's sink uses) and its IPC stream is read as it is; a ``w``
pack (pgoutput messages) or a ``j`` pack (JSON texts), the source's ``decodeIn=sink``, is typed here as it arrives
by the source's own decoders (:func:`..postgres.rows.packed.pack_rows`) -- the same rows either way.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.figures import Figures
from flinkish_spark.connectors.postgres.rows import TableRows, TableSchema
from flinkish_spark.connectors.postgres.rows.decode import ROW_META, _in_order, _versions, conformed, union_fields
from flinkish_spark.connectors.postgres.rows.packed import PACKED_COLUMNS, pack_rows, read_pack


class PackedDecode:
    """Feed it the task's packed batches in order (:meth:`add`), then take :meth:`result`."""

    def __init__(self) -> None:
        self.schemas: dict[str, TableSchema] = {}
        self.order: dict[str, list[tuple[tuple[int, int, int], str]]] = {}  # table -> (position, schema id) of 's' rows
        self.by_change: set[str] = set()  # schemas an 's' row of the change stream announced
        #: table -> (schema id, its rows typed, or a j/w pack's op and bytes whose 's' row had not come yet)
        self.pieces: dict[str, list[tuple[str, pa.Table | tuple[str, pa.Buffer]]]] = {}
        self.figures: dict[str, Figures] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        blobs = batch.column("batch")
        meta = batch.select([n for n in PACKED_COLUMNS if n != "batch"]).to_pylist()
        for i, r in enumerate(meta):
            name, sid, lsn = r["_table"], r["_schema_id"], r["_lsn"]
            if r["_op"] == "s":
                schema = TableSchema.from_json(blobs[i].as_buffer().to_pybytes().decode())
                self.schemas[schema.schema_id] = schema
                self.order.setdefault(name, []).append(((0, 0, 0) if lsn is None else (1, int(lsn), int(r["_seq"] or 0)),
                                                        schema.schema_id))
                if lsn is not None:
                    self.by_change.add(schema.schema_id)
                continue
            rows: pa.Table | tuple[str, pa.Buffer]
            if r["_op"] in ("j", "w"):  # typed here (the source's decodeIn=sink), as it arrives
                known = self.schemas.get(sid)
                # Its 's' row comes before it (the source writes it first, a shuffle keeps a map output's order);
                # if not, the pack waits for result(), which raises if the task never got it.
                rows = (r["_op"], blobs[i].as_buffer()) if known is None else pack_rows(r["_op"], known, blobs[i].as_buffer())
            else:
                rows = read_pack(blobs[i].as_buffer())
            self.pieces.setdefault(name, []).append((sid, rows))
            count, changes = int(r["_count"] or 0), int(r["_changes"] or 0)
            if lsn is None:
                f = Figures(snapshot_rows=count)
            else:
                ts = r["_commit_ts"]
                f = Figures(changes=count, truncates=changes - count,
                            commit_us=-1 if ts is None else _micros(pa.scalar(ts, pa.timestamp("us", tz="UTC"))))
            self.figures[name] = self.figures.get(name, Figures()).plus(f)

    def result(self) -> dict[str, tuple[TableRows, pa.Table, Figures, tuple[str, ...]]]:
        out = {}
        for name in sorted(set(self.pieces) | set(self.order)):
            versions = _versions(self.order.get(name, []))
            missing = {sid for sid, _ in self.pieces.get(name, [])} - set(versions)
            if missing:
                raise ValueError(f"rows of {name} name schemas {sorted(missing)} without an 's' row in the same task")
            schemas = [self.schemas[v] for v in versions]
            pieces = [p if isinstance(p, pa.Table) else pack_rows(p[0], self.schemas[sid], p[1])
                      for sid, p in self.pieces.get(name, [])]
            rows = TableRows(name, tuple(schemas), _joined(schemas, pieces))
            earlier = tuple(s.to_json() for s in schemas[:-1] if s.schema_id in self.by_change)
            out[name] = (rows, rows.rows, self.figures.get(name, Figures()), earlier)
        return out


def _micros(ts: pa.Scalar) -> int:
    return int(ts.cast(pa.int64()).as_py())


def _joined(schemas: list[TableSchema], pieces: list[pa.Table]) -> pa.Table:
    """The pieces in the union of the schemas' columns (newest first, in the newest types), in stream order."""
    fields = union_fields(schemas)
    if not pieces:
        return pa.schema(fields + [pa.field("_op", pa.string()), pa.field("_lsn", pa.int64()),
                                   pa.field("_seq", pa.int32()), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
                                   pa.field("_unchanged", pa.list_(pa.string()))]).empty_table()
    out = []
    for p in pieces:
        cols = conformed(p, fields) + [p.column(m) for m in ROW_META]
        out.append(pa.Table.from_arrays(cols, names=[f.name for f in fields] + list(ROW_META)))
    rows = out[0] if len(out) == 1 else pa.concat_tables(out)
    order = pc.sort_indices(pa.table({"s": pc.is_null(rows.column("_lsn")), "l": rows.column("_lsn"),
                                      "q": rows.column("_seq")}),
                            sort_keys=[("s", "descending"), ("l", "ascending"), ("q", "ascending")])
    return rows if _in_order(order) else rows.take(order)
