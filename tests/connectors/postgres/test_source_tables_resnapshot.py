"""``flinkish.postgres`` with ``tables``: one table snapshotted again while the others keep flowing.

The enumerator and reader on a real server, without a Spark query (the mirrors into Delta,
Iceberg and PostgreSQL through the same statements: tests/connectors/*/test_routed_mirror.py):
``TablesEnumerator.resnapshot`` (a new tid, joining, the chunks bracketed by ``B``/``E``,
planned only once no change from before is left unread, the old tid's chunks ending unread);
the statements that change rows without WAL row changes and so re-snapshot the table by
themselves (``ADD COLUMN ... DEFAULT``, a rewrite, ``RENAME COLUMN``, a partition detached,
dropped or truncated) and those that do not (a nullable ``ADD COLUMN``, ``DROP COLUMN``); a
table dropped and created again under the same name; generated columns, never mirrored.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.checkpoint.model import SplitRecord
from flinkish_spark.connectors.postgres.rows import split_tables
from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.postgres.source.tables_enumerator import TablesEnumerator
from flinkish_spark.source.split import Split, SplitExtent

from flinkish_spark.testing.tables_source import (
    changes_between, complete, drop_slot, read_all, source, start_streaming, without_markers,
)


def oid(conn: psycopg.Connection, table: str) -> int:
    return int(conn.execute("SELECT %s::regclass::oid", (table,)).fetchone()[0])


def ops(rows: list[dict], table: str) -> list[str]:
    return [r["_op"] for r in rows if r["_table"] == table and r["_op"] != "r"]


def catch_up(src, enum: TablesEnumerator, changes: Split, start: int, ckpt_id: int) -> int:
    """One epoch of changes read and committed (the slot advanced past them); returns the new position."""
    _, end = changes_between(src, enum, changes, start)
    complete(src, enum, ckpt_id, [], (SplitRecord(changes.split_id, start, end),))
    return end


def test_one_table_is_snapshotted_again_under_a_new_tid_between_markers_while_the_other_flows(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE m_b (id int PRIMARY KEY)")
        conn.execute("INSERT INTO m_a SELECT g, 'a' FROM generate_series(1, 25) g")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        old = {e.name: e.tid for e in enum.registry.entries}
        # A chunk of a snapshot of m_a still unread when it is snapshotted again (planned in an earlier epoch).
        stale = Split(f"snapshot-0-t{old['public.m_a']}-00000", json.dumps({"tid": old["public.m_a"]}))
        conn.execute("UPDATE m_a SET v = 'before' WHERE id = 1")
        with caplog.at_level(logging.WARNING):
            (entry,) = enum.resnapshot(conn, [oid(conn, "m_a")], "asked for by the test")
        assert "public.m_a again" in caplog.text and "asked for by the test" in caplog.text
        assert entry.tid not in old.values() and entry.state == "joining" and entry.after_lsn is not None
        saved = registry.read(src.io, enum.directory, enum.registry_name or "")
        assert [(e.name, e.state, e.reason) for e in saved.entries] == [
            ("public.m_b", "streaming", None), ("public.m_a", "joining", "asked for by the test")]
        conn.execute("INSERT INTO m_b VALUES (1)")
        # The update of m_a before the request is not read yet: no chunk until it is in a committed epoch
        # (applied after the chunk's rows, its old values would win).
        assert enum.discover({changes.split_id}) == []
        assert enum.extent(stale, 0) == SplitExtent(0, 0)  # the superseded chunk ends unread
        assert not enum.drain_ready() and not enum.drain_ready()  # a drain now would leave m_a wrong: it waits
        position = catch_up(src, enum, changes, 0, 2)
        chunks = enum.discover({changes.split_id})
        assert enum.drain_ready()  # planned: the drain epoch reads what is left of them
        assert {json.loads(c.payload or "{}")["tid"] for c in chunks} == {entry.tid} and len(chunks) == 3
        assert all(json.loads(c.payload or "{}")["resnapshot"] for c in chunks)
        conn.execute("INSERT INTO m_b VALUES (2)")  # the other table keeps flowing
        stream, _ = changes_between(src, enum, changes, position)
        rows = read_all(src, chunks).to_pylist()
        complete(src, enum, 3, chunks, (SplitRecord(changes.split_id, position, position),))
        assert [(e.name, e.state) for e in enum.registry.entries] == [("public.m_b", "streaming"), ("public.m_a", "streaming")]
        drop_slot(conn)
    assert ops(rows, "public.m_a") == ["s", "B", "s", "s", "E"]
    assert len([r for r in rows if r["_op"] == "r"]) == 25
    assert [json.loads(r["row"]) for r in stream.to_pylist() if r["_op"] == "c"] == [{"id": 2}]


@pytest.mark.both_postgres
def test_statements_that_change_rows_without_row_changes_snapshot_the_table_again(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for t in ("m_default", "m_type", "m_rename", "m_nullable", "m_drop", "m_quiet"):
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int, w text)")
            conn.execute(f"INSERT INTO {t} SELECT g, g, 'w' FROM generate_series(1, 5) g")
        conn.execute("CREATE TABLE m_parts (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
        for p, lo in (("p_parts_1", 0), ("p_parts_2", 10), ("p_parts_3", 20)):
            conn.execute(f"CREATE TABLE {p} PARTITION OF m_parts FOR VALUES FROM ({lo}) TO ({lo + 10})")
        conn.execute("INSERT INTO m_parts SELECT g, g FROM generate_series(0, 29) g")
        conn.execute("CREATE TABLE m_pdefault (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE p_pdefault PARTITION OF m_pdefault FOR VALUES FROM (0) TO (100)")
        conn.execute("INSERT INTO m_pdefault SELECT g, g FROM generate_series(1, 5) g")
        src = source(pg_url, tmp_path, tables="public.m_*")
        enum, changes = start_streaming(src)
        tids = {e.name: e.tid for e in enum.registry.entries}
        assert all(e.signature is not None for e in enum.registry.entries)
        conn.execute("ALTER TABLE m_default ADD COLUMN d int NOT NULL DEFAULT 7")  # catalog only: no row change
        conn.execute("ALTER TABLE m_pdefault ADD COLUMN d int DEFAULT 3")  # the missing value is in its partition
        conn.execute("ALTER TABLE m_type ALTER COLUMN v TYPE bigint USING v * 1000")  # a rewrite, not decoded
        conn.execute("ALTER TABLE m_rename RENAME COLUMN w TO w2")
        conn.execute("ALTER TABLE m_nullable ADD COLUMN extra int")  # the Relation message carries it
        conn.execute("ALTER TABLE m_drop DROP COLUMN w")
        conn.execute("ALTER TABLE m_parts DETACH PARTITION p_parts_1")
        conn.execute("DROP TABLE p_parts_2")
        # No row change before them is left unread: the chunks are planned at once.
        chunks = enum.discover({changes.split_id})
        again = {e.name: e for e in enum.registry.entries if e.tid != tids.get(e.name)}
        assert sorted(again) == ["public.m_default", "public.m_parts", "public.m_pdefault", "public.m_rename", "public.m_type"]
        assert "renamed to 'w2'" in (again["public.m_rename"].reason or "")
        assert "detached or dropped" in (again["public.m_parts"].reason or "")
        position = catch_up(src, enum, changes, 0, 2)
        read = read_all(src, chunks)
        rows = read.to_pylist()
        complete(src, enum, 3, chunks, (SplitRecord(changes.split_id, position, position),))
        conn.execute("TRUNCATE p_parts_3")  # under publish_via_partition_root: skipped by pgoutput
        enum._discovered_at = -math.inf
        truncated = enum.discover({changes.split_id})
        (parts,) = [e for e in enum.registry.entries if e.name == "public.m_parts"]
        assert "truncated" in (parts.reason or "") and {json.loads(c.payload or "{}")["tid"] for c in truncated} == {parts.tid}
        enum._discovered_at = -math.inf
        enum.discover({changes.split_id})
        assert {e.name: e.tid for e in enum.registry.entries}["public.m_quiet"] == tids["public.m_quiet"]
        drop_slot(conn)
    tables = split_tables(without_markers(read))
    assert tables["public.m_default"].rows.column("d").to_pylist() == [7] * 5
    assert tables["public.m_pdefault"].rows.column("d").to_pylist() == [3] * 5
    assert tables["public.m_type"].rows.column("v").to_pylist() == [1000, 2000, 3000, 4000, 5000]
    assert tables["public.m_rename"].rows.column("w2").to_pylist() == ["w"] * 5
    assert sorted(tables["public.m_parts"].rows.column("id").to_pylist()) == list(range(20, 30))
    for t in ("public.m_default", "public.m_type", "public.m_rename", "public.m_parts"):
        assert ops(rows, t)[:2] == ["s", "B"] and ops(rows, t)[-1] == "E", t



@pytest.mark.both_postgres
def test_generated_columns_are_left_out_of_snapshots_and_changes_never_null(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        pg18 = conn.info.server_version >= 180000
        conn.execute("CREATE TABLE m_g (id int PRIMARY KEY, v int, g int GENERATED ALWAYS AS (v * 2) STORED"
                     + (", g2 int GENERATED ALWAYS AS (v * 3) VIRTUAL)" if pg18 else ")"))
        conn.execute("INSERT INTO m_g (id, v) VALUES (1, 1)")
        # On 18 a publication may send stored generated columns: one given with that option must change nothing.
        publications = [None, "mine"] if pg18 else [None]
        if pg18:
            conn.execute("CREATE PUBLICATION mine FOR TABLE m_g WITH (publish_generated_columns = stored)")
        for n, publication in enumerate(publications):
            options = {"uid": f"g{n}", "checkpoint": str(tmp_path / f"meta{n}")} | (
                {"publication": publication} if publication else {})
            src = source(pg_url, tmp_path, **options)
            enum = src.create_enumerator()
            assert isinstance(enum, TablesEnumerator)
            chunks = enum.discover(set())
            snapshot = read_all(src, chunks)
            complete(src, enum, 1, chunks)
            (changes,) = [s for s in enum.discover({c.split_id for c in chunks}) if s.split_id.startswith("changes-")]
            conn.execute(f"INSERT INTO m_g (id, v) VALUES ({10 + n}, 2)")
            conn.execute("UPDATE m_g SET v = v + 1 WHERE id = 1")
            stream, _ = changes_between(src, enum, changes, 0)
            conn.execute(f"SELECT pg_drop_replication_slot('flinkish_g{n}')")
            rows = snapshot.to_pylist() + stream.to_pylist()
            assert len({r["_schema_id"] for r in rows}) == 1, publication  # one schema: snapshot and changes alike
            assert {tuple(json.loads(r["row"])) for r in rows if r["_op"] in ("r", "c", "u")} == {("id", "v")}, publication
            assert len([r for r in rows if r["_op"] in ("c", "u")]) == 2


def test_a_table_dropped_and_created_again_under_its_name_replaces_the_old_one_after_its_last_changes(
        pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_s (id int PRIMARY KEY, v int)")
        conn.execute("INSERT INTO m_s SELECT g, g FROM generate_series(1, 5) g")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        (old,) = enum.registry.entries
        conn.execute("DELETE FROM m_s WHERE id = 4")  # a change of the old table, under the same name
        conn.execute("DROP TABLE m_s; CREATE TABLE m_s (id int PRIMARY KEY, v int); "
                     "INSERT INTO m_s SELECT g, -g FROM generate_series(3, 7) g")
        # Joined, but the old table's delete is not read yet: in the chunk's epoch it would come after the
        # chunk's rows and delete the new table's row 4.
        assert enum.discover({changes.split_id}) == []
        (new,) = enum.registry.entries
        assert (new.oid, new.state) != (old.oid, "streaming") and new.tid != old.tid
        position = catch_up(src, enum, changes, 0, 2)
        chunks = enum.discover({changes.split_id})
        rows = read_all(src, chunks).to_pylist()
        complete(src, enum, 3, chunks, (SplitRecord(changes.split_id, position, position),))
        drop_slot(conn)
    # Bracketed: a keyed sink deletes the old table's keys 1 and 2, which the new one lacks.
    assert ops(rows, "public.m_s") == ["s", "B", "E"]
    assert sorted(json.loads(r["row"])["id"] for r in rows if r["_op"] == "r") == [3, 4, 5, 6, 7]


def test_a_registry_written_before_signatures_loads_and_records_them_at_the_next_poll(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        body = json.loads(enum.registry.to_json())
        for t in body["tables"]:
            del t["signature"]  # as written before this version
        name = registry.write(src.io, enum.directory, registry.Registry.from_json(json.dumps(body).encode()))
        state = json.loads(enum.snapshot_state()) | {"registry": name}
        again = src.create_enumerator()
        assert isinstance(again, TablesEnumerator)
        again.restore(json.dumps(state).encode())
        assert [e.signature for e in again.registry.entries] == [None]
        assert again.discover({changes.split_id}) == []
        (entry,) = again.registry.entries
        assert entry.tid == enum.registry.entries[0].tid and entry.signature == enum.registry.entries[0].signature
        drop_slot(conn)


def test_a_resnapshot_request_renews_the_table_once_is_recorded_in_the_state_and_deleted_when_committed(
        pg_url: str, tmp_path: Path) -> None:
    """``flinkish mirror resnapshot`` end to end below Spark: the request file is taken by the next planning
    (its table joins again and gets bracketed chunks), taken again after a crash before Spark logged that
    planning, never after its checkpoint, and deleted once that checkpoint is complete."""
    from flinkish_spark.connectors.cdc import resnapshot_request as rr

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE m_b (id int PRIMARY KEY)")
        conn.execute("INSERT INTO m_b SELECT generate_series(1, 7)")
        src = source(pg_url, tmp_path)
        enum, changes = start_streaming(src)
        before = {e.name: e.tid for e in enum.registry.entries}
        req = rr.write_request(src.io, enum.directory, ["public.m_b"], "test")
        assert len(src.io.list_names(rr.folder(enum.directory))) == 1

        chunks = enum.discover({changes.split_id})  # nothing of ours unread: planned in the same planning
        taken_state = enum.snapshot_state()
        renewed = {e.name: e for e in enum.registry.entries}["public.m_b"]
        assert renewed.tid != before["public.m_b"] and f"request {req.id}" in (renewed.reason or "")
        assert rr.handled_of_state(taken_state) == {req.id}
        assert chunks and {json.loads(c.payload or "{}")["tid"] for c in chunks} == {renewed.tid}
        assert all(json.loads(c.payload or "{}")["resnapshot"] for c in chunks)
        assert enum.discover({changes.split_id} | {c.split_id for c in chunks}) == [], "taken once"

        restarted = src.create_enumerator()  # a crash before Spark logged that epoch: the state before it
        restarted.restore(json.dumps({k: v for k, v in json.loads(taken_state).items()
                                      if k not in (rr.STATE_KEY, "registry", "previous_registry")}
                                     | {"registry": json.loads(taken_state)["previous_registry"]}).encode())
        again = restarted.discover({changes.split_id})
        assert again and rr.handled_of_state(restarted.snapshot_state()) == {req.id}, "taken again"

        rows = read_all(src, chunks).to_pylist()
        complete(src, enum, 7, chunks, (SplitRecord(changes.split_id, 0, 0),))  # the epoch that took it commits
        assert src.io.list_names(rr.folder(enum.directory)) == []
        enum.discover({changes.split_id})
        assert rr.STATE_KEY not in json.loads(enum.snapshot_state())
        drop_slot(conn)
    assert ops(rows, "public.m_b") == ["s", "B", "E"] and len([r for r in rows if r["_op"] == "r"]) == 7


def test_a_replayed_range_of_a_lost_slot_fails_or_is_read_as_nothing_and_a_new_generation_follows(
        pg_url: str, tmp_path: Path) -> None:
    """A run ends with an epoch of changes planned and not committed; the slot is lost meanwhile (dropped here;
    invalidated by max_slot_wal_keep_size alike). The replay of that epoch cannot read its changes again: under
    ``onSlotLost=fail`` it is the clear error; under ``resnapshot`` it reads nothing (the new generation, B/E of
    every table, makes each target equal its table whatever the lost range held -- docs/postgres-source.md) and
    the planning after it starts generation 1. Before: the replay failed under both, so a ``resnapshot`` source
    could never get past it."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO m_a SELECT g, 'a' FROM generate_series(1, 5) g")
        src = source(pg_url, tmp_path, onSlotLost="resnapshot")
        enum, changes = start_streaming(src)
        conn.execute("UPDATE m_a SET v = 'lost' WHERE id = 1")
        end = enum.extent(changes, 0).available
        assert end > 0
        drop_slot(conn)  # the epoch [0, end) is planned (Spark's offset log), not committed

        failing = source(pg_url, tmp_path)  # onSlotLost=fail
        with pytest.raises(Exception, match="onSlotLost=resnapshot"):
            list(failing.create_reader(None).read(changes, 0, end))  # type: ignore[arg-type]

        assert list(src.create_reader(None).read(changes, 0, end)) == []  # type: ignore[arg-type]
        complete(src, enum, 2, [], (SplitRecord(changes.split_id, 0, end),))
        new = enum.discover({changes.split_id})
        assert enum.generation == 1
        chunks = [s for s in new if s.split_id.startswith("snapshot-1-")]
        assert chunks and all(json.loads(c.payload or "{}").get("resnapshot") for c in chunks), [s.split_id for s in new]
        rows = without_markers(read_all(src, chunks)).to_pylist()
        assert {r["row"] for r in rows if r["_op"] == "r"} and any('"lost"' in r["row"] for r in rows), rows


