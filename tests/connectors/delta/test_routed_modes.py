"""flinkish.delta routed targets in their table's mode (``mode`` / ``deletes`` / ``tableModes``), in process (no Spark):
history (SCD2) and soft or ignored deletes per table, checked against the reference model (``testing/changes.py``),
unchanged TOAST values, truncates, re-snapshots, a target of another mode, schema evolution and compaction."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes
from flinkish_spark.errors import SchemaChangeError
from flinkish_spark.testing.changes import Change, Model, normalized, random_epochs
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema
from flinkish_spark.testing.kills import Killed

from tests.connectors.delta.test_routed import Mirror

deltalake = pytest.importorskip("deltalake")

COLUMNS = [("id", "bigint"), ("v", "text"), ("n", "int")]
SHAPES = {"public.h": ("history", "true"), "public.hf": ("history", "false"), "public.s": ("upsert", "soft"),
          "public.f": ("upsert", "false"), "public.u": ("upsert", "true")}
#: history tracking only 'n' (a change of only 'v' updates the current version in place), as a list and as except
TRACKED = {"public.ht": {"trackHistoryColumns": ["n"]}, "public.hx": {"trackHistoryColumns.except": "v"}}
RULES = json.dumps([{"tables": t, "mode": "history", **o} for t, o in TRACKED.items()]
                   + [{"tables": t, "mode": m, "deletes": d} for t, (m, d) in SHAPES.items() if t != "public.u"])


#: targets partitioned by 'n' (a rule's partitionBy): a key moves between partitions when 'n' changes
PARTITIONED = {"public.up": ("upsert", "true"), "public.hp": ("history", "true")}


def modes(**options: str):
    return parse_table_modes({"tableModes": RULES, **options}.get, "test")


def all_modes():
    """:func:`modes` and the partitioned tables' rules."""
    rules = [{"tables": t, "mode": m, "deletes": d, "partitionBy": ["n"]} for t, (m, d) in PARTITIONED.items()]
    return parse_table_modes({"tableModes": json.dumps(rules + json.loads(RULES))}.get, "test")


def ts(seconds: int | None) -> dt.datetime | None:
    return None if seconds is None else dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


class At(Change):
    """A change whose commit time is the StreamBuilder's (its LSN in seconds since 1970)."""

    @property
    def ts(self) -> dt.datetime | None:
        return ts(self.lsn)


def rows(m: Mirror, table: str) -> list[dict]:
    return normalized(pa.table(deltalake.DeltaTable(m.path(table)).scan()).to_pylist())


def feed(s: StreamBuilder, schemas: dict, epoch: list[Change]) -> list[At]:
    """The epoch's changes into the stream (one transaction per LSN, for every table); the model's changes."""
    out: list[At] = []
    snapshot = [c for c in epoch if c.lsn is None]
    for schema in schemas.values():
        if snapshot:
            s.snapshot(schema, [c.row_dict() for c in snapshot])
    out += [At(c.key, c.op, c.value, None) for c in snapshot]
    lsns = sorted({c.lsn for c in epoch if c.lsn is not None})
    for lsn in lsns:
        txn = [c for c in epoch if c.lsn == lsn]
        s.transaction(*[(schema, c.op, c.row_dict()) for schema in schemas.values() for c in txn])
        out += [At(c.key, c.op, c.value, s.lsn, 0, i) for i, c in enumerate(txn)]
    return out


@pytest.mark.parametrize("compact_every", [0, 2])
def test_each_table_is_applied_in_its_mode_as_the_reference_model(tmp_path: Path, compact_every: int) -> None:
    """Nine tables, one change stream: history (deletes true / false; tracking 'n' only, given as the list and as
    'except'), upsert with soft / ignored / applied deletes, upsert and history partitioned by 'n'. Every epoch every
    target equals the model of its mode; with compactEvery the compacted targets too (per partition)."""
    schemas = {t: table_schema(t, COLUMNS, ("id",)) for t in [*SHAPES, *TRACKED, *PARTITIONED]}
    m = Mirror(tmp_path, modes=all_modes(), compact_every=compact_every)
    models = {t: Model(*shape) for t, shape in {**SHAPES, **PARTITIONED}.items()}
    models.update({t: Model("history", "true", ("n",)) for t in TRACKED})
    s = StreamBuilder()
    for epoch in random_epochs(seed=7, epochs=6, keys=12, per_epoch=25, tasks=1):
        changes = feed(s, schemas, epoch)
        m.epoch(s.batch())
        for t, model in models.items():
            model.apply(changes)
            assert rows(m, t) == model.table(), t
    assert len(rows(m, "public.ht")) < len(rows(m, "public.h")) - 10  # many changes of 'v' alone: no version
    for t in PARTITIONED:
        table = deltalake.DeltaTable(m.path(t))
        assert table.metadata().partition_columns == ["n"]
        adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        assert {int(a["partition.n"]) for a in adds} == {r["n"] for r in rows(m, t)}  # the files' partitions
        assert all(f"/n={a['partition.n']}/" in f"/{a['path']}" for a in adds)
        log = table.history()
        assert any(c.get("operation") == "OPTIMIZE" for c in log) == (compact_every > 0)
    log = deltalake.DeltaTable(m.path("public.h")).history()
    assert any(c.get("operation") == "OPTIMIZE" for c in log) == (compact_every > 0)


