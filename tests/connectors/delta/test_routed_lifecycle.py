"""A routed Delta mirror (``tables = 'public.m_*'``, local ``lake/{schema}/{table}``) through table lifecycle
events that once blocked every table for ever:

* a ``REPLICA IDENTITY FULL`` table changed, then dropped while the mirror was stopped: the range
  read after the restart holds its last changes, and their schema (its key) must be the one it
  was planned with, not the catalog's at read time (where the table no longer exists);
* table names a path cannot hold as they are (``m_straße`` is fine, a space or a ``/`` is not):
  they were refused only when the sink prepared their rows, after the source had planned them,
  so every replay failed again. Every name now has a target, on local disk and on S3.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import delta_differences, slots_and_publications, table_states

pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow


def spec(tmp_path: Path, url: str, tables: str = "public.m_*", lake: str | None = None, endpoint: str | None = None,
         **extra: object) -> dict:
    storage = {"endpointUrl": endpoint} if endpoint else {}
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": tables,
            "discoveryInterval": 1}},
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": str(tmp_path / "meta"), **storage,
            "path": (lake or str(tmp_path / "lake")) + "/{schema}/{table}"}},
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


@pytest.mark.parametrize("where", ["local", "s3"])
def test_table_names_a_path_cannot_hold_as_they_are_get_a_target_each(where: str, pg_url, run_pipeline, tmp_path: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    from flinkish_spark.io.fileio import FileIO

    endpoint = request.getfixturevalue("s3_proc") if where == "s3" else None
    lake = "s3://test/lake" if where == "s3" else str(tmp_path / "lake")
    tables = ["public.m_a", "public.m_straße", "public.m_a b", "public.m_a/x", "public.m_a~y"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for i, table in enumerate(tables):
            name = '"' + table.split(".", 1)[1] + '"'
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {name} SELECT g, %s FROM generate_series(1, 10 + {i}) g", (table,))
        source, schemas = table_states(conn, tables)

    run = run_pipeline(spec(tmp_path, pg_url, lake=lake, endpoint=endpoint, end="drain", stopAfterBatches=1))
    assert run.returncode == 0 and "QUERY_END=drained" in run.output, run.output[-3000:]
    options = {"endpointUrl": endpoint} if endpoint else None
    assert delta_differences(lake, source, schemas, options) == {}
    # A name as it is where a path can hold it; '~' and the UTF-8 bytes in hex for each other character.
    io = FileIO.for_url(lake, {"endpoint_url": endpoint} if endpoint else {})
    assert sorted(io.list_names(f"{lake}/public")) == ["m_a", "m_a~20b", "m_a~2fx", "m_a~7ey", "m_straße"]
