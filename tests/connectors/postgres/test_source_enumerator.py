"""The enumerator and reader of ``flinkish.postgres`` on a real server, without a query.

The slot exists before the chunks are planned; an epoch's WAL range under
``maxRowsPerTrigger`` ends after a whole transaction; reading a range twice (a replay)
gives the same rows, and consecutive ranges neither lose nor repeat a transaction; the slot
moves only when a checkpoint completes.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource
from flinkish_spark.source.split import Split


def source(url: str, tmp_path: Path, **options: str) -> PostgresSourceDataSource:
    src = PostgresSourceDataSource({"uid": "enum", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "t", **options})
    src.setup_source()
    return src


def confirmed(conn: psycopg.Connection) -> str:
    return conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'flinkish_enum'").fetchone()[0]


def test_ranges_are_whole_transactions_replays_read_the_same_and_the_slot_moves_on_completion(spark, pg_url, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 50) g")
        src = source(pg_url, tmp_path, maxRowsPerTrigger="30", splitSize="20")
        enum = src.create_enumerator()
        chunks = enum.discover(set())
        assert [s.split_id for s in chunks] == ["snapshot-0-00000", "snapshot-0-00001", "snapshot-0-00002"]
        start = confirmed(conn)  # the slot exists once the chunks are planned
        for k in range(5):  # 5 transactions of 10 changes each
            conn.execute(f"UPDATE t SET v = 'u{k}' WHERE id BETWEEN {k * 10 + 1} AND {k * 10 + 10}")
        ckpt = SourceCheckpoint("enum", src.name(), 1, None, 0, "{}", enum.snapshot_state(), False,
                                tuple(SplitRecord(s.split_id, 0, 1, 1, True, 1) for s in chunks))
        enum.on_checkpoint_complete(ckpt)
        (changes,) = enum.discover({s.split_id for s in chunks})
        assert changes.split_id == "changes-0" and enum.no_more_splits()
        assert confirmed(conn) == start  # no change epoch is complete yet

        schema = StructType.fromDDL(src.table_info().spark_ddl())
        reader = src.create_reader(schema)
        e1 = enum.extent(changes, 0).available  # the limit (30 messages) ends after a whole transaction
        first = [b.to_pylist() for b in reader.read(changes, 0, e1)]
        assert first == [b.to_pylist() for b in reader.read(changes, 0, e1)]  # a replay reads the same
        rows1 = [r for b in first for r in b]
        assert 0 < len(rows1) < 50 and len(rows1) % 10 == 0
        e2 = enum.extent(changes, e1).available
        rows2 = [r for b in reader.read(changes, e1, e2) for r in b.to_pylist()]
        assert sorted(r["id"] for r in rows1 + rows2) == sorted(r["id"] for r in rows1 + rows2 if r["_op"] == "u")
        assert not {r["id"] for r in rows1} & {r["id"] for r in rows2}  # no transaction read twice
        assert len(rows1) + len(rows2) == 50  # ... and none lost

        done = SourceCheckpoint("enum", src.name(), 2, 1, 0, "{}", enum.snapshot_state(), True,
                                (SplitRecord("changes-0", 0, e1),))
        enum.on_checkpoint_complete(done)
        from flinkish_spark.connectors.postgres.pgoutput import parse_lsn

        assert parse_lsn(confirmed(conn)) == e1  # advanced to the end of the completed epoch, not beyond
        conn.execute("SELECT pg_drop_replication_slot('flinkish_enum')")