@pytest.mark.parametrize("table, mode, deletes", [("public.h", "history", "true"), ("public.s", "upsert", "soft")])
def test_an_unchanged_toast_value_is_taken_from_the_tables_current_row_in_history_and_soft_modes(
        tmp_path: Path, table: str, mode: str, deletes: str) -> None:
    """The source leaves an unchanged TOASTed value out of an update; a new version never holds a null there."""
    from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD

    d = table_schema(table, [("id", "int"), ("n", "int"), ("body", "text")], ("id",))
    m = Mirror(tmp_path, modes=modes())
    s = StreamBuilder()
    s.snapshot(d, [{"id": 1, "n": 0, "body": "one"}, {"id": 2, "n": 0, "body": "two"}])
    m.epoch(s.batch())
    s.transaction((d, "u", {"id": 1, "n": 1, UNCHANGED_FIELD: ["body"]}))  # from the table's current row
    s.transaction((d, "u", {"id": 2, "n": 1, "body": "new"}), (d, "u", {"id": 2, "n": 2, UNCHANGED_FIELD: ["body"]}))
    m.epoch(s.batch())
    s.transaction((d, "u", {"id": 1, "n": 2, UNCHANGED_FIELD: ["body"]}))  # a version written by the fill before
    m.epoch(s.batch())
    got = pa.table(deltalake.DeltaTable(m.path(table)).scan()).to_pylist()
    if mode == "history":
        current = sorted((r["id"], r["n"], r["body"]) for r in got if r["_current"])
        assert current == [(1, 2, "one"), (2, 2, "new")]
        assert sorted((r["id"], r["n"], r["body"]) for r in got) == [
            (1, 0, "one"), (1, 1, "one"), (1, 2, "one"), (2, 0, "two"), (2, 1, "new"), (2, 2, "new")]
    else:
        assert sorted((r["id"], r["n"], r["body"], r["_deleted"]) for r in got) == [(1, 2, "one", False),
                                                                                    (2, 2, "new", False)]


def tracked_toast_case(m, read) -> None:
    """History tracking 'n' only (``public.ht``), with unchanged TOAST values: an untracked change updates the current
    version in place, a tracked one opens a version (its unchanged 'body' filled), an untracked one after it in the same
    epoch updates that new version, and one in the next epoch updates the table's current row (``_valid_from`` kept).
    ``read(m, table)``: the target's rows."""
    from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD

    d = table_schema("public.ht", [("id", "int"), ("n", "int"), ("body", "text")], ("id",))
    s = StreamBuilder()
    s.snapshot(d, [{"id": 1, "n": 0, "body": "one"}, {"id": 2, "n": 0, "body": "two"}])
    m.epoch(s.batch())
    s.transaction((d, "u", {"id": 1, "n": 0, "body": "uno"}))  # untracked: in place
    s.transaction((d, "u", {"id": 1, "n": 1, UNCHANGED_FIELD: ["body"]}))  # tracked: a version, body 'uno'
    opened = ts(s.lsn)
    s.transaction((d, "u", {"id": 1, "n": 1, "body": "eins"}))  # untracked: the new version, in place
    s.transaction((d, "d", {"id": 2}), (d, "c", {"id": 2, "n": 0, "body": "two"}))  # after a delete: a version
    again = ts(s.lsn)
    m.epoch(s.batch())
    s.transaction((d, "u", {"id": 1, "n": 1, "body": "un"}))  # untracked, next epoch: the table's row in place
    s.transaction((d, "u", {"id": 2, "n": 0, UNCHANGED_FIELD: ["body"]}))  # nothing tracked changed
    m.epoch(s.batch())
    got = [(r["id"], r["n"], r["body"], r["_valid_from"], r["_valid_to"], r["_current"]) for r in read(m, "public.ht")]
    assert sorted(got, key=str) == sorted([(1, 0, "uno", None, opened, False), (1, 1, "un", opened, None, True),
                                           (2, 0, "two", None, again, False), (2, 0, "two", again, None, True)], key=str)


