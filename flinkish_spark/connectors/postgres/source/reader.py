"""The ``flinkish.postgres`` reader (executors): a chunk through ADBC in Arrow, a WAL range from the slot."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.connectors.postgres.connection import adbc_connect, connect
from flinkish_spark.connectors.postgres.pgoutput import Change, Relation, Truncate, decode_changes, format_lsn
from flinkish_spark.connectors.postgres.source.catalog import generated_columns, psycopg_query
from flinkish_spark.connectors.postgres.source.changes import peek, text_converter
from flinkish_spark.connectors.postgres.source.host import PostgresSourceHost
from flinkish_spark.connectors.postgres.source.signature import fixed_schema_error
from flinkish_spark.connectors.postgres.rows import RESNAPSHOT_BEGIN, RESNAPSHOT_END
from flinkish_spark.connectors.postgres.source.snapshot import Chunk, _cast_type
from flinkish_spark.connectors.cdc.splits import split_generation
from flinkish_spark.connectors.postgres.source.tables import METADATA_COLUMNS, quote_ident
from flinkish_spark.errors import PostgresSourceError
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split

BATCH_ROWS = 65_536


class PostgresReader(SplitReader):
    def __init__(self, source: PostgresSourceHost, schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.source = source
        self.info = source.table_info()
        self.target = to_arrow_schema(schema, timezone="UTC")

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        if start >= end:
            return
        if split.split_id.startswith("snapshot-"):
            chunk = Chunk.from_payload(split.payload)
            # A re-snapshot after a lost slot is bracketed by markers (see RESNAPSHOT_BEGIN): the
            # first chunk (no lower bound) opens it, the last (no upper bound) closes it. Chunks are
            # planned in order, so the two land in its first and last epoch.
            resnapshot = split_generation(split.split_id) > 0
            if resnapshot and chunk.lo is None:
                yield self._marker(RESNAPSHOT_BEGIN)
            yield from self._read_chunk(chunk)
            if resnapshot and chunk.hi is None:
                yield self._marker(RESNAPSHOT_END)
        else:
            yield from self._read_changes(start, end)

    def _chunk_query(self, chunk: Chunk) -> str:
        """The chunk's SELECT, its bounds as literals.

        Literals, not parameters: ADBC streams a query without parameters through binary
        ``COPY (query) TO STDOUT`` batch by batch, but runs a query with parameters as a
        prepared statement whose whole result it buffers before the first batch -- the
        chunk's every row in memory, and Spark waiting idle until the last one arrived.
        The bounds are the server's own text output of the split column (psycopg quotes them).
        """
        from psycopg import sql

        info = self.info
        cols = ", ".join(
            f"{quote_ident(c.name)}::text AS {quote_ident(c.name)}" if c.as_text else quote_ident(c.name)
            for c in info.columns
        )
        k, cast = quote_ident(info.split_column), _cast_type(info, info.split_column)
        where = []
        if chunk.lo is not None:
            where.append(f"{k} >= {sql.Literal(chunk.lo).as_string().strip()}::{cast}")
        if chunk.hi is not None:
            where.append(f"{k} < {sql.Literal(chunk.hi).as_string().strip()}::{cast}")
        cond = " AND ".join(where) if where else "TRUE"
        if chunk.hi is None:
            cond = f"({cond}) OR {k} IS NULL"
        return f"SELECT {cols} FROM {info.qualified} WHERE {cond}"

    def _read_chunk(self, chunk: Chunk) -> Iterator[pa.RecordBatch]:
        src = self.source
        try:
            yield from self._chunk_batches(self._chunk_query(chunk))
        except Exception as e:
            if isinstance(e, PostgresSourceError):
                raise
            raise PostgresSourceError(f"{src.component}: reading {self.info.display} failed: {src.conn_info.mask(str(e))}") from None

    def _chunk_batches(self, query: str) -> Iterator[pa.RecordBatch]:
        src = self.source
        conn = adbc_connect(src.conn_info)
        try:
            cur = conn.cursor()
            try:
                cur.execute(query)
                for batch in cur.fetch_record_batch():
                    if batch.num_rows:
                        yield self._with_metadata(batch, "r")
            finally:
                cur.close()
        finally:
            conn.close()

    def _marker(self, op: str) -> pa.RecordBatch:
        """A row with ``_op`` = ``op`` and every other column null."""
        return pa.RecordBatch.from_arrays(
            [pa.array([op], f.type) if f.name == "_op" else pa.nulls(1, f.type) for f in self.target], schema=self.target)

    def _with_metadata(self, batch: pa.RecordBatch, op: str) -> pa.RecordBatch:
        n = batch.num_rows
        arrays = list(batch.columns) + [
            pa.repeat(pa.scalar(op), n), pa.nulls(n, pa.int64()), pa.nulls(n, pa.timestamp("us", tz="UTC")),
        ]
        return pa.RecordBatch.from_arrays(arrays, names=list(batch.schema.names) + list(METADATA_COLUMNS))

    def _check_columns(self, rel: Relation) -> None:
        """The columns of a Relation message must be the stream's (a column added, dropped or renamed since the
        start would be lost or null): otherwise the same error as the enumerator's catalog check."""
        src, info = self.source, self.info
        names = [c.name for c in rel.columns]
        if names == [c.name for c in info.columns]:
            return
        with connect(src.conn_info, autocommit=True) as conn:  # a publication may send generated columns (PG 18)
            skip = generated_columns(psycopg_query(conn), [rel.relid]).get(rel.relid, frozenset())
        now = [n for n in names if n not in skip]
        if now != [c.name for c in info.columns]:
            before = [c.name for c in info.columns]
            why = f"its columns are now {', '.join(now)} (were {', '.join(before)})"
            raise fixed_schema_error(src.component, info.display, why, src.slot_name)

    def _read_changes(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        src, info = self.source, self.info
        from flinkish_spark.connectors.postgres.source.dialect import PostgresDialect  # it imports the readers

        if not PostgresDialect(src).readable(start, end):  # a lost slot's replayed range under onSlotLost=resnapshot
            return
        converters = {c.name: text_converter(c) for c in info.columns}
        rows: list[tuple[str, Change]] = []

        def flush() -> pa.RecordBatch:
            fields = {f.name: f for f in self.target}
            arrays = []
            for c in info.columns:
                conv = converters[c.name]
                values = [None if (v := ch.values.get(c.name)) is None else conv(v) for _, ch in rows]  # type: ignore[arg-type]
                arrays.append(pa.array(values, fields[c.name].type))
            arrays.append(pa.array([op for op, _ in rows], pa.string()))
            arrays.append(pa.array([ch.commit_lsn for _, ch in rows], pa.int64()))
            arrays.append(pa.array([ch.commit_ts_us for _, ch in rows], pa.timestamp("us", tz="UTC")))
            return pa.RecordBatch.from_arrays(arrays, names=[c.name for c in info.columns] + list(METADATA_COLUMNS))

        with connect(src.conn_info, autocommit=True) as conn:
            messages = peek(conn, src.slot_name, src.publication, end, None)
        checked: Relation | None = None
        for change in decode_changes(messages, start, end):
            if isinstance(change, Truncate):
                if len(change.tables) == len(change.relids) and (info.schema, info.name) not in change.tables:
                    continue  # another table of a publication the user gave
                raise PostgresSourceError(
                    f"{src.component}: {info.display} was truncated (in the WAL range {format_lsn(start)}..{format_lsn(end)}); "
                    "a TRUNCATE cannot be expressed as row changes. Restart with a new snapshot (a new uid, or drop "
                    f"the slot {src.slot_name!r} and set onSlotLost=resnapshot)"
                )
            rel = change.relation
            if (rel.namespace, rel.name) != (info.schema, info.name):
                continue
            if rel is not checked:
                self._check_columns(rel)
                checked = rel
            for name, value in change.values.items():
                if value is not None and not isinstance(value, str):
                    raise PostgresSourceError(
                        f"{src.component}: an update of {info.display} at LSN {format_lsn(change.commit_lsn)} left the "
                        f"TOASTed value of column {name!r} unchanged, and the server did not send it; the change "
                        f"cannot be a full row. Run ALTER TABLE {info.display} REPLICA IDENTITY FULL (the server then sends "
                        "the old row, which holds the value) and start over with a new snapshot, since this change is already "
                        f"in the WAL without it: SELECT pg_drop_replication_slot('{src.slot_name}') and restart with "
                        "onSlotLost=resnapshot, or use a new uid"
                    )
            if change.op == "d" and info.key:
                # With the default replica identity only the key is sent; the rest is null.
                change = Change("d", rel, {k: change.values.get(k) for k in info.key}, change.commit_lsn,
                                change.commit_ts_us, change.seq)
            rows.append((change.op, change))
            if len(rows) >= BATCH_ROWS:
                yield flush()
                rows = []
        if rows:
            yield flush()
