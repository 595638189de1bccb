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
there was one slot while running and none after the drain. Two tables have a shape of their own
(``tableModes``): m_a keeps soft deletes (its deletes and key changes), m_b its history (SCD2): what
they hold now equals their table (``flinkish mirror compare``'s view) and m_b's versions never overlap or
repeat through the kills; m_b's history tracks only j (``trackHistoryColumns``): its versions are the ones the
writer's changes make of it (``tracked_history_problems``: a version per change of j, every later change of only nn
updating it in place). Two have transforms (``transforms``): m_c without a column, its rows entering a filter,
with computed columns; m_new's rows entering and leaving a filter, with a computed column -- each equal to what its
rule makes of its table. The shards m_c, m_drop and m_new are merged into one target ``mirror.merged`` (``routes``,
issue 30 item 3; primary key ``(id, _source_table)``), so the kill between two tables is inside the transaction of an
epoch with a merged target: each shard equals its rows of it (``flinkish mirror compare``'s view), the dropped shard's
rows stay, a column one shard has is null in the other shards' rows (m_c's excluded f too), the target has the widest
type of its shards (m_c's widened amount).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest

import pyarrow as pa

from flinkish_spark.mirror.compare import compare_postgres
from flinkish_spark.testing.mirror import (
    TRACKED_M_B, differences, history_problems, run_workload, slots_and_publications, table_states,
    tracked_history_problems,
)

pytestmark = pytest.mark.slow

KILLS = 1
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))
TABLES = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]
#: m_a with soft deletes, m_b's history tracking j only; the others mirrored.
MODES = json.dumps([{"tables": "public.m_a", "deletes": "soft"}, TRACKED_M_B])
EXTRA = {"mirror.m_a": ["_deleted"], "mirror.m_b": ["_valid_from", "_valid_to", "_current"]}
#: Columns and rows chosen (issue 30 item 2): m_c's rows enter as the writer divides f (amount > f), without f, with
#: computed columns; m_new's rows leave as the writer doubles f (and enter as it inserts), with a computed column.
TRANSFORMS = json.dumps([
    {"tables": "public.m_c", "columns.exclude": "f", "filter": "amount > f",
     "computed": {"cents": "CAST(amount * 100 AS bigint)", "src": "_source_table"}},
    {"tables": "public.m_new", "projection": "*, concat('n', CAST(id AS string)) AS tag", "filter": "f < 100"}])
#: The shards merged, with their own transforms (no Spark start of their own: issue 30 item 3).
ROUTES = json.dumps([{"source-table": "public.m_c, public.m_drop, public.m_new", "sink-table": "mirror.merged"}])