def test_history_tracking_columns_updates_the_current_version_in_place_for_untracked_changes(tmp_path: Path) -> None:
    tracked_toast_case(Mirror(tmp_path, modes=modes()), rows)


def test_a_truncate_marks_closes_or_keeps_the_rows_by_the_tables_mode(tmp_path: Path) -> None:
    """Soft: every row the truncate took is marked _deleted (a change before it in the same epoch too); history:
    every current version closes at the truncate's commit time; deletes=false: nothing is removed."""
    schemas = {t: table_schema(t, COLUMNS, ("id",)) for t in SHAPES}
    m = Mirror(tmp_path, modes=modes())
    s = StreamBuilder()
    for schema in schemas.values():
        s.snapshot(schema, [{"id": i, "v": f"s{i}", "n": 2} for i in (1, 2, 3)])
    m.epoch(s.batch())
    s.transaction(*[(schema, "u", {"id": 1, "v": "one", "n": 3}) for schema in schemas.values()])
    s.transaction(*[(schema, "d", {"id": 3}) for schema in schemas.values()])
    m.epoch(s.batch())
    s.transaction(*[c for schema in schemas.values() for c in ((schema, "c", {"id": 4, "v": "gone", "n": 1}),
                                                                (schema, "u", {"id": 1, "v": "pre", "n": 1}))])
    pre = ts(s.lsn)
    s.transaction(*[(schema, "t", None) for schema in schemas.values()])
    truncated = ts(s.lsn)
    s.transaction(*[(schema, "c", {"id": 2, "v": "after", "n": 5}) for schema in schemas.values()])
    after = ts(s.lsn)
    m.epoch(s.batch())

    def short(t: str, *extra: str) -> list[tuple]:
        return sorted(tuple(r[c] for c in ("id", "v", *extra)) for r in rows(m, t))

    assert short("public.u") == [(2, "after")]
    assert short("public.f") == [(1, "pre"), (2, "after"), (3, "s3"), (4, "gone")]  # nothing removed
    assert short("public.s", "_deleted") == [(1, "pre", True), (2, "after", False), (3, "s3", True), (4, "gone", True)]
    updated = ts(1100)
    assert short("public.h", "_valid_from", "_valid_to", "_current") == [
        (1, "one", updated, pre, False), (1, "pre", pre, truncated, False), (1, "s1", None, updated, False),
        (2, "after", after, None, True), (2, "s2", None, truncated, False),
        (3, "s3", None, ts(1200), False), (4, "gone", pre, truncated, False)]
    assert short("public.hf", "_current") == [(1, "one", False), (1, "pre", True), (1, "s1", False),
                                              (2, "after", True), (2, "s2", False), (3, "s3", True), (4, "gone", True)]


def test_a_resnapshot_end_marks_or_closes_the_keys_it_did_not_deliver(tmp_path: Path) -> None:
    """Rows deleted while no slot kept the WAL: soft marks them, history closes their current version (at the
    epoch's newest change of the table), deletes=false keeps them. In history a re-snapshot row equal to the key's
    current version adds none; a changed one closes it and starts a version at that same time."""
    shapes = ("public.h", "public.s", "public.f")
    schemas = {t: table_schema(t, COLUMNS, ("id",)) for t in shapes}
    m = Mirror(tmp_path, modes=modes())
    s = StreamBuilder()
    for schema in schemas.values():
        s.snapshot(schema, [{"id": i, "v": f"s{i}", "n": 1} for i in (1, 2, 3)])
    m.epoch(s.batch())
    for schema in schemas.values():
        s.marker(schema, "B").snapshot(schema, [{"id": 1, "v": "s1", "n": 1}, {"id": 2, "v": "r2", "n": 1}])
        s.marker(schema, "E")
    s.transaction(*[(schema, "c", {"id": 4, "v": "new", "n": 1}) for schema in schemas.values()])
    m.epoch(s.batch())
    assert sorted((r["id"], r["v"], r["_deleted"]) for r in rows(m, "public.s")) == [
        (1, "s1", False), (2, "r2", False), (3, "s3", True), (4, "new", False)]
    assert sorted((r["id"], r["v"]) for r in rows(m, "public.f")) == [(1, "s1"), (2, "r2"), (3, "s3"), (4, "new")]
    assert sorted((r["id"], r["v"], r["_valid_from"], r["_valid_to"], r["_current"]) for r in rows(m, "public.h")) == [
        (1, "s1", None, None, True),  # delivered as it was: no new version
        (2, "r2", ts(s.lsn), None, True), (2, "s2", None, ts(s.lsn), False),  # changed while no slot kept the WAL
        (3, "s3", None, ts(s.lsn), False),  # not delivered: closed at the epoch's newest change of the table
        (4, "new", ts(s.lsn), None, True)]


