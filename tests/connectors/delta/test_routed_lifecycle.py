"""A routed Delta mirror (``tables = 'public.m_*'``, local ``lake/{schema}/{table}``) through table lifecycle
events that once blocked every table for ever:

* a ``REPLICA IDENTITY FULL`` table changed, then dropped while the mirror was stopped: the range
  read after the restart holds its last changes, and their schema (its key) must be the one it
  was planned with, not the catalog's at read time (where the table no longer exists).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import delta_differences, slots_and_publications, table_states

pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow


def spec(tmp_path: Path, url: str, tables: str = "public.m_*", **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": tables,
            "discoveryInterval": 1}},
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "lake") + "/{schema}/{table}"}},
        "trigger": "1 second",
        "runSeconds": 120,
        **extra,
    }


def test_a_full_identity_table_dropped_before_its_changes_are_read_still_gets_them(pg_url, run_pipeline,
                                                                                  tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_full (id int PRIMARY KEY, v text); ALTER TABLE m_full REPLICA IDENTITY FULL;"
                     "CREATE TABLE m_other (id int PRIMARY KEY, v text);"
                     "INSERT INTO m_full SELECT g, 'f' FROM generate_series(1, 20) g;"
                     "INSERT INTO m_other SELECT g, 'o' FROM generate_series(1, 20) g")
    first = run_pipeline(spec(tmp_path, pg_url, end="stop", stopAfterBatches=1))  # the snapshot, then a stop
    assert first.returncode == 0 and "QUERY_END=stopped" in first.output, first.output[-3000:]

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE m_full SET v = 'changed' WHERE id <= 5; DELETE FROM m_full WHERE id > 15;"
                     "INSERT INTO m_full VALUES (100, 'new')")
        conn.execute("UPDATE m_other SET v = 'before drop' WHERE id = 1")
        before_drop, full_schema = table_states(conn, ["public.m_full"])
        conn.execute("DROP TABLE m_full")
        conn.execute("UPDATE m_other SET v = 'after drop' WHERE id = 2; INSERT INTO m_other VALUES (21, 'new')")
        other, other_schema = table_states(conn, ["public.m_other"])

    # The restart's first planning sees m_full gone and reads the range that holds its last changes.
    last = run_pipeline(spec(tmp_path, pg_url, end="drain", stopAfterBatches=1))
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]
    assert delta_differences(str(tmp_path / "lake"), {**before_drop, **other}, {**full_schema, **other_schema}) == {}
    assert slots_and_publications(pg_url) == (0, [])