def test_the_single_table_source_reads_a_lost_slots_replayed_range_as_nothing_under_resnapshot(
        pg_url: str, tmp_path: Path) -> None:
    """The same replay for ``table`` (one table, its own reader): the clear error under ``fail``, nothing under
    ``resnapshot`` and then generation 1."""
    from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource

    def single(**extra: str) -> PostgresSourceDataSource:
        src = PostgresSourceDataSource({"uid": "single", "checkpoint": str(tmp_path / "meta"), "url": pg_url,
                                        "table": "public.m_s", "splitSize": "10", **extra})
        src.setup_source()
        return src

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_s (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO m_s SELECT g, 'a' FROM generate_series(1, 5) g")
        src = single(onSlotLost="resnapshot")
        enum = src.create_enumerator()
        chunks = enum.discover(set())
        complete(src, enum, 1, chunks)
        (changes,) = [s for s in enum.discover({s.split_id for s in chunks}) if s.split_id.startswith("changes-")]
        conn.execute("UPDATE m_s SET v = 'lost' WHERE id = 1")
        end = enum.extent(changes, 0).available
        assert end > 0
        conn.execute("SELECT pg_drop_replication_slot('flinkish_single')")

        with pytest.raises(Exception, match="onSlotLost=resnapshot"):
            list(single().create_reader(src.schema()).read(changes, 0, end))
        assert list(src.create_reader(src.schema()).read(changes, 0, end)) == []
        complete(src, enum, 2, [], (SplitRecord(changes.split_id, 0, end),))
        new = enum.discover({changes.split_id})
        assert [s for s in new if s.split_id.startswith("snapshot-1-")], [s.split_id for s in new]
