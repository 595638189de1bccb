"""Scale of the multi-table ``flinkish.postgres`` source (issue 18, point 7): once the snapshot is
done, an epoch's checkpoint does not grow with the number of tables the pattern matched.

Driven through the stream reader Spark calls (``latestOffset`` / ``partitions`` / ``read`` /
``commit``), on the embedded server; sizes and files, never times.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from flinkish_spark.connectors.postgres.rows import stream_schema
from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource


def one_change_epoch(url: str, tmp: Path, schema: str, tables: int) -> tuple[int, int, int]:
    """Mirror ``tables`` tables until the change split runs, then one epoch with one changed row:
    (its checkpoint's bytes, registry files written in it, change rows read)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for i in range(tables):
            conn.execute(f"CREATE TABLE {schema}.t_{i:03d} (id int PRIMARY KEY, v int)")
            conn.execute(f"INSERT INTO {schema}.t_{i:03d} SELECT g, 0 FROM generate_series(1, 3) g")
    src = PostgresSourceDataSource({"uid": schema, "checkpoint": str(tmp / schema), "url": url,
                                    "tables": f"{schema}.*", "retainCheckpoints": "100"})
    reader = src.streamReader(stream_schema())
    store = src.checkpoint_store()
    registry = os.path.join(store.directory, "tables")

    def epoch(start: dict) -> tuple[dict, int]:
        end = reader.latestOffset(start, ReadAllAvailable())
        rows = sum(b.num_rows for p in reader.partitions(start, end) for b in reader.read(p))
        reader.commit(end)
        return end, rows

    start = reader.initialOffset()
    for _ in range(10):  # the snapshot, then the epoch that hands out the change split
        start, _ = epoch(start)
        if any(s.split_id.startswith("changes-") for s in store.latest().splits):  # type: ignore[union-attr]
            break
    start, _ = epoch(start)  # the snapshot's end is recorded (the registry's last change)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.t_001 SET v = 1 WHERE id = 2")
    before, registry_before = store.ids()[-1], set(os.listdir(registry))
    start, rows = epoch(start)
    reader.stop()
    after = store.ids()[-1]
    assert after != before
    return os.path.getsize(store.path(after)), len(set(os.listdir(registry)) - registry_before), rows


def test_an_epoch_with_one_change_checkpoints_the_same_bytes_for_3_and_40_tables(pg_url: str, tmp_path: Path) -> None:
    small, small_registry, small_rows = one_change_epoch(pg_url, tmp_path, "few", 3)
    large, large_registry, large_rows = one_change_epoch(pg_url, tmp_path, "many", 40)
    assert small_rows == large_rows == 2  # t_001's schema row and its update: nothing of the other tables
    assert small_registry == large_registry == 0  # the table registry is not rewritten per epoch
    assert abs(large - small) <= 64, (small, large)  # the enumerator state does not list the tables
