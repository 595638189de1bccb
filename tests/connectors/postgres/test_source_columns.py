"""``flinkish.postgres`` with ``tables`` and ``transforms``: a column a rule leaves out never leaves PostgreSQL.

The enumerator and reader on the real server, without a Spark query (as test_source_tables.py): the snapshot's
rows, the publication's column list, the slot's raw pgoutput stream and the decoded changes never hold a marker
written into the excluded columns -- also of a column added later; a kept column added later joins the column list
at the next catalog poll, which snapshots the table again; a DDL on an excluded column snapshots nothing again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from flinkish_spark.checkpoint.model import SplitRecord
from flinkish_spark.connectors.lakehouse.packed import PackedDecode
from flinkish_spark.connectors.postgres.rows import split_tables
from flinkish_spark.connectors.postgres.source.datasource import PostgresSourceDataSource
from flinkish_spark.connectors.postgres.source.tables_enumerator import TablesEnumerator
from flinkish_spark.errors import ConfigError
from flinkish_spark.testing.tables_source import (
    changes_between, complete, drop_slot, read_all, source, start_streaming, without_markers,
)

MARK = "SECRET-7f3a"
RULES = json.dumps([{"tables": "public.m_u", "columns.exclude": ["password_hash", "ssn"]}])


def attnames(conn: psycopg.Connection) -> dict[str, list[str]]:
    rows = conn.execute("SELECT tablename, attnames FROM pg_publication_tables WHERE pubname = 'flinkish_multi'")
    return {str(t): list(a) for t, a in rows.fetchall()}


def raw_stream(conn: psycopg.Connection) -> bytes:
    rows = conn.execute("SELECT data FROM pg_logical_slot_peek_binary_changes('flinkish_multi', NULL, NULL, "
                        "'proto_version', '1', 'publication_names', 'flinkish_multi')").fetchall()
    return b"".join(bytes(r[0]) for r in rows)


def columns_of_schema_rows(rows: pa.Table, table: str = "public.m_u") -> list[list[str]]:
    return [[c["name"] for c in json.loads(r["row"])["columns"]]
            for r in rows.to_pylist() if r["_op"] == "s" and r["_table"] == table]


@pytest.mark.both_postgres  # 15: the first with column lists
def test_excluded_columns_are_never_read_sent_or_listed(pg_url: str, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_u (id int PRIMARY KEY, name text, password_hash text)")
        conn.execute("CREATE TABLE m_o (id int PRIMARY KEY, v text)")  # no rule: every column
        conn.execute(f"INSERT INTO m_u SELECT g, 'n' || g, '{MARK}' || g FROM generate_series(1, 3) g")
        conn.execute("INSERT INTO m_o VALUES (1, 'o')")
        src = source(pg_url, tmp_path, transforms=RULES)
        src.check_tables()
        enum = src.create_enumerator()
        assert isinstance(enum, TablesEnumerator)
        chunks = enum.discover(set())
        snapshot = read_all(src, chunks)
        assert MARK not in json.dumps(snapshot.to_pylist(), default=str)
        assert columns_of_schema_rows(snapshot) == [["id", "name"]]
        assert split_tables(without_markers(snapshot))["public.m_u"].rows.column("name").to_pylist() == ["n1", "n2", "n3"]
        assert attnames(conn) == {"m_u": ["id", "name"], "m_o": ["id", "v"]}
        complete(src, enum, 1, chunks)
        (changes,) = [s for s in enum.discover({s.split_id for s in chunks}) if s.split_id.startswith("changes-")]

        conn.execute(f"UPDATE m_u SET name = 'n1b', password_hash = '{MARK}u' WHERE id = 1")
        conn.execute(f"INSERT INTO m_u VALUES (4, 'n4', '{MARK}4')")
        conn.execute("DELETE FROM m_u WHERE id = 2")
        # A run of one table's changes long enough for the bulk decode paths (JSON and packed).
        conn.execute(f"INSERT INTO m_u SELECT g, 'n' || g, '{MARK}' || g FROM generate_series(100, 399) g")
        # A column added later that a rule leaves out: in no column list, and its default (a value the existing rows
        # take without row changes) snapshots nothing again -- the signature sees the kept columns only.
        conn.execute(f"ALTER TABLE m_u ADD COLUMN ssn text DEFAULT '{MARK}ssn'")
        conn.execute(f"INSERT INTO m_u VALUES (5, 'n5', '{MARK}5', '{MARK}ssn5')")
        tids = {e.name: e.tid for e in enum.registry.entries}
        assert enum.discover({changes.split_id}) == []
        assert {e.name: e.tid for e in enum.registry.entries} == tids  # not snapshotted again
        assert attnames(conn)["m_u"] == ["id", "name"]
        # A kept column added later: the next poll puts it in the column list and snapshots the table again (the
        # changes between lacked its values).
        conn.execute("ALTER TABLE m_u ADD COLUMN nick text")
        conn.execute(f"INSERT INTO m_u VALUES (6, 'n6', '{MARK}6', '{MARK}ssn6', 'nick6')")
        with caplog.at_level(logging.WARNING):
            assert enum.discover({changes.split_id}) == []  # planned once the changes before are committed
        assert "snapshotting public.m_u again" in caplog.text and "'nick' joined the publication's column list" in caplog.text
        assert attnames(conn)["m_u"] == ["id", "name", "nick"]
        conn.execute(f"UPDATE m_u SET nick = 'nick6b', password_hash = '{MARK}6b' WHERE id = 6")
        assert MARK.encode() not in raw_stream(conn)
        stream, end = changes_between(src, enum, changes, 0)
        packed, _ = changes_between(source(pg_url, tmp_path, transforms=RULES, rowFormat="arrow"), enum, changes, 0)
        packed_snapshot = read_all(source(pg_url, tmp_path, transforms=RULES, rowFormat="arrow"), chunks)
        complete(src, enum, 2, [], (SplitRecord(changes.split_id, 0, end),))
        again = enum.discover({changes.split_id})
        resnapshot = read_all(src, again)
        drop_slot(conn)
    assert {json.loads(c.payload or "{}")["table"] for c in again} == {"public.m_u"}
    for rows in (stream, resnapshot, packed, packed_snapshot):  # packed: typed Arrow IPC inside (uncompressed)
        assert rows.num_rows and MARK not in json.dumps(rows.to_pylist(), default=str)
    decode = PackedDecode()
    for batch in packed.to_batches():
        decode.add(batch)
    bulk = decode.result()["public.m_u"][1]  # typed rows, as a lakehouse sink's task gets them
    assert "password_hash" not in bulk.column_names and bulk.num_rows > 300
    assert columns_of_schema_rows(stream) == [["id", "name"], ["id", "name", "nick"]]
    assert [(r["_op"], r["row"]) for r in stream.to_pylist()
            if r["_table"] == "public.m_u" and r["_op"] != "s" and json.loads(r["row"])["id"] < 100] == [
        ("u", '{"id":1,"name":"n1b"}'), ("c", '{"id":4,"name":"n4"}'), ("d", '{"id":2}'), ("c", '{"id":5,"name":"n5"}'),
        ("c", '{"id":6,"name":"n6"}'), ("u", '{"id":6,"name":"n6","nick":"nick6b"}')]
    got = split_tables(without_markers(resnapshot))["public.m_u"].rows
    assert got.column_names[:3] == ["id", "name", "nick"] and "ssn" not in got.column_names
    assert sorted(zip(got.column("id").to_pylist(), got.column("nick").to_pylist()))[:5] == [
        (1, None), (3, None), (4, None), (5, None), (6, "nick6b")]


def test_where_no_column_list_can_keep_a_column_out_the_source_drops_it_at_decode(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A table with REPLICA IDENTITY FULL: a column list lacking a column would make PostgreSQL refuse the table's
    own updates and deletes, so it gets none; its excluded column leaves PostgreSQL, never the source's rows (as
    before PostgreSQL 15, and with a publication the user gave)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_full (id int PRIMARY KEY, name text, secret text)")
        conn.execute("ALTER TABLE m_full REPLICA IDENTITY FULL")
        conn.execute(f"INSERT INTO m_full VALUES (1, 'a', '{MARK}1'), (2, 'b', '{MARK}2')")
        rules = json.dumps([{"tables": "public.m_*", "columns.exclude": "secret"}])
        with caplog.at_level(logging.WARNING):
            enum, changes = start_streaming(source(pg_url, tmp_path, transforms=rules))
        assert "REPLICA IDENTITY FULL of public.m_full" in caplog.text and "drops them as it decodes" in caplog.text
        src = source(pg_url, tmp_path, transforms=rules)
        assert attnames(conn) == {"m_full": ["id", "name", "secret"]}  # no list: every column
        conn.execute(f"UPDATE m_full SET name = 'a2', secret = '{MARK}u' WHERE id = 1")  # not refused by the server
        conn.execute("DELETE FROM m_full WHERE id = 2")
        assert MARK.encode() in raw_stream(conn)  # it leaves PostgreSQL ...
        stream, _ = changes_between(src, enum, changes, 0)
        drop_slot(conn)
    assert MARK not in json.dumps(stream.to_pylist(), default=str)  # ... never the source task
    assert [(r["_op"], r["row"]) for r in stream.to_pylist() if r["_op"] != "s"] == [  # FULL: a changed row is d + u
        ("d", '{"id":1}'), ("u", '{"id":1,"name":"a2"}'), ("d", '{"id":2}')]
    assert columns_of_schema_rows(stream, "public.m_full") == [["id", "name"]]


def test_changes_shipped_as_messages_never_carry_a_column_left_out(pg_url: str, tmp_path: Path) -> None:
    """decodeIn=sink ships plain changes as their pgoutput messages (w packs): not those of a table whose messages
    carry a column its rules leave out (REPLICA IDENTITY FULL: no column list) -- they go the per-message way,
    which drops the column -- while the other tables' changes do go as messages."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_full (id int PRIMARY KEY, name text, secret text)")
        conn.execute("ALTER TABLE m_full REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE m_plain (id int PRIMARY KEY, v text)")
        rules = json.dumps([{"tables": "public.m_full", "columns.exclude": "secret"}])
        enum, changes = start_streaming(source(pg_url, tmp_path, transforms=rules))
        conn.execute("INSERT INTO m_plain SELECT g, 'v' || g FROM generate_series(1, 5) g")
        stream_options = {"transforms": rules, "rowFormat": "arrow", "decodeIn": "sink"}
        plain, _ = changes_between(source(pg_url, tmp_path, **stream_options), enum, changes, 0)
        conn.execute(f"INSERT INTO m_full VALUES (1, 'a', '{MARK}1'), (2, 'b', '{MARK}2')")  # plain changes ...
        conn.execute("DELETE FROM m_full WHERE id = 2")  # ... a delete of FULL identity carries the whole old row
        assert MARK.encode() in raw_stream(conn)
        shipped, _ = changes_between(source(pg_url, tmp_path, **stream_options), enum, changes, 0)
        drop_slot(conn)
    assert set(plain.column("_op").to_pylist()) == {"s", "w"}  # the shipped way, where nothing is left out
    assert MARK not in json.dumps(shipped.to_pylist(), default=str)
    assert set(shipped.column("_op").to_pylist()) == {"s", "j"}  # the read that holds m_full's: the per-message way
    decode = PackedDecode()
    for batch in shipped.to_batches():
        decode.add(batch)
    rows = decode.result()["public.m_full"][1]
    assert rows.column_names[:2] == ["id", "name"] and "secret" not in rows.column_names
    assert rows.column("_op").to_pylist() == ["c", "c", "d"]


