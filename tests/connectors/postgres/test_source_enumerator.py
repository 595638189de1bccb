"""The enumerator and reader of ``flinkish.postgres`` on a real server, without a query.

The slot exists before the chunks are planned; an epoch's WAL range under
``maxRowsPerTrigger`` ends after a whole transaction; reading a range twice (a replay)
gives the same rows, and consecutive ranges neither lose nor repeat a transaction; the slot
moves only when a checkpoint completes.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
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


@pytest.mark.both_postgres
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


def test_chunk_boundaries_cover_every_row_once_in_chunks_of_about_split_size(pg_url) -> None:
    from flinkish_spark.connectors.postgres.source import chunk_boundaries, load_table_info

    def sizes(conn: psycopg.Connection, table: str, column: str | None, split: int) -> list[int]:
        info = load_table_info(conn, table, column, "test")
        counts = []
        for c in chunk_boundaries(conn, info, split):
            col, t = info.split_column, info.column(info.split_column).pg_type
            cond = " AND ".join([f"{col} >= %(lo)s::{t}"] * (c.lo is not None) + [f"{col} < %(hi)s::{t}"] * (c.hi is not None)) or "TRUE"
            cond = f"({cond}) OR {col} IS NULL" if c.hi is None else cond
            counts.append(conn.execute(f"SELECT count(*) FROM {table} WHERE {cond}", {"lo": c.lo, "hi": c.hi}).fetchone()[0])
        return counts

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE dense (id bigint PRIMARY KEY)")
        conn.execute("INSERT INTO dense SELECT g FROM generate_series(1, 1000) g")
        conn.execute("ANALYZE dense")  # a row estimate: split arithmetically
        assert sizes(conn, "dense", None, 300) == [300, 300, 300, 100]
        conn.execute("CREATE TABLE sparse (id int PRIMARY KEY, grp text)")
        conn.execute("INSERT INTO sparse SELECT g * g, CASE WHEN g <= 50 THEN 'a' ELSE 'b' || g / 10 END FROM generate_series(1, 100) g")
        conn.execute("ANALYZE sparse")
        assert sizes(conn, "sparse", None, 30) == [30, 30, 30, 10]  # gaps: walked through the index
        # A non-unique column: equal values stay in one chunk (50 'a' rows, more than a chunk).
        grp = sizes(conn, "sparse", "grp", 20)
        assert sum(grp) == 100 and 50 in grp and all(n <= 30 for n in grp if n != 50)
        conn.execute("CREATE TABLE empty (id int PRIMARY KEY)")
        assert sizes(conn, "empty", None, 10) == [0]


#: A statement on the table while the query runs -> what the error names.
FIXED_SCHEMA_CHANGES = {
    "ALTER TABLE t ADD COLUMN d int NOT NULL DEFAULT 7": "column 'd' was added with a default value",
    "ALTER TABLE t ALTER COLUMN v TYPE bigint USING v * 1000": "rewritten without row changes",
    "ALTER TABLE t RENAME COLUMN w TO w2": "column 'w' was renamed to 'w2'",
    "ALTER TABLE t ADD COLUMN n int": "column.s. 'n' added",
    "ALTER TABLE t DROP COLUMN w": "column.s. 'w' dropped",
}


@pytest.mark.both_postgres
def test_a_table_changed_without_row_changes_stops_the_single_table_source_naming_it_and_the_fix(pg_url, tmp_path: Path) -> None:
    from flinkish_spark.errors import PostgresSourceError

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for n, (statement, what) in enumerate(FIXED_SCHEMA_CHANGES.items()):
            conn.execute("DROP TABLE IF EXISTS t")
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int, w text)")
            conn.execute("INSERT INTO t SELECT g, g, 'w' FROM generate_series(1, 5) g")
            src = PostgresSourceDataSource({"uid": f"fixed{n}", "checkpoint": str(tmp_path / f"meta{n}"), "url": pg_url,
                                            "table": "t"})
            src.setup_source()
            enum = src.create_enumerator()
            chunks = enum.discover(set())
            enum.on_checkpoint_complete(SourceCheckpoint(f"fixed{n}", src.name(), 1, None, 0, "{}", enum.snapshot_state(),
                                                         False, tuple(SplitRecord(s.split_id, 0, 1, 1, True, 1) for s in chunks)))
            (changes,) = enum.discover({s.split_id for s in chunks})
            conn.execute(statement)
            conn.execute("UPDATE t SET id = id WHERE id = 1")
            fix = rf"pg_drop_replication_slot\('flinkish_fixed{n}'\) and restart with onSlotLost=resnapshot"
            with pytest.raises(PostgresSourceError, match=rf"public.t changed while the query runs -- .*{what}.*{fix}"):
                enum.discover({changes.split_id})  # in latestOffset: the epochs before are committed, no new one starts
            if "COLUMN" in statement and "TYPE" not in statement and "DEFAULT" not in statement:
                # The reader sees the Relation message of the change after it, whatever the enumerator saw before.
                reader = src.create_reader(src.table_info().spark_schema())
                end = enum.extent(changes, 0).available
                with pytest.raises(PostgresSourceError, match=rf"public.t changed while the query runs -- its columns are now"):
                    list(reader.read(changes, 0, end))
            conn.execute(f"SELECT pg_drop_replication_slot('flinkish_fixed{n}')")
