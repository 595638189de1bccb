"""PostgreSQL helpers for tests: a counting ``flinkish.postgres`` source and a keyed-apply foreachBatch.

``flinkish.testing.pgcounting`` takes the options of the ``flinkish.postgres`` source plus
``readLog`` (a local directory): each ``read(split, start, end)`` on an executor creates
one file there, so a test can prove which chunks were (not) read again after a restart.

:func:`mirror_batch_function` is the foreachBatch used by the mirror test while the
``flinkish.postgres`` sink is not on this branch: it applies a batch of the source's rows
to a target table by key (``r``/``c``/``u`` upsert, ``d`` delete) in ``_lsn`` order (WAL order within a transaction),
in one transaction that also records the batch id, so a replayed batch changes nothing.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.connectors.postgres.source import PostgresReader, PostgresSourceDataSource
from flinkish_spark.options import Options
from flinkish_spark.source.split import Split


class CountingPostgresReader(PostgresReader):
    def __init__(self, source: "CountingPostgresSource", schema: StructType) -> None:
        super().__init__(source, schema)
        self.log_dir = source.read_log

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        os.makedirs(self.log_dir, exist_ok=True)
        open(os.path.join(self.log_dir, f"{split.split_id}@{start}@{end}@{uuid.uuid4().hex[:8]}"), "w").close()
        yield from super().read(split, start, end)


class CountingPostgresSource(PostgresSourceDataSource):
    KIND = "flinkish.testing.pgcounting"
    EXTRA_OPTIONS = PostgresSourceDataSource.EXTRA_OPTIONS + ("readLog",)

    def configure(self, opts: Options) -> None:
        super().configure(opts)
        self.read_log = opts.required("readLog", "a local directory where reads are logged")

    def create_reader(self, schema: StructType) -> CountingPostgresReader:
        return CountingPostgresReader(self, schema)


def pg_read_log(log_dir: str) -> list[tuple[str, int, int]]:
    out = []
    for name in os.listdir(log_dir) if os.path.isdir(log_dir) else []:
        split, start, end, _ = name.split("@")
        out.append((split, int(start), int(end)))
    return sorted(out)


def register_postgres_test_sources(spark: Any) -> None:
    spark.dataSource.register(CountingPostgresSource)


def mirror_batch_function(args: dict[str, Any]) -> Callable[[Any, int], None]:
    """foreachBatch(df, batch_id): apply the rows to ``args['table']`` keyed by ``args['key']``, once per batch id."""
    import psycopg
    from psycopg import sql

    url, table, key = args["url"], args["table"], args["key"]

    def apply(df: Any, batch_id: int) -> None:
        data = df.toArrow()
        with psycopg.connect(url) as conn:  # one transaction per batch
            conn.execute("CREATE TABLE IF NOT EXISTS mirror_batches (batch_id bigint PRIMARY KEY)")
            if conn.execute("SELECT 1 FROM mirror_batches WHERE batch_id = %s", (batch_id,)).fetchone():
                return  # a replay of a batch already applied
            cols = [c for c in data.column_names if not c.startswith("_")]
            rows = data.to_pylist()
            # Stable sort: a change epoch is one partition in WAL order, kept within one _lsn.
            rows.sort(key=lambda r: r["_lsn"] if r["_lsn"] is not None else -1)
            upsert = sql.SQL("INSERT INTO {t} ({c}) VALUES ({v}) ON CONFLICT ({k}) DO UPDATE SET {s}").format(
                t=sql.Identifier(table), c=sql.SQL(", ").join(map(sql.Identifier, cols)),
                v=sql.SQL(", ").join(sql.Placeholder() * len(cols)), k=sql.Identifier(key),
                s=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in cols),
            )
            delete = sql.SQL("DELETE FROM {t} WHERE {k} = %s").format(t=sql.Identifier(table), k=sql.Identifier(key))
            if rows and all(r["_op"] == "r" for r in rows):
                # A snapshot epoch: each key once, so one bulk COPY + INSERT ... ON CONFLICT.
                conn.execute(sql.SQL("CREATE TEMP TABLE mirror_load (LIKE {t}) ON COMMIT DROP").format(t=sql.Identifier(table)))
                with conn.cursor().copy(sql.SQL("COPY mirror_load ({c}) FROM STDIN").format(
                        c=sql.SQL(", ").join(map(sql.Identifier, cols)))) as copy:
                    for r in rows:
                        copy.write_row(tuple(r[c] for c in cols))
                conn.execute(sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM mirror_load ON CONFLICT ({k}) DO UPDATE SET {s}").format(
                    t=sql.Identifier(table), c=sql.SQL(", ").join(map(sql.Identifier, cols)), k=sql.Identifier(key),
                    s=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in cols)))
                rows = []
            with conn.cursor() as cur:
                # Runs of upserts go in one executemany; order across runs is kept.
                run: list[tuple[Any, ...]] = []
                for r in rows:
                    if r["_op"] == "d":
                        if run:
                            cur.executemany(upsert, run)
                            run = []
                        cur.execute(delete, (r[key],))
                    else:
                        run.append(tuple(r[c] for c in cols))
                if run:
                    cur.executemany(upsert, run)
            conn.execute("INSERT INTO mirror_batches VALUES (%s)", (batch_id,))

    return apply


def committed_checkpoint(checkpoint_location: str, meta_root: str, uid: str) -> Any:
    """The source checkpoint of Spark's last committed batch (None before the first commit)."""
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.source.offset import SourceOffset

    commits = os.path.join(checkpoint_location, "commits")
    done = [int(n) for n in os.listdir(commits) if n.isdigit()] if os.path.isdir(commits) else []
    if not done:
        return None
    with open(os.path.join(checkpoint_location, "offsets", str(max(done)))) as f:
        lines = f.read().splitlines()
    for line in lines[2:]:
        off = SourceOffset.from_json(line)
        if off is not None and off.uid == uid:
            if off.ckpt < 0:
                return None
            return SourceCheckpointStore(FileIO.for_url(meta_root), meta_root, uid, kind="").read(off.ckpt)
    return None
