"""``tables = 'public.m_*'`` mirrored into one PostgreSQL table per source table (``table = mirror.{table}``)
through kill -9 (at random moments and inside the commit transaction, between two tables), schema
changes, a new and a dropped table, and a drain.

The workload of tests/connectors/postgres/test_source_tables_mirror.py (flinkish_spark.testing.mirror:
a writer changing every table; after two epochs ``ADD COLUMN`` on m_a, ``numeric(12,2) ->
numeric(14,2)`` on m_c, a new table m_new, ``DROP TABLE m_drop``), into the routed
``flinkish.postgres`` sink on the same server: after the kills and the drain every target, read
back as the server's own text of each value (the same JSON rows the source writes), equals its
source table -- exact types (numeric(40,10), a 50-digit numeric, timestamptz, bytea, text[],
jsonb, uuid, interval), the new column and the new table included --; the targets have the
source's column types (m_c.amount widened in place); no table outside the pattern has a target;
there was one slot while running and none after the drain.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import differences, run_workload, slots_and_publications, table_states

pytestmark = pytest.mark.slow

KILLS = 1
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))
TABLES = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]


def spec(tmp_path: Path, url: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.m_*",
            "splitSize": 500, "maxRowsPerTrigger": 2000, "discoveryInterval": 1}},
        "sink": {"format": "flinkish.postgres", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "replica", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "mirror.{table}"}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_pattern_mirror_into_routed_postgres_through_kills_schema_changes_and_new_tables(pg_url, run_pipeline,
                                                                                         tmp_path: Path) -> None:
    run_workload(run_pipeline, lambda **extra: spec(tmp_path, pg_url, **extra), pg_url, str(tmp_path / "cp"),
                 str(tmp_path), KILLS, SEED, crash_at="sink.between_tables:3")

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
        target, target_schemas = table_states(conn, [t.replace("public.", "mirror.") for t in TABLES])
        mirrored = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'mirror' AND tablename NOT LIKE 'flinkish%'").fetchall()}
        epochs = conn.execute("SELECT count(*), count(DISTINCT (epoch, target)) FROM mirror.flinkish_commits").fetchone()
    assert "extra" in schemas["public.m_a"].names
    replica = {t: target[t.replace("public.", "mirror.")] for t in TABLES}
    assert differences(replica, source, schemas) == {}
    for t in TABLES:  # the source's own column types
        assert [(c.name, c.type) for c in target_schemas[t.replace("public.", "mirror.")].columns] == \
               [(c.name, c.type) for c in schemas[t].columns], t
    assert dict((c.name, c.type) for c in target_schemas["mirror.m_c"].columns)["amount"] == "numeric(14,2)"
    assert mirrored == {"m_a", "m_b", "m_c", "m_drop", "m_new"}  # never 'other'
    assert epochs[0] == epochs[1]  # each (epoch, target) committed once
    assert slots_and_publications(pg_url) == (0, [])