def test_a_target_written_in_another_mode_is_refused_naming_the_table_and_nothing_is_written(tmp_path: Path) -> None:
    a = table_schema("public.a", COLUMNS, ("id",))
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "v": "x", "n": 1}])
    Mirror(tmp_path).epoch(s.batch())  # upsert
    m = Mirror(tmp_path, modes=parse_table_modes({"mode": "history"}.get, "test"))
    m.epochs = 1
    version = m.version("public.a")
    s.transaction((a, "u", {"id": 1, "v": "y", "n": 2}))
    with pytest.raises(SchemaChangeError, match=r"source table public.a: the Delta table .* was written in another "
                                                r"mode \(upsert: its extra columns are none\).*\(history, which writes "
                                                r"_current, _valid_from, _valid_to\).*Give the table its former mode"):
        m.epoch(s.batch())
    assert m.version("public.a") == version


def test_a_history_target_keeps_its_columns_through_schema_evolution(tmp_path: Path) -> None:
    a1 = table_schema("public.h", [("id", "int"), ("v", "text")], ("id",))
    a2 = table_schema("public.h", [("id", "int"), ("v", "text"), ("w", "int")], ("id",))
    m = Mirror(tmp_path, modes=modes())
    s = StreamBuilder()
    s.snapshot(a1, [{"id": 1, "v": "x"}])
    m.epoch(s.batch())
    s.transaction((a2, "u", {"id": 1, "v": "y", "w": 5}))
    m.epoch(s.batch())
    names = deltalake.DeltaTable(m.path("public.h")).schema().to_arrow().names
    assert names == ["id", "v", "_valid_from", "_valid_to", "_current", "w"]
    assert sorted((r["v"], r["w"], r["_current"]) for r in rows(m, "public.h")) == [("x", None, False), ("y", 5, True)]


@pytest.mark.parametrize("point", ["delta.keyed.before_version", "sink.between_tables"])
def test_a_crash_in_a_truncating_epoch_and_its_replay_write_each_mark_once(tmp_path: Path, monkeypatch, point: str) -> None:
    """The marked / closed copies of a truncate are part of the table's one version: a crash before it (or between
    two tables) and the restart's commit of the same epoch leave each row once, and a replay of a committed epoch
    changes nothing."""
    from flinkish_spark.connectors.delta import epoch_commit, routed


    schemas = {t: table_schema(t, COLUMNS, ("id",)) for t in ("public.h", "public.s")}
    m = Mirror(tmp_path, modes=modes())
    s = StreamBuilder()
    for schema in schemas.values():
        s.snapshot(schema, [{"id": i, "v": f"s{i}", "n": 1} for i in (1, 2)])
    m.epoch(s.batch())
    s.transaction(*[(schema, "u", {"id": 1, "v": "one", "n": 2}) for schema in schemas.values()])
    s.transaction(*[(schema, "t", None) for schema in schemas.values()])
    batch = s.batch()

    def crash(name: str) -> None:
        if name == point:
            raise Killed

    monkeypatch.setattr(epoch_commit if point.startswith("delta.") else routed, "crash_point", crash)
    with pytest.raises(Killed):
        m.epoch(batch)
    monkeypatch.undo()
    m.epoch(batch)  # the restart commits the decided epoch
    m.epochs -= 1
    m.epoch(batch)  # once more: every table holds it
    truncated = ts(s.lsn)
    assert sorted((r["id"], r["v"], r["_deleted"]) for r in rows(m, "public.s")) == [(1, "one", True), (2, "s2", True)]
    assert sorted((r["id"], r["v"], r["_valid_to"], r["_current"]) for r in rows(m, "public.h")) == [
        (1, "one", truncated, False), (1, "s1", ts(s.lsn - 100), False), (2, "s2", truncated, False)]