def spec(tmp_path: Path, url: str, sink_options: dict[str, str] | None = None, **extra: object) -> dict:
    sink_options = sink_options or {}
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.m_*",
            "splitSize": 500, "maxRowsPerTrigger": 2000, "discoveryInterval": 1}},
        "sink": {"format": "flinkish.postgres", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "replica", "checkpoint": str(tmp_path / "meta"), "url": url, "table": "mirror.{table}",
            **sink_options}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_pattern_mirror_into_routed_postgres_through_kills_schema_changes_and_new_tables(pg_url, run_pipeline,
                                                                                         tmp_path: Path) -> None:
    options = {"tableModes": MODES, "transforms": TRANSFORMS, "routes": ROUTES}
    run_workload(run_pipeline, lambda **extra: spec(tmp_path, pg_url, options, **extra), pg_url,
                 str(tmp_path / "cp"), str(tmp_path), KILLS, SEED, crash_at="sink.between_tables:3")

    compared = {c.table: c for c in compare_postgres(pg_url, "public.m_*", pg_url, "mirror.{table}", options=options)}
    assert all(compared[t].equal for t in TABLES), [compared[t].summary() for t in TABLES]  # m_c, m_new: their rules'
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
        target, target_schemas = table_states(conn, ["mirror.m_a", "mirror.merged"])
        cur = conn.execute("SELECT k, j::text, nn::text, _valid_from, _valid_to, _current FROM mirror.m_b")
        history = pa.Table.from_pylist([dict(zip([d.name for d in cur.description], r)) for r in cur.fetchall()])
        soft_deleted = conn.execute("SELECT count(*) FROM mirror.m_a WHERE _deleted").fetchone()[0]
        mirrored = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'mirror' AND tablename NOT LIKE 'flinkish%'").fetchall()}
        epochs = conn.execute("SELECT count(*), count(DISTINCT (epoch, target)) FROM mirror.flinkish_commits").fetchone()
    assert "extra" in schemas["public.m_a"].names
    got = [(c.name, c.type) for c in target_schemas["mirror.m_a"].columns]  # the source's own column types
    assert [g for g in got if g[0] != "_deleted"] == [(c.name, c.type) for c in schemas["public.m_a"].columns]
    merged = target["mirror.merged"]  # keyed by (id, _source_table)
    assert {c.name: c.type for c in target_schemas["mirror.merged"].columns} == {  # the shards' columns, m_c's widened
        **{c.name: c.type for c in schemas["public.m_new"].columns}, "tag": "text", "amount": "numeric(14,2)",
        "cents": "bigint", "src": "text", "v": "text", "_source_table": "text"}
    assert target_schemas["mirror.merged"].key == ("id", "_source_table")
    shard = {t: {(json.dumps(r["id"]),): r for r in merged.values() if r["_source_table"] == t}
             for t in ("public.m_c", "public.m_drop", "public.m_new")}
    kept = {k: r for k, r in source["public.m_new"].items() if r["f"] < 100}  # exactly the filter's rows, each value
    assert 0 < len(kept) < len(source["public.m_new"])                        # as the server's own text
    assert differences({"public.m_new": shard["public.m_new"]}, {"public.m_new": kept}, schemas) == {}
    assert all(r["f"] is None and r["src"] == "public.m_c" for r in shard["public.m_c"].values())  # f excluded: m_new's
    assert len(shard["public.m_drop"]) > 50 and all(r["u"] is None for r in shard["public.m_drop"].values())  # stays
    assert history_problems(history, ["k"], ["j"]) == []
    assert tracked_history_problems(history) == []  # the versions the writer's changes make, in place ones too
    assert history.num_rows > len(source["public.m_b"]) and soft_deleted > 0  # versions kept, deletes kept
    assert mirrored == {"m_a", "m_b", "merged"}  # never 'other'
    assert epochs[0] == epochs[1]  # each (epoch, target) committed once
    assert slots_and_publications(pg_url) == (0, [])


NARROW_SETUP = """
CREATE TABLE n_a (id int PRIMARY KEY, big bigint, v text);
CREATE TABLE n_b (id int PRIMARY KEY, w varchar(5));
INSERT INTO n_a SELECT g, g * 1000, 'a' || g FROM generate_series(1, 300) g;
INSERT INTO n_b SELECT g, 'b' FROM generate_series(1, 100) g;
"""


