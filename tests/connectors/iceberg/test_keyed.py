"""Keyed modes of flinkish.iceberg (upsert / deletes / history, merge-on-read and copy-on-write) through
the sink's prepare and commit, read back with pyiceberg's scan and polars' own Iceberg reader."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.errors import ChangeDataError, ConfigError, TableMismatchError
from flinkish_spark.sink.protocol import PrepareContext

pyiceberg = pytest.importorskip("pyiceberg")

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def schema(extra: str = ""):
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField("id", LongType()), StructField("v", StringType()), StructField("_op", StringType()),
                       StructField("_lsn", LongType()), StructField("_commit_ts", TimestampType())])


def sink_at(tmp_path: Path, **kw):
    kw.setdefault("mode", "upsert")
    kw.setdefault("deletes", "true")
    from flinkish_spark.connectors.iceberg import IcebergSink

    return IcebergSink.at("db.t", uid="u", schema=schema(), checkpoint=str(tmp_path), key="id", **kw)


def batch(rows: list[tuple]) -> pa.RecordBatch:
    """rows of (id, v, op, lsn); _commit_ts = T0 + lsn seconds."""
    return pa.RecordBatch.from_pydict({
        "id": pa.array([r[0] for r in rows], pa.int64()), "v": [r[1] for r in rows], "_op": [r[2] for r in rows],
        "_lsn": pa.array([r[3] for r in rows], pa.int64()),
        "_commit_ts": pa.array([T0 + dt.timedelta(seconds=r[3] or 0) for r in rows], pa.timestamp("us", tz="UTC"))})


def epoch(sink, n: int, *tasks: list[tuple]) -> str:
    prepared = [sink.prepare(iter([batch(rows)]), PrepareContext("u", n, i, 0)) for i, rows in enumerate(tasks)]
    return sink.commit([p for p in prepared if p is not None], n)


def rows(sink, columns=("id", "v")) -> list[tuple]:
    import polars as pl

    table = sink.catalog().load_table("db.t")
    t = table.scan(selected_fields=columns).to_arrow()
    got = sorted(zip(*[t[c].to_pylist() for c in columns]), key=repr)
    native = pl.scan_iceberg(table, reader_override="native").collect()
    assert sorted(zip(*[native[c].to_list() for c in columns]), key=repr) == got
    return got


def test_upsert_last_change_wins_across_tasks_deletes_and_replays_change_nothing(tmp_path: Path) -> None:
    sink = sink_at(tmp_path)
    assert epoch(sink, 0, [(i, f"a{i}", "r", None) for i in range(1, 6)]) == "COMMITTED"
    assert rows(sink) == [(i, f"a{i}") for i in range(1, 6)]
    # two tasks: 2 updated twice (the higher _lsn wins, whichever task), 3 deleted, 4 deleted then
    # inserted again (ends inserted), 6 inserted, 7 inserted then deleted (never visible)
    assert epoch(sink, 1, [(2, "b2-late", "u", 11), (3, None, "d", 12), (4, None, "d", 13), (7, "x", "c", 14)],
                 [(2, "b2-early", "u", 10), (4, "b4", "c", 15), (6, "b6", "c", 16), (7, None, "d", 17)]) == "COMMITTED"
    expected = [(1, "a1"), (2, "b2-late"), (4, "b4"), (5, "a5"), (6, "b6")]
    assert rows(sink) == expected
    table = sink.catalog().load_table("db.t")
    assert [f.name for f in table.schema().fields] == ["id", "v"]  # change columns are not written
    assert table.metadata.format_version == 2 and table.properties["write.delete.mode"] == "merge-on-read"
    snap = table.current_snapshot()
    # the table's rows of 2, 3, 4, and the losing rows the tasks wrote themselves (2 "b2-early", 7 "x")
    assert snap.summary.operation.value == "overwrite" and snap.summary["added-position-deletes"] == "5"
    # a replay of epoch 1 (same or other committables) changes nothing
    assert epoch(sink, 1, [(2, "again", "u", 99)]) == "ALREADY_COMMITTED"
    # an epoch that changes nothing still commits its marker; its replay is recognised
    assert sink.commit([], 2) == "COMMITTED"
    table = sink.catalog().load_table("db.t")
    assert table.current_snapshot().summary.operation.value == "append"
    assert table.current_snapshot().summary["flinkish.epoch"] == "2"
    assert epoch(sink, 2, [(1, "late", "u", 1)]) == "ALREADY_COMMITTED"
    assert rows(sink) == expected and len(table.snapshots()) == 3
    # within a task, the same _lsn: the later row wins; null _lsn (snapshot rows) come first
    assert epoch(sink, 3, [(5, "c5-first", "u", 20), (5, "c5-second", "u", 20), (1, "c1", "u", 21), (1, "c1-snap", "r", None)]) == "COMMITTED"
    assert rows(sink) == [(1, "c1"), (2, "b2-late"), (4, "b4"), (5, "c5-second"), (6, "b6")]


def test_soft_deletes_and_ignored_deletes(tmp_path: Path) -> None:
    soft = sink_at(tmp_path / "soft", deletes="soft")
    assert epoch(soft, 0, [(1, "a", "c", 1), (2, "b", "c", 2)]) == "COMMITTED"
    assert epoch(soft, 1, [(1, None, "d", 3), (3, "c", "c", 4)]) == "COMMITTED"
    # the deleted key keeps its last known row (the table's, copied), marked deleted
    assert rows(soft, ("id", "v", "_deleted")) == [(1, "a", True), (2, "b", False), (3, "c", False)]
    assert epoch(soft, 2, [(1, "back", "c", 5)]) == "COMMITTED"
    assert rows(soft, ("id", "v", "_deleted")) == [(1, "back", False), (2, "b", False), (3, "c", False)]
    ignore = sink_at(tmp_path / "ignore", deletes="false")
    assert epoch(ignore, 0, [(1, "a", "c", 1), (2, "b", "c", 2)]) == "COMMITTED"
    assert epoch(ignore, 1, [(1, None, "d", 3), (2, "b2", "u", 4), (2, None, "d", 5)]) == "COMMITTED"
    assert rows(ignore) == [(1, "a"), (2, "b2")]


def test_history_keeps_every_version(tmp_path: Path) -> None:
    sink = sink_at(tmp_path, mode="history")
    assert epoch(sink, 0, [(1, "a", "c", 1), (2, "b", "c", 2)]) == "COMMITTED"
    assert epoch(sink, 1, [(1, "a2", "u", 3), (1, "a3", "u", 4), (2, None, "d", 5), (3, "c", "c", 6)]) == "COMMITTED"
    assert epoch(sink, 2, [(1, "a4", "u", 7), (2, "b-again", "c", 8)]) == "COMMITTED"
    t = lambda s: T0 + dt.timedelta(seconds=s)  # noqa: E731
    assert rows(sink, ("id", "v", "_valid_from", "_valid_to", "_current")) == sorted([
        (1, "a", t(1), t(3), False), (1, "a2", t(3), t(4), False), (1, "a3", t(4), t(7), False), (1, "a4", t(7), None, True),
        (2, "b", t(2), t(5), False), (2, "b-again", t(8), None, True), (3, "c", t(6), None, True)], key=repr)


def test_copy_on_write_rewrites_files_and_writes_no_delete_files(tmp_path: Path) -> None:
    sink = sink_at(tmp_path, merge_mode="copyOnWrite")
    assert epoch(sink, 0, [(i, "a", "r", None) for i in range(10)]) == "COMMITTED"
    assert epoch(sink, 1, [(3, "b", "u", 1), (4, None, "d", 2)]) == "COMMITTED"
    assert rows(sink) == sorted([(i, "a") for i in range(10) if i not in (3, 4)] + [(3, "b")])
    table = sink.catalog().load_table("db.t")
    assert table.properties["write.delete.mode"] == "copy-on-write"
    assert all(not t.delete_files for t in table.scan().plan_files())
    assert table.current_snapshot().summary["deleted-data-files"] == "1"


def test_a_concurrent_commit_makes_the_sink_look_up_again(tmp_path: Path, monkeypatch) -> None:
    """The sink's cached table is stale when another writer rewrote the data file that holds the keys
    (a compaction elsewhere): the commit is refused, the lookup runs again on the new snapshot, and
    no key ends up twice."""
    from flinkish_spark.connectors.iceberg.commit import Changes, commit_snapshot
    from flinkish_spark.connectors.iceberg.datafiles import to_data_file, write_data_files
    from flinkish_spark.connectors.iceberg.lookup import LiveFiles

    sink = sink_at(tmp_path)
    assert epoch(sink, 0, [(i, "a", "r", None) for i in range(5)]) == "COMMITTED"
    stale = sink.table(refresh=False)
    other = sink.catalog().load_table("db.t")  # another process rewrites the only data file
    (f,) = LiveFiles(other).data
    new = write_data_files(sink.io, sink.info, "other", iter([pa.RecordBatch.from_pydict(
        {"id": pa.array(range(5), pa.int64()), "v": ["a"] * 5})]), PrepareContext("other", 0, 0, 0), (), 100, 1 << 30)
    commit_snapshot(sink.catalog(), other, Changes(data_files=[to_data_file(x, 0) for x in new], rewrite=True,
                                                   removed={f.manifest: frozenset([f.path])}), 0, {})
    assert sink.table(refresh=False) is stale
    from flinkish_spark.connectors.iceberg import sink as sink_module

    looked_up = []
    plan = sink_module.plan_epoch
    monkeypatch.setattr(sink_module, "plan_epoch", lambda t, table, c, e: looked_up.append(
        table.current_snapshot().snapshot_id) or plan(t, table, c, e))
    assert epoch(sink, 1, [(2, "b", "u", 1), (3, None, "d", 2)]) == "COMMITTED"
    assert looked_up == [stale.current_snapshot().snapshot_id, other.current_snapshot().snapshot_id]
    assert rows(sink) == [(0, "a"), (1, "a"), (2, "b"), (4, "a")]
    table = sink.catalog().load_table("db.t")
    assert [s.summary.operation.value for s in table.snapshots()] == ["append", "replace", "overwrite"]


def test_errors_are_clear_and_write_nothing(tmp_path: Path, spark) -> None:
    from flinkish_spark.connectors.iceberg import IcebergSink

    with pytest.raises(ConfigError, match="mode 'upsert' needs a key, and the query's columns carry no primary key"):
        IcebergSink.at("db.t", uid="u", schema=schema(), checkpoint=str(tmp_path), mode="upsert")
    with pytest.raises(ConfigError, match=r"option 'key' names \['nope'\], which the query does not have"):
        IcebergSink.at("db.t", uid="u", schema=schema(), checkpoint=str(tmp_path), mode="upsert", key="nope")
    no_op = spark.createDataFrame([], "id long, v string").schema
    with pytest.raises(ConfigError, match="option deletes='true' needs a column '_op'"):
        IcebergSink.at("db.t", uid="u", schema=no_op, checkpoint=str(tmp_path), mode="upsert", key="id", deletes="true")
    with pytest.raises(ConfigError, match="option 'mergeMode' .*'mergeOnRead', 'copyOnWrite'|mergeMode"):
        IcebergSink.at("db.t", uid="u", schema=schema(), checkpoint=str(tmp_path), mode="upsert", key="id", merge_mode="x")
    sink = sink_at(tmp_path, mode="upsert")
    with pytest.raises(ChangeDataError, match=r"the column '_op' holds x; a change is one of r \(snapshot read\)"):
        sink.prepare(iter([batch([(1, "a", "x", 1)])]), PrepareContext("u", 0, 0, 0))
    with pytest.raises(ChangeDataError, match="1 row\\(s\\) have a null in the key column 'id'"):
        sink.prepare(iter([batch([(None, "a", "c", 1)])]), PrepareContext("u", 0, 0, 0))
    table = sink.catalog().load_table("db.t")
    assert table.snapshots() == [] and not Path(table.location().removeprefix("file://"), "data").exists()
    # the key's type cannot change under an existing table
    from pyspark.sql.types import StringType, StructField, StructType

    other_key = StructType([StructField("id", StringType()) if f.name == "id" else f for f in schema().fields])
    with pytest.raises(TableMismatchError, match="the key of the Iceberg table 'db.t' changed type: 'id' is long in "
                                                 "the table but string in the query"):
        IcebergSink.at("db.t", uid="u", schema=other_key, checkpoint=str(tmp_path), key="id", mode="upsert")
    # a version 1 table cannot take position deletes: one error that says how to upgrade
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    sink.catalog().create_table("db.v1", Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType())),
                                properties={"format-version": "1"})
    with pytest.raises(TableMismatchError, match="need an Iceberg table of format version 2.*upgrade_table_version"):
        IcebergSink.at("db.v1", uid="u", schema=schema(), checkpoint=str(tmp_path), key="id", mode="upsert")
    IcebergSink.at("db.v1", uid="u", schema=schema(), checkpoint=str(tmp_path), key="id", mode="upsert",
                   merge_mode="copyOnWrite")  # copy-on-write needs no delete files


def live_files(sink) -> tuple[int, int]:
    from flinkish_spark.connectors.iceberg.lookup import LiveFiles

    live = LiveFiles(sink.catalog().load_table("db.t"))
    return len(live.data), len(live.deletes)


def test_compact_every_rewrites_files_with_deletes_and_replays_still_change_nothing(tmp_path: Path) -> None:
    sink = sink_at(tmp_path, compact_every=2)
    assert epoch(sink, 0, [(i, "a", "r", None) for i in range(6)]) == "COMMITTED"
    assert live_files(sink)[1] == 0
    assert epoch(sink, 1, [(1, "b", "u", 1), (2, None, "d", 2)]) == "COMMITTED"  # then compaction
    expected = [(0, "a"), (1, "b"), (3, "a"), (4, "a"), (5, "a")]
    assert rows(sink) == expected and live_files(sink)[1] == 0
    table = sink.catalog().load_table("db.t")
    snap = table.current_snapshot()
    assert snap.summary.operation.value == "replace" and snap.summary["flinkish.compaction"] == "true"
    assert snap.summary["flinkish.epoch"] == "1" and snap.summary["removed-delete-files"] == "1"
    assert epoch(sink, 1, [(1, "again", "u", 9)]) == "ALREADY_COMMITTED"
    sink.cleanup(1, [])  # the compaction's files belong to the epoch: cleanup keeps them
    assert rows(sink) == expected
    assert epoch(sink, 2, [(3, "c", "u", 3)]) == "COMMITTED" and live_files(sink)[1] == 1  # not a compaction epoch


def test_a_compaction_racing_commits_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    """A compaction that planned before an epoch's commit landed is refused and plans again; and
    compactions in another thread racing ten epochs of commits leave exactly the expected rows."""
    import random
    import threading

    from flinkish_spark.connectors.iceberg import compact as compact_module

    sink = sink_at(tmp_path)
    assert epoch(sink, 0, [(i, "a0", "r", None) for i in range(50)]) == "COMMITTED"
    assert epoch(sink, 1, [(1, "a1", "u", 1)]) == "COMMITTED"
    stale = sink.catalog().load_table("db.t")
    assert epoch(sink, 2, [(2, "a2", "u", 2), (3, None, "d", 3)]) == "COMMITTED"  # lands first
    planned = []
    plan = compact_module.plan
    compact_module.plan = lambda t, table, e: planned.append(table.current_snapshot().snapshot_id) or plan(t, table, e)
    try:
        assert sink.compact(stale, 2)
    finally:
        compact_module.plan = plan
    assert len(planned) == 2 and planned[0] == stale.current_snapshot().snapshot_id
    state = {i: "a0" for i in range(50)}
    state.update({1: "a1", 2: "a2"})
    del state[3]
    assert rows(sink) == sorted(state.items(), key=repr) and live_files(sink)[1] == 0

    rng = random.Random(7)
    done = threading.Event()
    compactions = []

    def compactor() -> None:
        from flinkish_spark.connectors.iceberg import IcebergSink

        other = IcebergSink.at("db.t", uid="compactor", schema=schema(), checkpoint=str(tmp_path), key="id", mode="upsert",
                               deletes="true")
        while not done.is_set():
            compactions.append(other.compact(other.table(refresh=True), 0))
            time.sleep(0.01)

    import time
    thread = threading.Thread(target=compactor)
    thread.start()
    try:
        for n in range(3, 13):
            changes = []
            for lsn in range(10):
                k = rng.randrange(60)
                if rng.random() < 0.2:
                    changes.append((k, None, "d", n * 100 + lsn))
                    state.pop(k, None)
                else:
                    changes.append((k, f"e{n}-{lsn}", "u", n * 100 + lsn))
                    state[k] = f"e{n}-{lsn}"
            assert epoch(sink, n, changes[:5], changes[5:]) == "COMMITTED"
    finally:
        done.set()
        thread.join()
    assert rows(sink) == sorted(state.items(), key=repr)
    assert compactions and any(compactions)


def test_a_table_dropped_and_created_again_is_not_answered_from_the_process_cache(tmp_path: Path) -> None:
    """Spark reuses the driver's Python workers across queries: the commit worker of a second query
    (a new checkpoint, epochs from 0 again) remembers the first query's table. After the table was
    dropped and created again, its epochs must land in the new table, not be called committed."""
    from flinkish_spark.connectors.iceberg import IcebergSink

    first = sink_at(tmp_path)
    for n in range(3):
        assert epoch(first, n, [(n, f"old{n}", "c", 10 + n)]) == "COMMITTED"
    catalog = first.catalog()
    catalog.drop_table("db.t")
    # The second query's driver creates the table (another process: this one's cache is not told).
    fresh = catalog.create_table("db.t", schema=_iceberg_schema(first), properties={"format-version": "2"})
    from flinkish_spark.connectors.iceberg.table import info_of

    second = IcebergSink(first.catalog_properties, "db.t", "u", schema(), (), first.io, info_of(fresh), plan=first.plan)
    assert epoch(second, 0, [(7, "new", "c", 1)]) == "COMMITTED"
    assert rows(second) == [(7, "new")]


def _iceberg_schema(sink):
    from flinkish_spark.connectors.iceberg.schema import iceberg_schema, keyed_table_schema

    return iceberg_schema(keyed_table_schema(sink.spark_schema, sink.plan.table_schema.names))


def test_large_entries_travel_in_a_file_that_a_restart_reads_and_cleanup_removes(tmp_path: Path, monkeypatch) -> None:
    """Above the threshold (here: always) a task's key entries are a file of the epoch's folder; the (pickled)
    committable names it; a restart's commit of the decided committables reads it; a lost attempt's file and,
    once the epoch is done, the decided one are removed. A committable pickled before the entries files (no
    attribute) reads as inline."""
    import pickle

    from flinkish_spark.connectors.lakehouse import entries_file

    monkeypatch.setattr(entries_file, "INLINE_MAX_BYTES", 0)
    sink = sink_at(tmp_path)
    data = [(i, f"a{i}", "c", 1) for i in range(1, 30)]
    lost = sink.prepare(iter([batch(data)]), PrepareContext("u", 0, 0, 0))  # killed before it was sent
    decided = sink.prepare(iter([batch(data)]), PrepareContext("u", 0, 0, 1))
    assert decided.entries == b"" and decided.entries_file.path != lost.entries_file.path
    files = lambda: sorted(tmp_path.rglob(f"*{entries_file.SUFFIX}"))  # noqa: E731
    assert len(files()) == 2
    record = pickle.dumps(decided)
    assert len(record) < 4096
    assert sink.commit([pickle.loads(record)], 0) == "COMMITTED"
    assert sink.commit([pickle.loads(record)], 0) == "ALREADY_COMMITTED"  # a restart before the done marker
    sink.cleanup(0, [pickle.loads(record)])
    assert files() == [] and rows(sink) == sorted(((i, f"a{i}") for i in range(1, 30)), key=repr)
    monkeypatch.setattr(entries_file, "INLINE_MAX_BYTES", 1 << 20)
    old = sink.prepare(iter([batch([(1, "b1", "u", 2)])]), PrepareContext("u", 1, 0, 0))
    del old.__dict__["entries_file"]  # as unpickled from a version before the entries files
    assert old.entries_file is None and sink.commit([pickle.loads(pickle.dumps(old))], 1) == "COMMITTED"
    assert rows(sink)[0] == (1, "b1")