def test_a_rule_leaving_out_a_key_is_refused_and_the_option_needs_tables(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_u (id int PRIMARY KEY, secret text)")
        no_key = json.dumps([{"tables": "public.m_u", "columns": ["secret"]}])
        with pytest.raises(ConfigError, match=r"public.m_u: .* leaves out its key column\(s\) id"):
            source(pg_url, tmp_path / "a", transforms=no_key).create_enumerator().discover(set())
        with pytest.raises(ConfigError, match="'transforms' applies to 'tables' only"):
            PostgresSourceDataSource({"uid": "one", "checkpoint": str(tmp_path / "b"), "url": pg_url,
                                      "table": "public.m_u", "transforms": no_key}).schema()
        drop_slot(conn)


def test_a_rule_dropped_on_a_restart_takes_the_column_list_away_and_snapshots_the_table_again(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_u (id int PRIMARY KEY, name text, password_hash text)")
        conn.execute(f"INSERT INTO m_u VALUES (1, 'a', '{MARK}1')")
        enum, changes = start_streaming(source(pg_url, tmp_path, transforms=RULES))
        assert attnames(conn) == {"m_u": ["id", "name"]}
        restarted = source(pg_url, tmp_path)  # the same uid and checkpoint, no rules any more
        again = restarted.create_enumerator()
        assert isinstance(again, TablesEnumerator)
        again.restore(enum.snapshot_state())  # from the last committed epoch's state
        with caplog.at_level(logging.WARNING):
            again.discover({changes.split_id})
        assert attnames(conn) == {"m_u": ["id", "name", "password_hash"]}  # the list is gone: every column
        assert "snapshotting public.m_u again" in caplog.text and "'password_hash' joined" in caplog.text
        drop_slot(conn)
