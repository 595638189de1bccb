"""``tables = 'public.m_*'`` mirrored through kill -9, schema changes, a new and a dropped table, and a drain.

A writer process changes rows of every table the whole time (inserts, updates, key changes,
deletes; exact types: numeric(40,10), a 50-digit numeric, timestamptz, bytea, text[], jsonb,
uuid, interval, date). Once the pipeline has committed two epochs it adds a column to one
table, widens a type of another, creates a new matching table and fills it, drops one, and
keeps changing a table outside the pattern. The pipeline (one multi-table source into the
exactly-once ``flinkish.parquet`` sink, 1-second trigger) is killed with kill -9 of its whole
process group at random moments and restarted; after each kill the server has exactly one
replication slot for the database. Then the writer stops and the pipeline is stopped with
drain. The stream, replayed per table as a keyed sink applies it, must equal every source
table (the new one and the new column included); no table outside the pattern appears; no
snapshot row arrives twice; no slot and no publication are left.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.inspect import postgres_tables
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.mirror import (
    SETUP, differences, replay, run_workload, slots_and_publications, table_states,
)
from flinkish_spark.testing.spark_log import committed_batches

pytestmark = pytest.mark.slow

UID = "mirror"
KILLS = 2  # two shared cores: few child-driver restarts
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))


def spec(tmp_path: Path, url: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": UID, "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.m_*",
            "splitSize": 500, "maxRowsPerTrigger": 2000, "discoveryInterval": 1, "retainCheckpoints": 1000}},
        "sink": {"format": "flinkish.parquet", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "out")}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_pattern_mirror_through_kills_schema_changes_new_and_dropped_tables(pg_url, run_pipeline, tmp_path: Path) -> None:
    run_workload(run_pipeline, lambda **extra: spec(tmp_path, pg_url, **extra), pg_url, str(tmp_path / "cp"),
                 str(tmp_path), KILLS, SEED)

    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT 'public.' || relname FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace "
            "AND relname LIKE 'm\\_%' ORDER BY 1").fetchall()]
        assert tables == ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]  # the writer did every step
        source, schemas = table_states(conn, tables)
        assert "extra" in schemas["public.m_a"].names
    replayed, snapshots = replay(str(tmp_path / "out"))
    assert differences(replayed, source, schemas) == {}
    assert set(replayed) == {"public.m_a", "public.m_b", "public.m_c", "public.m_new", "public.m_drop"}  # never 'other'
    assert max(snapshots.values()) == 1  # no chunk was read twice through the kills
    assert any(r.get("extra") is not None for r in replayed["public.m_a"].values())  # the new column arrived
    assert slots_and_publications(pg_url) == (0, [])  # the drain dropped what the source created
    meta = str(tmp_path / "meta")
    assert postgres_tables(FileIO.for_url(meta), meta) == {UID: {"streaming": 4}}  # what `flinkish inspect` shows


def test_bounded_snapshot_of_many_tables_through_random_kills_has_every_row_once(pg_url, run_with_random_kills,
                                                                                 tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    snapshot_spec = spec(tmp_path, pg_url)
    snapshot_spec["source"]["options"].update({"startup": "snapshot", "maxRowsPerTrigger": 1000})
    del snapshot_spec["source"]["options"]["discoveryInterval"]  # a bounded snapshot follows no joins
    output = run_with_random_kills(snapshot_spec, progress=lambda: len(committed_batches(tmp_path / "cp")), kills=2, seed=SEED)
    assert "QUERY_END=finished" in output  # ends by itself once every chunk's epoch is committed
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = ["public.m_a", "public.m_b", "public.m_c", "public.m_drop"]
        source, schemas = table_states(conn, tables)
    replayed, snapshots = replay(str(tmp_path / "out"))
    assert differences(replayed, source, schemas) == {}
    assert sum(snapshots.values()) == sum(len(rows) for rows in source.values()) == 3000 + 1500 + 1000 + 100  # once each
    assert slots_and_publications(pg_url) == (0, [])  # a bounded snapshot creates nothing on the server