def test_a_narrowed_column_ends_the_mirror_with_the_fix_named_and_after_it_the_restart_finishes_exactly(
        pg_url, run_pipeline, tmp_path: Path) -> None:
    def narrow_spec(**extra: object) -> dict:
        s = spec(tmp_path, pg_url, **extra)
        s["source"]["options"]["tables"] = "public.n_*"
        return s

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(NARROW_SETUP)
    def snapshot_mirrored() -> bool:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass('mirror.n_a'), to_regclass('mirror.n_b')").fetchone().count(None):
                return False
            return conn.execute("SELECT (SELECT count(*) FROM mirror.n_a), (SELECT count(*) FROM mirror.n_b)").fetchone() == (300, 100)

    # Running until both targets hold the snapshot (then killed): the targets have the old types.
    first = run_pipeline(narrow_spec(), kill_after=0.0, kill_when=snapshot_mirrored)
    assert first.killed, first.output[-3000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE n_a SET big = big + 1 WHERE id <= 10")
        conn.execute("ALTER TABLE n_b ALTER COLUMN w TYPE text")  # a widening: followed
        conn.execute("UPDATE n_b SET w = 'longer than five' WHERE id = 1")
        conn.execute("ALTER TABLE n_a ALTER COLUMN big TYPE integer")  # a narrowing: the mirror must stop
        conn.execute("UPDATE n_a SET big = -big, v = 'after' WHERE id <= 20")
        conn.execute("DELETE FROM n_a WHERE id = 300")
    stopped = run_pipeline(narrow_spec(end="drain", stopAfterBatches=2))  # a drain reads every change made so far
    with psycopg.connect(pg_url, autocommit=True) as conn:
        seen = (conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                             "'mirror.n_a'::regclass AND attnum > 0").fetchall(),
                conn.execute("SELECT epoch, target, rows FROM mirror.flinkish_commits ORDER BY 1").fetchall(),
                conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                             "'public.n_a'::regclass AND attnum > 0").fetchall())
    assert "SchemaChangeError" in stopped.output and "QUERY_END=failed" in stopped.output, (seen, stopped.output[-3000:])
    assert "source table public.n_a: column 'big' is now integer, but its target mirror.n_a holds bigint" in stopped.output
    assert "ALTER TABLE mirror.n_a ALTER COLUMN big TYPE integer" in stopped.output

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE mirror.n_a ALTER COLUMN big TYPE integer")  # what the error says to do
    last = run_pipeline(narrow_spec(end="drain", stopAfterBatches=2))
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, ["public.n_a", "public.n_b"])
        target, target_schemas = table_states(conn, ["mirror.n_a", "mirror.n_b"])
    assert differences({t: target[t.replace("public.", "mirror.")] for t in source}, source, schemas) == {}
    assert [c.type for c in target_schemas["mirror.n_b"].columns] == ["integer", "text"]  # widened by the mirror
    assert slots_and_publications(pg_url) == (0, [])


def test_a_table_its_target_cannot_name_stops_the_mirror_and_excluding_it_as_the_error_says_lets_it_go_on(
        pg_url, run_pipeline, tmp_path: Path) -> None:
    """A name the target cannot hold (here ``copy_of_<58 bytes>``: longer than PostgreSQL's 63) is found
    only when the sink routes the table's rows, after the source planned its snapshot. The error names
    the table and the fix; the user excludes it with ``!public.<name>`` and restarts: the replayed
    epoch no longer reads the excluded table's chunks, the other tables go on and end equal."""
    long = "m_" + "x" * 56
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE m_a (id int PRIMARY KEY, v text); CREATE TABLE {long} (id int PRIMARY KEY);"
                     f"INSERT INTO m_a SELECT g, 'a' FROM generate_series(1, 20) g; INSERT INTO {long} VALUES (1)")

    def run(tables: str) -> object:
        s = spec(tmp_path, pg_url, end="drain", stopAfterBatches=1, runSeconds=120)
        s["source"]["options"]["tables"] = tables
        s["sink"]["options"]["table"] = "mirror.copy_of_{table}"
        return run_pipeline(s)

    first = run("public.m_*")
    assert first.returncode != 0 and f"exclude it in the source's 'tables' option (!public.{long})" in first.output, \
        first.output[-3000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE m_a SET v = 'after the stop' WHERE id <= 3; INSERT INTO m_a VALUES (21, 'new')")
    second = run(f"public.m_*, !public.{long}")  # as the error says
    assert second.returncode == 0 and "QUERY_END=drained" in second.output, second.output[-3000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, ["public.m_a"])
        target, _ = table_states(conn, ["mirror.copy_of_m_a"])
        mirrored = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'mirror' "
                                               "AND tablename NOT LIKE 'flinkish%'").fetchall()}
    assert differences({"public.m_a": target["mirror.copy_of_m_a"]}, source, schemas) == {}
    assert mirrored == {"copy_of_m_a"} and slots_and_publications(pg_url) == (0, [])
