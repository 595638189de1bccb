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
import random
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.inspect import postgres_tables
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.mirror import differences, replay, table_states
from flinkish_spark.testing.spark_log import committed_batches

pytestmark = pytest.mark.slow

UID = "mirror"
KILLS = 2  # two shared cores: few child-driver restarts
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))

SETUP = """
CREATE TABLE m_a (id bigint PRIMARY KEY, v text, n numeric(40,10), ts timestamptz, b bytea, tags text[]);
CREATE TABLE m_b (k text PRIMARY KEY, j jsonb, d date, nn numeric);
CREATE TABLE m_c (id int PRIMARY KEY, amount numeric(12,2), f float8);
CREATE TABLE m_drop (id int PRIMARY KEY, v text);
CREATE TABLE other (id int PRIMARY KEY, v text);
INSERT INTO m_a SELECT g, 'a' || g, g * 1234567.0123456789, timestamptz '2024-01-01 00:00:00+00' + g * interval '1.000001 s',
  decode(md5(g::text), 'hex'), ARRAY['t' || g % 7, 'x y'] FROM generate_series(1, 3000) g;
INSERT INTO m_b SELECT 'k' || g, jsonb_build_object('g', g, 'big', 1.000000000000000000000000000000000000001),
  date '2020-01-01' + g, 12345678901234567890123456789012345678901234567890.5 + g FROM generate_series(1, 1500) g;
INSERT INTO m_c SELECT g, g / 100.0, g * 0.1 FROM generate_series(1, 1000) g;
INSERT INTO m_drop SELECT g, 'd' FROM generate_series(1, 100) g;
INSERT INTO other SELECT g, 'o' FROM generate_series(1, 100) g;
"""

WRITER = r'''
import os, random, sys, time, psycopg
url, stop_file, commits_dir = sys.argv[1], sys.argv[2], sys.argv[3]
rnd = random.Random(7)
next_id = 1_000_000
ddl_at, ddl_done = None, 0
def committed():
    return sum(1 for n in os.listdir(commits_dir) if n.isdigit()) if os.path.isdir(commits_dir) else 0
with psycopg.connect(url, autocommit=True) as conn:
    while not os.path.exists(stop_file):
        if ddl_at is None and committed() >= 2:
            ddl_at = time.time()  # the pipeline runs: schema changes and new tables from now on
        if ddl_at is not None and ddl_done < 4 and time.time() - ddl_at > 2 * ddl_done:
            [lambda: conn.execute("ALTER TABLE m_a ADD COLUMN extra int"),
             lambda: conn.execute("ALTER TABLE m_c ALTER COLUMN amount TYPE numeric(14,2)"),
             lambda: (conn.execute("CREATE TABLE m_new (id int PRIMARY KEY, u uuid, iv interval, f float8)"),
                      conn.execute("INSERT INTO m_new SELECT g, gen_random_uuid(), g * interval '1.5 day', g / 3.0 "
                                   "FROM generate_series(1, 700) g")),
             lambda: conn.execute("DROP TABLE m_drop")][ddl_done]()
            ddl_done += 1
        k = rnd.randint(1, 3000)
        op = rnd.random()
        with conn.transaction():
            if op < 0.3:
                conn.execute("INSERT INTO m_a (id, v, n, ts, b, tags) VALUES (%s, 'new', 1.5, now(), '\\x00', '{a}')", (next_id,))
                next_id += 1
            elif op < 0.5:
                conn.execute("UPDATE m_a SET v = v || '+', n = n * 3, tags = tags || 'u'::text WHERE id = %s", (k,))
                if ddl_done >= 1:
                    conn.execute("UPDATE m_a SET extra = %s WHERE id = %s", (k, k + 1))
            elif op < 0.6:
                conn.execute("UPDATE m_a SET id = %s WHERE id = %s", (next_id, k))  # a key change
                next_id += 1
            elif op < 0.7:
                conn.execute("DELETE FROM m_a WHERE id = %s", (k,))
            elif op < 0.8:
                conn.execute("UPDATE m_b SET j = j || '{\"u\": 1}', nn = nn * 2 WHERE k = %s", (f"k{k % 1500}",))
                conn.execute("DELETE FROM m_b WHERE k = %s", (f"k{(k * 7) % 1500}",))
            elif op < 0.9:
                conn.execute("UPDATE m_c SET amount = amount + 0.01, f = f / 3 WHERE id = %s", (k % 1000,))
                conn.execute("UPDATE other SET v = v || '+' WHERE id = %s", (k % 100,))
                if ddl_done < 4:
                    conn.execute("UPDATE m_drop SET v = v || '+' WHERE id = %s", (k % 100,))
            elif ddl_done >= 3:
                conn.execute("UPDATE m_new SET f = f * 2, iv = iv + interval '1 s' WHERE id = %s", (k % 700,))
                conn.execute("INSERT INTO m_new VALUES (%s, gen_random_uuid(), '1 hour', 0.5)", (next_id,))
                next_id += 1
        time.sleep(0.004)
'''



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


def slots_and_publications(url: str) -> tuple[int, list[str]]:
    with psycopg.connect(url) as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").fetchone()[0]
        pubs = [r[0] for r in conn.execute("SELECT pubname FROM pg_publication").fetchall()]
    return slots, pubs


def test_pattern_mirror_through_kills_schema_changes_new_and_dropped_tables(pg_url, run_pipeline, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    stop_file = tmp_path / "stop-writer"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, pg_url, str(stop_file), str(tmp_path / "cp" / "commits")])
    try:
        rng = random.Random(SEED)
        for kill in range(KILLS):
            before = len(committed_batches(tmp_path / "cp"))
            delay = rng.uniform(2.0, 8.0)
            run = run_pipeline(spec(tmp_path, pg_url), kill_after=delay, kill_when=lambda: len(committed_batches(tmp_path / "cp")) > before + 1)
            assert run.killed, f"expected a kill {delay:.1f}s after a commit, got rc={run.returncode}:\n{run.output[-3000:]}"
            assert slots_and_publications(pg_url) == (1, ["flinkish_mirror"]), kill  # one slot, one publication
        # Let the schema changes and the new table happen before the end (the writer starts them after two commits).
        run = run_pipeline(spec(tmp_path, pg_url, runSeconds=25))
        assert run.returncode == 0, run.output[-3000:]
    finally:
        stop_file.touch()
        writer.wait(timeout=60)
    last = run_pipeline(spec(tmp_path, pg_url, end="drain", stopAfterBatches=2))
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]

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
