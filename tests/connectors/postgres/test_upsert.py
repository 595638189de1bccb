"""Staged upsert through the sink API: last value per key within and across epochs, deletes."""

from __future__ import annotations

import psycopg
import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType

from flinkish_spark.connectors.postgres import PostgresSink
from flinkish_spark.sink.protocol import PrepareContext

CDC = StructType([StructField("id", LongType()), StructField("name", StringType()),
                  StructField("_op", StringType()), StructField("_lsn", LongType())])


def batch(rows: list[tuple]) -> pa.RecordBatch:
    ids, names, ops, lsns = zip(*rows)
    return pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                                       "_op": pa.array(ops, pa.string()), "_lsn": pa.array(lsns, pa.int64())})


def apply(sink: PostgresSink, epoch: int, partitions: list[list[tuple]]) -> None:
    prepared = [sink.prepare(iter([batch(rows)]), PrepareContext("cdc", epoch, p, 0)) for p, rows in enumerate(partitions)]
    committables = [c for c in prepared if c is not None]
    assert sink.commit(committables, epoch) == "COMMITTED"
    assert sink.commit(committables, epoch) == "ALREADY_COMMITTED"  # idempotent
    sink.cleanup(epoch, committables)


def table(url: str) -> list[tuple]:
    with psycopg.connect(url) as c:
        return c.execute("SELECT * FROM mirror ORDER BY id").fetchall()


def test_upsert_with_deletes_keeps_the_last_change_per_key(pg_url: str) -> None:
    sink = PostgresSink.create(pg_url, "mirror", uid="cdc", schema=CDC, mode="upsert", key="id", create_table=True,
                               deletes=True)
    assert sink.commit_mode == "staged"
    apply(sink, 0, [[(1, "a", "c", 1), (2, "b", "c", 2), (3, "c", "c", 3)]])
    assert table(pg_url) == [(1, "a"), (2, "b"), (3, "c")]  # _op and _lsn are not written
    apply(sink, 1, [
        [(2, "b1", "u", 4), (2, "b2", "u", 5), (3, None, "d", 6), (4, "d", "c", 7), (4, None, "d", 8)],
        [(1, None, "d", 9), (1, "a2", "c", 10)],  # a later partition: its rows come last
    ])
    assert table(pg_url) == [(1, "a2"), (2, "b2")]
    with psycopg.connect(pg_url) as c:
        assert c.execute(f"SELECT count(*) FROM {sink.plan.staging}").fetchone() == (0,)


def test_upsert_same_key_in_two_partitions_takes_the_later_partition(pg_url: str) -> None:
    schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
    sink = PostgresSink.create(pg_url, "kv", uid="kv", schema=schema, mode="upsert", key="id", create_table=True)

    def rows(*pairs: tuple) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"id": pa.array([p[0] for p in pairs], pa.int64()),
                                           "name": pa.array([p[1] for p in pairs], pa.string())})

    prepared = [sink.prepare(iter([rows((1, "p1"), (2, "x"))]), PrepareContext("kv", 0, 1, 0)),
                sink.prepare(iter([rows((1, "p0a"), (1, "p0b"))]), PrepareContext("kv", 0, 0, 0))]
    assert sink.commit([c for c in prepared if c is not None], 0) == "COMMITTED"
    with psycopg.connect(pg_url) as c:
        assert c.execute("SELECT id, name FROM kv ORDER BY id").fetchall() == [(1, "p1"), (2, "x")]
