"""``flinkish.postgres`` with startup=snapshot: a bounded table read in chunks that finish.

Under a processing-time trigger the query ends by itself once the epoch with the last
chunk is committed; every row arrives exactly once; after a kill -9 midway (as the second of
four epochs reads its chunks), the chunks of committed epochs are never read again (the
counting reader logs every read). The issue's size: 1M rows in 8 chunks, bulk-loaded with
``generate_series``.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flinkish_spark.testing.postgres import committed_checkpoint, pg_read_log

pytestmark = pytest.mark.slow

ROWS = 1_000_000
SPLIT = 125_000  # 8 chunks
PER_EPOCH = 2 * SPLIT  # maxRowsPerTrigger: 2 chunks per epoch, 4 epochs


def make_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, name text, price numeric(12,2), at timestamptz)")
        conn.execute(
            "INSERT INTO items SELECT g, 'item ' || g, g / 100.0, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second' "
            f"FROM generate_series(1, {ROWS}) g"
        )


def spec(tmp_path: Path, url: str) -> dict:
    return {
        "register": ["flinkish_spark.testing.postgres:register_postgres_test_sources"],
        "source": {
            "format": "flinkish.testing.pgcounting",
            "options": {
                "uid": "items", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "public.items",
                "startup": "snapshot", "splitSize": SPLIT, "maxRowsPerTrigger": PER_EPOCH,
                "readLog": str(tmp_path / "reads"), "retainCheckpoints": 100,
            },
        },
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"),
                 "options": {"uid": "out", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "out")}},
        "trigger": "1 second",
        "end": "finish",
        "runSeconds": 240,
    }


def test_bounded_snapshot_killed_midway_ends_by_itself_with_every_row_once(pg_url, run_pipeline, tmp_path: Path) -> None:
    make_table(pg_url)
    s = spec(tmp_path, pg_url)
    killed = run_pipeline(s, crash_at="pgcounting.read:4")  # as the second epoch's second chunk read begins
    assert killed.killed, killed.output[-3000:]
    done = committed_checkpoint(str(tmp_path / "cp"), str(tmp_path / "meta"), "items")
    assert done is not None, "the first epoch should be committed before the kill"
    committed_chunks = {r.split_id for r in done.splits if r.finished}
    assert len(committed_chunks) >= 2
    reads_before = pg_read_log(str(tmp_path / "reads"))

    last = run_pipeline(s)
    assert last.returncode == 0 and "QUERY_END=finished" in last.output, last.output[-3000:]

    table = pq.read_table(str(tmp_path / "out"), columns=["id", "name", "price", "_op", "_lsn"])
    ids = table.column("id")
    assert table.num_rows == ROWS and pc.count_distinct(ids).as_py() == ROWS  # every row, once
    assert pc.min(ids).as_py() == 1 and pc.max(ids).as_py() == ROWS
    assert pc.unique(table.column("_op")).to_pylist() == ["r"] and table.column("_lsn").null_count == table.num_rows
    (row,) = table.filter(pc.equal(ids, 12345)).to_pylist()
    assert row["name"] == "item 12345" and str(row["price"]) == "123.45"

    reads = pg_read_log(str(tmp_path / "reads"))
    chunks = {r[0] for r in reads}
    assert len(chunks) >= 8  # the ">= 8 chunks"
    assert len(reads_before) >= 3  # the kill came while the second epoch was reading
    per_chunk = collections.Counter(r[0] for r in reads)
    # Chunks of committed epochs: read once, before the kill, never again.
    assert {c: per_chunk[c] for c in committed_chunks} == {c: 1 for c in committed_chunks}
    assert not [r for r in reads if r[0] in committed_chunks and r not in reads_before]
    # Only the killed epoch's chunks (2 at most) may have been read twice.
    assert sum(per_chunk.values()) <= len(chunks) + PER_EPOCH // SPLIT

    # startup=snapshot creates no slot and no publication, and drops nothing.
    import psycopg

    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'flinkish_%'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0
    assert os.path.isdir(tmp_path / "reads")
