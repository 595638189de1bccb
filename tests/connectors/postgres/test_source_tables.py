"""``flinkish.postgres`` with ``tables``: discovery, one slot and publication, WAL order, schema rows, joining tables.

The enumerator and reader on a real server, without a Spark query (the end-to-end mirror
through kills is test_source_tables_mirror.py): which tables a pattern takes; the server's
one slot and one publication; chunks of every table; the change split's rows of all tables
in commit order with an ``s`` row before each table's first row and before the first row
after each ALTER TABLE; a table created while running joins the publication and its chunks
wait for the transactions that were open when it joined; dropped and renamed tables leave.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import math
import psycopg
import pyarrow as pa
import pytest

from flinkish_spark.checkpoint.model import SplitRecord
from flinkish_spark.connectors.postgres.rows import TableSchema, split_tables
from flinkish_spark.connectors.postgres.source.tables_enumerator import TablesEnumerator
from flinkish_spark.errors import ConfigError, PostgresSourceError
from flinkish_spark.testing.tables_source import (
    changes_between, complete, drop_slot, read_all, server_objects, source, start_streaming, without_markers,
)


def test_options_table_and_tables_exclude_each_other(pg_url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="either 'table' .* or 'tables'.*not both"):
        source(pg_url, tmp_path, table="public.t")
    with pytest.raises(ConfigError, match="'splitColumn' applies to 'table' only"):
        source(pg_url, tmp_path, splitColumn="id")
    with pytest.raises(ConfigError, match="'decodeIn' applies to rowFormat=arrow only.*set rowFormat=arrow or drop"):
        source(pg_url, tmp_path, decodeIn="sink")
    with pytest.raises(ConfigError, match="option 'decodeIn' must be one of source, sink, got 'driver'"):
        source(pg_url, tmp_path, rowFormat="arrow", decodeIn="driver")
    assert source(pg_url, tmp_path, rowFormat="arrow", decodeIn="sink").decode_in == "sink"  # type: ignore[attr-defined]


def test_snapshot_rows_per_trigger_bounds_the_chunks_of_an_epoch_and_defaults_to_max_rows_per_trigger(
        pg_url: str, tmp_path: Path) -> None:
    def chunks(**options: str) -> int:
        return source(pg_url, tmp_path, splitSize="100", **options).default_read_limit().max_files  # type: ignore[attr-defined]

    assert chunks(maxRowsPerTrigger="200", snapshotRowsPerTrigger="1000") == 10
    assert chunks(maxRowsPerTrigger="200") == 2


@pytest.mark.both_postgres
def test_discovery_takes_matching_tables_into_one_publication_and_one_slot(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA sales")
        for t in ("public.m_a", "public.m_b", "public.m_skip", "sales.m_c", "public.other"):
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 25) g")
        conn.execute("CREATE TABLE m_p (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE m_p_1 PARTITION OF m_p FOR VALUES FROM (0) TO (1000)")  # a partition: read via its root
        conn.execute("INSERT INTO m_p SELECT g, 'p' FROM generate_series(1, 5) g")
        conn.execute("CREATE VIEW m_view AS SELECT 1 AS id")
        src = source(pg_url, tmp_path, tables="public.m_*, sales.*, !public.m_skip")
        enum = src.create_enumerator()
        splits = enum.discover(set())
        assert isinstance(enum, TablesEnumerator)
        assert [(e.name, e.state) for e in enum.registry.entries] == [
            ("public.m_a", "snapshot"), ("public.m_b", "snapshot"), ("public.m_p", "snapshot"), ("sales.m_c", "snapshot")]
        assert len(splits) == 3 * 3 + 1  # 25 rows in chunks of 10, and the partitioned table's 5
        # Against an epoch's chunk budget a table of one chunk counts its rows' share of a full chunk.
        shares = {s.split_id: enum.extent(s, 0).share for s in splits if s.split_id.startswith("snapshot-")}
        assert sorted(shares.values()) == [0.5] + [1.0] * 9
        slots, pubs = server_objects(conn)
        assert slots == 1 and pubs == [("flinkish_multi", {"public.m_a", "public.m_b", "public.m_p", "sales.m_c"})]
        rows = read_all(src, splits)
        assert rows.schema.names == ["_table", "_op", "_lsn", "_seq", "_commit_ts", "_schema_id", "row"]
        counts = {t: r.rows.num_rows for t, r in split_tables(rows).items()}
        assert counts == {"public.m_a": 25, "public.m_b": 25, "public.m_p": 5, "sales.m_c": 25}
        drop_slot(conn)


@pytest.mark.both_postgres
def test_a_matching_table_without_a_usable_key_is_left_out_and_one_with_a_replica_identity_index_followed(
        pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE m_log (at timestamptz); ALTER TABLE m_log REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE m_ri (id int, code text NOT NULL, v text); CREATE UNIQUE INDEX m_ri_code ON m_ri (code); "
                     "ALTER TABLE m_ri REPLICA IDENTITY USING INDEX m_ri_code; INSERT INTO m_ri VALUES (1, 'x', 'a')")
        src = source(pg_url, tmp_path)
        src.schema()  # no error
        enum, changes = start_streaming(src)
        assert sorted(e.name for e in enum.registry.entries) == ["public.m_a", "public.m_ri"]
        assert list(enum.not_followed) == ["public.m_log"]
        assert enum.not_followed["public.m_log"].startswith(
            "public.m_log is not followed: it has no primary key (REPLICA IDENTITY FULL alone does not tell equal "
            "rows apart). ALTER TABLE public.m_log ADD PRIMARY KEY (...) or ALTER TABLE public.m_log REPLICA IDENTITY "
            "USING INDEX")
        assert server_objects(conn)[1] == [("flinkish_multi", {"public.m_a", "public.m_ri"})]
        conn.execute("INSERT INTO m_log VALUES (now()); UPDATE m_ri SET v = 'b' WHERE code = 'x'; "
                     "DELETE FROM m_ri WHERE code = 'x'")
        rows = [r for r in changes_between(src, enum, changes, 0)[0].to_pylist() if r["_op"] != "s"]
        drop_slot(conn)
    assert [(r["_table"], r["_op"], json.loads(r["row"])) for r in rows] == [
        ("public.m_ri", "u", {"id": 1, "code": "x", "v": "b"}), ("public.m_ri", "d", {"code": "x"})]


def test_no_matching_table_is_refused(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
    with pytest.raises(PostgresSourceError, match="no table matches 'tables' = 'nothing.\\*'"):
        source(pg_url, tmp_path, tables="nothing.*").schema()
    assert not (tmp_path / "meta" / "sources").exists()  # refused before anything was written


@pytest.mark.both_postgres
def test_changes_of_all_tables_in_commit_order_with_schema_rows_before_the_rows_they_govern(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY, n int, s varchar(10))")
        conn.execute("CREATE TABLE m_b (k text PRIMARY KEY, x numeric(40,10))")
        conn.execute("INSERT INTO m_a VALUES (1, 1, 'a')")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        with conn.transaction():
            conn.execute("INSERT INTO m_b VALUES ('k1', 1.5)")
            conn.execute("UPDATE m_a SET n = 2 WHERE id = 1")
        conn.execute("ALTER TABLE m_a ADD COLUMN extra text")
        conn.execute("INSERT INTO m_a VALUES (2, 3, 'b', 'new')")
        conn.execute("UPDATE m_b SET x = 123456789012345678901234567890.0123456789 WHERE k = 'k1'")
        conn.execute("ALTER TABLE m_a DROP COLUMN extra")
        conn.execute("ALTER TABLE m_a ALTER COLUMN n TYPE bigint, ALTER COLUMN s TYPE text")
        conn.execute("UPDATE m_a SET n = 5000000000, s = repeat('x', 20) WHERE id = 1")
        conn.execute("DELETE FROM m_b WHERE k = 'k1'")
        conn.execute("UPDATE m_a SET id = 7 WHERE id = 2")  # a key change: d of the old key, then the new row
        rows, end = changes_between(src, enum, changes, 0)
        again, _ = changes_between(src, enum, changes, 0)
        drop_slot(conn)
    assert again.equals(rows)  # a replay of the range reads the same rows
    got = [(r["_table"], r["_op"], r["row"] if r["_op"] != "s" else [c["name"] + ":" + c["type"] for c in json.loads(r["row"])["columns"]])
           for r in rows.to_pylist()]
    assert got == [
        ("public.m_b", "s", ["k:text", "x:numeric(40,10)"]),
        ("public.m_b", "c", '{"k":"k1","x":"1.5000000000"}'),
        ("public.m_a", "s", ["id:integer", "n:integer", "s:character varying(10)"]),
        ("public.m_a", "u", '{"id":1,"n":2,"s":"a"}'),
        ("public.m_a", "s", ["id:integer", "n:integer", "s:character varying(10)", "extra:text"]),
        ("public.m_a", "c", '{"id":2,"n":3,"s":"b","extra":"new"}'),
        ("public.m_b", "u", '{"k":"k1","x":"123456789012345678901234567890.0123456789"}'),
        ("public.m_a", "s", ["id:integer", "n:bigint", "s:text"]),
        ("public.m_a", "u", '{"id":1,"n":5000000000,"s":"xxxxxxxxxxxxxxxxxxxx"}'),
        ("public.m_b", "d", '{"k":"k1"}'),
        ("public.m_a", "d", '{"id":2}'),
        ("public.m_a", "u", '{"id":7,"n":3,"s":"b"}'),
    ]
    positions = [(r["_lsn"], r["_seq"]) for r in rows.to_pylist()]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)  # (_lsn, _seq) strictly increasing
    last: dict[str, str] = {}
    for r in rows.to_pylist():  # every data row names the schema of the last 's' row of its table before it
        if r["_op"] == "s":
            last[r["_table"]] = r["_schema_id"]
        else:
            assert r["_schema_id"] == last[r["_table"]]
    a = split_tables(rows)["public.m_a"]
    assert [len(s.columns) for s in a.schemas] == [3, 4, 3] and a.rows.schema.field("n").type == pa.int64()
    assert TableSchema.from_json(rows.to_pylist()[2]["row"]).key == ("id",)


@pytest.mark.both_postgres
def test_a_table_created_while_running_joins_after_the_transactions_open_at_that_moment(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn, psycopg.connect(pg_url) as open_txn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        open_txn.execute("INSERT INTO other VALUES (1)")  # a transaction with an xid, still open when m_new joins
        conn.execute("CREATE TABLE m_new (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO m_new SELECT g, 'before' FROM generate_series(1, 15) g")
        assert enum.discover({changes.split_id}) == []  # joined, but its snapshot must wait
        (entry,) = [e for e in enum.registry.entries if e.name == "public.m_new"]
        assert entry.state == "joining" and entry.after_xid is not None
        assert ("flinkish_multi", {"public.m_a", "public.m_new"}) in server_objects(conn)[1]
        conn.execute("UPDATE m_new SET v = 'after join' WHERE id = 1")  # published now: in the stream, and in the chunk
        assert enum.discover({changes.split_id}) == []
        open_txn.commit()
        chunks = enum.discover({changes.split_id})
        assert [json.loads(c.payload or "{}")["table"] for c in chunks] == ["public.m_new", "public.m_new"]
        assert {json.loads(c.payload or "{}")["after_xid"] for c in chunks} == {entry.after_xid}
        conn.execute("UPDATE m_new SET v = 'later' WHERE id = 2")
        read = read_all(src, chunks)
        # A joining table's snapshot is bracketed (B ... E): a keyed sink drops the keys it lacks.
        assert [op for op in read.column("_op").to_pylist() if op != "r"] == ["s", "B", "s", "E"]
        snapshot = split_tables(without_markers(read))["public.m_new"].rows
        stream, _ = changes_between(src, enum, changes, 0)
        complete(src, enum, 2, chunks, (SplitRecord(changes.split_id, 0, 1),))
        assert [e.state for e in enum.registry.entries if e.name == "public.m_new"] == ["streaming"]
        drop_slot(conn)
    assert snapshot.num_rows == 15 and snapshot.filter(pa.compute.equal(snapshot["id"], 1))["v"].to_pylist() == ["after join"]
    new_rows = [(r["_op"], r["row"]) for r in stream.to_pylist() if r["_table"] == "public.m_new" and r["_op"] != "s"]
    # Changes after the join are in the stream (the one before the chunk again: harmless for a keyed target).
    assert new_rows == [("u", '{"id":1,"v":"after join"}'), ("u", '{"id":2,"v":"later"}')]


def test_dropped_and_renamed_tables_leave_and_a_new_name_is_snapshotted(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for t in ("m_a", "m_b", "m_c"):
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
            conn.execute(f"INSERT INTO {t} VALUES (1), (2)")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        before = {e.name: e.tid for e in enum.registry.entries}
        conn.execute("DROP TABLE m_b")
        conn.execute("ALTER TABLE m_a RENAME TO m_renamed")
        conn.execute("ALTER TABLE m_c RENAME TO elsewhere")  # out of the patterns
        chunks = enum.discover({changes.split_id})
        after = {e.name: (e.tid, e.state) for e in enum.registry.entries}
        assert set(after) == {"public.m_renamed"} and after["public.m_renamed"][0] not in before.values()
        assert [json.loads(c.payload or "{}")["table"] for c in chunks] == ["public.m_renamed"]
        assert server_objects(conn)[1] == [("flinkish_multi", {"public.m_renamed"})]  # 'elsewhere' left the publication
        read = read_all(src, chunks)
        assert [op for op in read.column("_op").to_pylist() if op != "r"] == ["s", "B", "E"]  # replaces, never merges
        renamed = split_tables(without_markers(read))["public.m_renamed"].rows
        assert renamed.column("id").to_pylist() == [1, 2]
        drop_slot(conn)


def test_state_stays_small_and_the_registry_is_rewritten_only_when_tables_change(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for i in range(200):
            conn.execute(f"CREATE TABLE m_{i:03d} (id int PRIMARY KEY)")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        state, name = enum.snapshot_state(), enum.registry_name
        for epoch in range(3, 6):
            assert enum.discover({changes.split_id}) == []
            complete(src, enum, epoch, [], (SplitRecord(changes.split_id, 0, 1),))
        assert (enum.snapshot_state(), enum.registry_name) == (state, name)  # no new registry while no table changed
        assert len(state) < 200  # the state names the registry, it does not hold the 200 tables
        files = list((tmp_path / "meta" / "sources" / "multi" / "tables").iterdir())
        assert len(files) == 2  # written at the start, then once when the snapshot of all 200 was complete
        drop_slot(conn)


def test_a_joining_table_dropped_before_its_snapshot_just_leaves(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn, psycopg.connect(pg_url) as open_txn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        src = source(pg_url, tmp_path, discoveryInterval="3600")  # no poll between the drop and the planning
        enum, changes = start_streaming(src)
        open_txn.execute("INSERT INTO other VALUES (1)")
        conn.execute("CREATE TABLE m_new (id int PRIMARY KEY)")
        enum._discovered_at = -math.inf  # poll now
        assert enum.discover({changes.split_id}) == []
        assert [e.state for e in enum.registry.entries if e.name == "public.m_new"] == ["joining"]
        conn.execute("DROP TABLE m_new")
        open_txn.commit()
        assert enum.discover({changes.split_id}) == []  # nothing to plan, no error
        enum._discovered_at = -math.inf
        enum.discover({changes.split_id})
        assert [e.name for e in enum.registry.entries] == ["public.m_a"]
        drop_slot(conn)


def test_a_given_publication_must_publish_every_matching_table(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE m_b (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION mine FOR TABLE m_a")
        src = source(pg_url, tmp_path, publication="mine")
        with pytest.raises(PostgresSourceError, match=r"the publication 'mine' does not publish public.m_b; "
                                                      r"ALTER PUBLICATION mine ADD TABLE public.m_b"):
            src.create_enumerator().discover(set())
        assert server_objects(conn)[0] == 0  # refused before the slot was created
        conn.execute("ALTER PUBLICATION mine ADD TABLE m_b")
        src.create_enumerator().discover(set())
        assert server_objects(conn) == (1, [("mine", {"public.m_a", "public.m_b"})])
        drop_slot(conn)


def test_a_lost_slot_with_resnapshot_reads_every_table_again_between_markers(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE m_b (id int PRIMARY KEY)")
        conn.execute("INSERT INTO m_a SELECT g, 'a' FROM generate_series(1, 25) g")
        conn.execute("INSERT INTO m_b VALUES (1), (2)")
        src = source(pg_url, tmp_path, onSlotLost="resnapshot")
        enum, changes = start_streaming(src)
        drop_slot(conn)  # lost while stopped: the changes below are in no stream
        conn.execute("DELETE FROM m_a WHERE id > 20")
        conn.execute("UPDATE m_b SET id = 3 WHERE id = 2")
        again = source(pg_url, tmp_path, onSlotLost="resnapshot").create_enumerator()
        again.restore(enum.snapshot_state())
        chunks = again.discover({changes.split_id})
        assert {c.split_id.split("-")[1] for c in chunks} == {"1"}  # generation 1: a new slot and snapshot
        assert server_objects(conn)[0] == 1
        rows = read_all(src, chunks).to_pylist()
        drop_slot(conn)
    ops = {t: [r["_op"] for r in rows if r["_table"] == t and r["_op"] != "r"] for t in ("public.m_a", "public.m_b")}
    assert ops == {"public.m_a": ["s", "B", "s", "E"], "public.m_b": ["s", "B", "E"]}  # 2 chunks of m_a (20 rows left), 1 of m_b
    assert sorted(json.loads(r["row"])["id"] for r in rows if r["_table"] == "public.m_b" and r["_op"] == "r") == [1, 3]


@pytest.mark.both_postgres
def test_a_keyless_table_created_while_running_is_left_out_with_a_warning_until_it_has_a_key(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        conn.execute("CREATE TABLE m_log (at timestamptz)")
        with caplog.at_level("WARNING"):
            assert enum.discover({changes.split_id}) == []  # no error: the source goes on
        assert [e.name for e in enum.registry.entries] == ["public.m_a"]
        assert "public.m_log is not followed: it has no primary key. ALTER TABLE public.m_log ADD PRIMARY KEY" in caplog.text
        from flinkish_spark.connectors.cdc.patterns import read_not_followed

        directory = src.checkpoint_store().directory
        assert read_not_followed(src.io, directory) == enum.not_followed  # what progress and inspect read, at once
        conn.execute("ALTER TABLE m_log ADD COLUMN id serial PRIMARY KEY")
        chunks = enum.discover({changes.split_id})  # it joins (its snapshot once open transactions end)
        assert [e.state for e in enum.registry.entries if e.name == "public.m_log"] == ["snapshot"] and len(chunks) == 1
        assert enum.not_followed == {} and read_not_followed(src.io, directory) == {}
        drop_slot(conn)


@pytest.mark.both_postgres
def test_an_update_that_leaves_a_toasted_value_unchanged_lists_the_column_and_a_new_key_with_one_is_refused(
        pg_url: str, tmp_path: Path) -> None:
    """The default replica identity: the server sends 'unchanged' for an out-of-line value an update did not touch;
    the row leaves it out and names it. An update that also changes the key cannot be completed by key: refused."""
    from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD

    big = "x" * 100 + os.urandom(3_000).hex()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_docs (id int PRIMARY KEY, n int, body text); "
                     "ALTER TABLE m_docs ALTER COLUMN body SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO m_docs VALUES (1, 0, %s), (2, 0, 'small')", (big,))
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        conn.execute("UPDATE m_docs SET n = 1 WHERE id IN (1, 2)")
        rows, end = changes_between(src, enum, changes, 0)
        got = [json.loads(r["row"]) for r in rows.to_pylist() if r["_op"] == "u"]
        assert got == [{"id": 1, "n": 1, UNCHANGED_FIELD: ["body"]}, {"id": 2, "n": 1, "body": "small"}]
        conn.execute("UPDATE m_docs SET id = 3 WHERE id = 1")
        with pytest.raises(PostgresSourceError, match=r"public.m_docs .* changed the row's key and left the TOASTed "
                                                      r"value of column 'body' unchanged.*REPLICA IDENTITY FULL"):
            changes_between(src, enum, changes, end)
        drop_slot(conn)
