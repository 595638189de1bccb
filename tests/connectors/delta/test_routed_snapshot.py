"""A bounded snapshot of many small tables and one of several chunks into routed Delta, killed mid-snapshot.

Small tables count their rows' share of a chunk against the epoch's chunk budget
(``SplitExtent.share``): the first epoch holds every small table and two chunks of the big one,
and its commit writes one Delta version per table. The run is killed at
``sink.between_tables`` of that epoch (the first table has its version, the others not); the
restart commits the others from the decision and reads the last chunk. Every target equals its
source table and the snapshot took two epochs (two chunks per epoch would have taken eight).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import delta_differences, table_states
from flinkish_spark.testing.spark_log import committed_batches

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

SMALL = [f"public.s_{i:02d}" for i in range(12)]
TABLES = SMALL + ["public.s_big"]


def spec(tmp_path: Path, url: str) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.s_*",
            "startup": "snapshot", "splitSize": 500, "maxRowsPerTrigger": 1000}},
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "lake" / "{schema}" / "{table}")}},
        "trigger": "1 second",
        "end": "finish",
        "runSeconds": 200,
    }


def test_a_snapshot_epoch_of_many_small_tables_killed_between_their_commits_finishes_exactly(
        pg_url: str, run_pipeline, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for t in SMALL:
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n numeric(12,2))")
            conn.execute(f"INSERT INTO {t} SELECT g, 'v' || g, g / 7.0 FROM generate_series(1, 30) g")
        conn.execute("CREATE TABLE public.s_big (id bigint PRIMARY KEY, v text)")
        conn.execute("INSERT INTO public.s_big SELECT g, md5(g::text) FROM generate_series(1, 1200) g")
        conn.execute("ANALYZE")
        source, schemas = table_states(conn, TABLES)

    killed = run_pipeline(spec(tmp_path, pg_url), crash_at="sink.between_tables:1")
    assert killed.killed, killed.output[-3000:]
    assert committed_batches(tmp_path / "cp") == []  # killed inside the first epoch's commit
    done = run_pipeline(spec(tmp_path, pg_url))
    assert "QUERY_END=finished" in done.output, done.output[-3000:]

    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    # 12 tables of 30 rows (0.06 of a chunk each) and two of s_big's three chunks, then its last chunk.
    assert committed_batches(tmp_path / "cp") == [0, 1]
