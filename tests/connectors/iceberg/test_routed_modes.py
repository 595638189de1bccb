"""flinkish.iceberg routed targets in their table's mode (``mode`` / ``deletes`` / ``tableModes``), in process (no
Spark): the Delta tests' cases (tests/connectors/delta/test_routed_modes.py) on Iceberg targets, read back with
pyiceberg's scan."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes
from flinkish_spark.errors import SchemaChangeError
from flinkish_spark.testing.changes import Model, normalized, random_epochs
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

from tests.connectors.delta.test_routed_modes import COLUMNS, PARTITIONED, SHAPES, TRACKED, all_modes, feed, modes, tracked_toast_case, tracked_truncate_case, ts
from tests.connectors.iceberg.test_routed import Mirror

pytest.importorskip("pyiceberg")


def rows(m: Mirror, table: str) -> list[dict]:
    return normalized(m.table(table).scan().to_arrow().to_pylist())


@pytest.mark.parametrize("merge_mode, compact_every", [("mergeOnRead", 2), ("copyOnWrite", 0)])
def test_each_table_is_applied_in_its_mode_as_the_reference_model(tmp_path: Path, merge_mode: str,
                                                                  compact_every: int) -> None:
    """The Delta test's tables, and two partitioned by a rule's partitionBy, compacted with compactEvery (position
    deletes and small files merged per partition)."""
    from flinkish_spark.connectors.iceberg.routed_target import partitioning

    schemas = {t: table_schema(t, COLUMNS, ("id",)) for t in [*SHAPES, *TRACKED, *PARTITIONED]}
    m = Mirror(tmp_path, merge_mode=merge_mode, modes=all_modes(), compact_every=compact_every)
    models = {t: Model(*shape) for t, shape in {**SHAPES, **PARTITIONED}.items()}
    models.update({t: Model("history", "true", ("n",)) for t in TRACKED})  # a change of 'v' alone: in place
    s = StreamBuilder()
    for epoch in random_epochs(seed=11, epochs=5, keys=10, per_epoch=20, tasks=1):
        changes = feed(s, schemas, epoch)
        m.epoch(s.batch())
        for t, model in models.items():
            model.apply(changes)
            assert rows(m, t) == model.table(), t
    for t in PARTITIONED:
        table = m.table(t)
        assert partitioning(table) == ("n",)
        files = [task.file for task in table.scan().plan_files()]
        assert {f.partition[0] for f in files} == {r["n"] for r in rows(m, t)}  # the files' partitions: the rows' n
        compacted = any(s.summary is not None and s.summary.additional_properties.get("flinkish.compaction") == "true"
                        for s in table.snapshots())
        assert compacted == (compact_every > 0), t


def test_a_partitioned_target_is_never_repartitioned_and_a_partition_column_must_exist(tmp_path: Path) -> None:
    from flinkish_spark.errors import ConfigError, TableMismatchError

    t = table_schema("public.up", COLUMNS, ("id",))
    s = StreamBuilder()
    s.snapshot(t, [{"id": 1, "v": "a", "n": 1}])
    Mirror(tmp_path).epoch(s.batch())  # created unpartitioned
    m = Mirror(tmp_path, modes=all_modes())
    m.epochs = 1
    snapshot = m.table("public.up").current_snapshot().snapshot_id
    s.transaction((t, "u", {"id": 1, "v": "b", "n": 1}))
    with pytest.raises(TableMismatchError, match=r"the Iceberg table 'mirror.public_up' is unpartitioned, but the sink's "
                                                 r"tableModes give source table public.up partitionBy n; nothing was "
                                                 r"written.*never changes a target's partitioning"):
        m.epoch(s.batch())
    assert m.table("public.up").current_snapshot().snapshot_id == snapshot
    wrong = parse_table_modes({"tableModes": '[{"tables": "public.x", "partitionBy": "day"}]'}.get, "test")
    s.snapshot(table_schema("public.x", COLUMNS, ("id",)), [{"id": 1, "v": "a", "n": 1}])
    with pytest.raises(ConfigError, match=r"source table public.x: the tableModes rule's partitionBy names 'day', which "
                                          r"the table does not have \(its columns: id, v, n"):
        Mirror(tmp_path / "x", modes=wrong).epoch(s.batch())


@pytest.mark.parametrize("table, mode", [("public.h", "history"), ("public.s", "upsert")])
def test_an_unchanged_toast_value_is_taken_from_the_tables_current_row(tmp_path: Path, table: str, mode: str) -> None:
    from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD

    d = table_schema(table, [("id", "int"), ("n", "int"), ("body", "text")], ("id",))
    m = Mirror(tmp_path, modes=modes())
    s = StreamBuilder()
    s.snapshot(d, [{"id": 1, "n": 0, "body": "one"}])
    m.epoch(s.batch())
    s.transaction((d, "u", {"id": 1, "n": 1, UNCHANGED_FIELD: ["body"]}))
    m.epoch(s.batch())
    got = sorted((r["id"], r["n"], r["body"]) for r in rows(m, table))
    assert got == ([(1, 0, "one"), (1, 1, "one")] if mode == "history" else [(1, 1, "one")])


@pytest.mark.parametrize("merge_mode", ["mergeOnRead", "copyOnWrite"])
def test_history_tracking_columns_updates_the_current_version_in_place_for_untracked_changes(
        tmp_path: Path, merge_mode: str) -> None:
    tracked_toast_case(Mirror(tmp_path, merge_mode=merge_mode, modes=modes()), rows)


def test_history_tracking_columns_does_not_update_a_version_a_truncate_closed(tmp_path: Path) -> None:
    tracked_truncate_case(Mirror(tmp_path, modes=modes()), rows)


@pytest.mark.parametrize("merge_mode", ["mergeOnRead", "copyOnWrite"])
def test_a_truncate_and_a_resnapshot_end_mark_close_or_keep_rows_by_mode(tmp_path: Path, merge_mode: str) -> None:
    schemas = {t: table_schema(t, COLUMNS, ("id",)) for t in ("public.h", "public.s", "public.f")}
    m = Mirror(tmp_path, merge_mode=merge_mode, modes=modes())
    s = StreamBuilder()
    for schema in schemas.values():
        s.snapshot(schema, [{"id": i, "v": f"s{i}", "n": 1} for i in (1, 2, 3)])
    m.epoch(s.batch())
    for schema in schemas.values():  # a re-snapshot without key 3, key 2 changed
        s.marker(schema, "B").snapshot(schema, [{"id": 1, "v": "s1", "n": 1}, {"id": 2, "v": "r2", "n": 1}])
        s.marker(schema, "E")
    m.epoch(s.batch())
    h = rows(m, "public.h")  # key 3 closed at the commit's time: no change in the epoch
    assert sorted((r["id"], r["v"], r["_current"]) for r in h) == [
        (1, "s1", True), (2, "r2", True), (2, "s2", False), (3, "s3", False)]
    ended = [r["_valid_to"] for r in h if r["id"] == 3][0]
    assert ended is not None
    s.transaction(*[(schema, "c", {"id": 4, "v": "pre", "n": 1}) for schema in schemas.values()])
    s.transaction(*[(schema, "t", None) for schema in schemas.values()])
    truncated = ts(s.lsn)
    m.epoch(s.batch())
    assert sorted((r["id"], r["v"], r["_deleted"]) for r in rows(m, "public.s")) == [
        (1, "s1", True), (2, "r2", True), (3, "s3", True), (4, "pre", True)]
    assert sorted((r["id"], r["v"]) for r in rows(m, "public.f")) == [(1, "s1"), (2, "r2"), (3, "s3"), (4, "pre")]
    h = rows(m, "public.h")
    assert not [r for r in h if r["_current"]]
    assert sorted((r["id"], r["v"], r["_valid_to"]) for r in h if r["_valid_to"] == truncated) == [
        (1, "s1", truncated), (2, "r2", truncated), (4, "pre", truncated)]


def test_a_target_written_in_another_mode_is_refused_naming_the_table(tmp_path: Path) -> None:
    a = table_schema("public.a", COLUMNS, ("id",))
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "v": "x", "n": 1}])
    Mirror(tmp_path, modes=parse_table_modes({"deletes": "soft"}.get, "test")).epoch(s.batch())
    m = Mirror(tmp_path)
    m.epochs = 1
    s.transaction((a, "u", {"id": 1, "v": "y", "n": 2}))
    with pytest.raises(SchemaChangeError, match=r"source table public.a: the Iceberg table mirror.public_a was "
                                                r"written in another mode \(upsert with deletes soft"):
        m.epoch(s.batch())
    assert [(r["v"], r["_deleted"]) for r in rows(m, "public.a")] == [("x", False)]


def test_a_history_target_keeps_its_columns_through_schema_evolution(tmp_path: Path) -> None:
    a1 = table_schema("public.h", [("id", "int"), ("v", "text")], ("id",))
    a2 = table_schema("public.h", [("id", "int"), ("v", "text"), ("w", "int")], ("id",))
    m = Mirror(tmp_path, modes=modes(), compact_every=1)  # compacts the file written before 'w' came
    s = StreamBuilder()
    s.snapshot(a1, [{"id": 1, "v": "x"}])
    m.epoch(s.batch())
    s.transaction((a2, "u", {"id": 1, "v": "y", "w": 5}))
    m.epoch(s.batch())
    assert [f.name for f in m.table("public.h").schema().fields] == ["id", "v", "_valid_from", "_valid_to", "_current", "w"]
    assert sorted((r["v"], r["w"], r["_current"]) for r in m.rows("public.h", "v")) == [("x", None, False), ("y", 5, True)]
    assert any(sn.summary.additional_properties.get("flinkish.compaction") == "true"
               for sn in m.table("public.h").snapshots())


def test_history_tracking_over_three_tasks_per_epoch_equals_the_reference_model(tmp_path: Path) -> None:
    """The Delta case (a version absorbed across tasks) on Iceberg, position deletes and copies."""
    from tests.connectors.postgres.test_routed_modes import tasks

    m = Mirror(tmp_path, modes=parse_table_modes({"mode": "history", "trackHistoryColumns": "n"}.get, "test"))
    model = Model("history", "true", ("n",))
    for changes in random_epochs(seed=31, epochs=5, keys=10, per_epoch=40, tasks=3):
        m.epoch(*tasks(changes))
        model.apply(changes)
        assert rows(m, "public.t") == model.table()


def test_a_crash_at_a_partitioned_targets_compaction_is_replayed_and_it_goes_on(tmp_path: Path, monkeypatch) -> None:
    """A target partitioned by a rule's partitionBy, compactEvery=2: a kill right before a compaction's snapshot,
    the restart commits the epoch again; every epoch the rows equal the model, later compactions go on."""
    from flinkish_spark.connectors.iceberg import compact
    from flinkish_spark.testing.kills import Killed

    schemas = {"public.up": table_schema("public.up", COLUMNS, ("id",))}
    m = Mirror(tmp_path, modes=all_modes(), compact_every=2)
    model = Model("upsert", "true")
    killed: list[int] = []

    def crash(name: str) -> None:
        if name == "iceberg.compaction.before_snapshot" and not killed and m.epochs >= 3:
            killed.append(m.epochs)
            raise Killed

    monkeypatch.setattr(compact, "crash_point", crash)
    s = StreamBuilder()
    for epoch in random_epochs(seed=5, epochs=8, keys=10, per_epoch=20, tasks=1):
        changes = feed(s, schemas, epoch)
        batch = s.batch()
        try:
            m.epoch(batch)
        except Killed:
            m.epoch(batch)  # the restart: the decided epoch again
        model.apply(changes)
        assert rows(m, "public.up") == model.table()
    table = m.table("public.up")
    compactions = [s.snapshot_id for s in table.snapshots()
                   if s.summary is not None and s.summary.additional_properties.get("flinkish.compaction") == "true"]
    assert killed and len(compactions) >= 2