def test_a_source_column_named_like_a_mode_column_is_refused_naming_the_table(tmp_path: Path) -> None:
    s = StreamBuilder()
    s.snapshot(table_schema("public.s", [("id", "int"), ("_deleted", "bool")], ("id",)), [{"id": 1, "_deleted": False}])
    with pytest.raises(SchemaChangeError, match=r"source table public.s: its column\(s\) _deleted have the name of a "
                                                r"column its target's mode \(upsert, deletes soft\) writes itself"):
        Mirror(tmp_path, modes=modes()).epoch(s.batch())
    s.snapshot(table_schema("public.u", [("id", "int"), ("_deleted", "bool")], ("id",)), [{"id": 1, "_deleted": True}])
    m = Mirror(tmp_path, modes=modes())
    m.epoch(s.batch())  # upsert: the source's own column
    assert rows(m, "public.u") == [{"id": 1, "_deleted": True}]


@pytest.mark.parametrize("track", [None, "n"])
def test_history_over_three_tasks_per_epoch_equals_the_reference_model(tmp_path: Path, track: str | None) -> None:
    """A key's changes spread over three tasks (a chain continued, a version absorbed across tasks): the target equals
    the model every epoch, tracking every column or only 'n'."""
    from tests.connectors.postgres.test_routed_modes import tasks

    m = Mirror(tmp_path, modes=parse_table_modes({"mode": "history", **({"trackHistoryColumns": track} if track else {})}.get,
                                                 "test"))
    model = Model("history", "true", (track,) if track else None)
    for changes in random_epochs(seed=31, epochs=5, keys=10, per_epoch=40, tasks=3):
        m.epoch(*tasks(changes))
        model.apply(changes)
        assert rows(m, "public.t") == model.table()


def test_history_tracking_columns_does_not_update_a_version_a_truncate_closed(tmp_path: Path) -> None:
    tracked_truncate_case(Mirror(tmp_path, modes=modes()), rows)


def tracked_truncate_case(m, read) -> None:
    """A truncate closes every current version; a change after it in the same epoch, equal in the tracked columns,
    opens a version of its own (the closed one is not updated in place)."""
    d = table_schema("public.ht", COLUMNS, ("id",))
    s = StreamBuilder()
    s.snapshot(d, [{"id": 1, "v": "a", "n": 1}])
    m.epoch(s.batch())
    s.transaction((d, "t", None))
    truncated = ts(s.lsn)
    s.transaction((d, "c", {"id": 1, "v": "b", "n": 1}))
    m.epoch(s.batch())
    assert sorted(((r["v"], r["_valid_from"], r["_valid_to"], r["_current"]) for r in read(m, "public.ht")), key=str) == [
        ("a", None, truncated, False), ("b", ts(s.lsn), None, True)]


def test_a_partitioned_target_is_never_repartitioned_and_a_partition_column_must_exist(tmp_path: Path) -> None:
    from flinkish_spark.errors import ConfigError, TableMismatchError

    t = table_schema("public.up", COLUMNS, ("id",))
    s = StreamBuilder()
    s.snapshot(t, [{"id": 1, "v": "a", "n": 1}])
    Mirror(tmp_path).epoch(s.batch())  # created unpartitioned
    m = Mirror(tmp_path, modes=all_modes())
    m.epochs = 1
    version = m.version("public.up")
    s.transaction((t, "u", {"id": 1, "v": "b", "n": 1}))
    with pytest.raises(TableMismatchError, match=r"the Delta table .*public/up is unpartitioned, but the sink's "
                                                 r"tableModes give source table public.up partitionBy n; nothing was "
                                                 r"written.*never changes a target's partitioning"):
        m.epoch(s.batch())
    assert m.version("public.up") == version
    wrong = parse_table_modes({"tableModes": '[{"tables": "public.x", "partitionBy": "day"}]'}.get, "test")
    s.snapshot(table_schema("public.x", COLUMNS, ("id",)), [{"id": 1, "v": "a", "n": 1}])
    with pytest.raises(ConfigError, match=r"source table public.x: the tableModes rule's partitionBy names 'day', which "
                                          r"the table does not have \(its columns: id, v, n"):
        Mirror(tmp_path / "x", modes=wrong).epoch(s.batch())
