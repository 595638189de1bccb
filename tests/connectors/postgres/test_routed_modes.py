"""The routed flinkish.postgres sink's table modes (``mode``, ``deletes``, ``tableModes``), in process (no Spark):
history (SCD type 2) and soft or ignored deletes, each target read back with psycopg and compared with the
reference model of the keyed sinks (flinkish_spark/testing/changes.py) where it fits."""

from __future__ import annotations

import collections
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.table_modes import TableModes, parse_table_modes
from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD
from flinkish_spark.errors import SchemaChangeError, TargetSchemaError
from flinkish_spark.testing.changes import Change, Model, normalized, ordered, random_epochs
from flinkish_spark.testing.stream_rows import ARROW, StreamBuilder, table_schema
from flinkish_spark.testing.kills import Killed, kill_at
from tests.connectors.postgres.test_routed import Mirror

psycopg = pytest.importorskip("psycopg")

HISTORY = ("_valid_from", "_valid_to", "_current")


def modes(**options: str) -> TableModes:
    return parse_table_modes(options.get, "test")


def read(url: str, table: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    with psycopg.connect(url) as c:
        rows = c.execute(f"SELECT {', '.join(columns)} FROM mirror.{table}").fetchall()
    return normalized([dict(zip(columns, r)) for r in rows])


def ts(lsn: int) -> datetime:
    """The commit time StreamBuilder gives the transaction at ``lsn``."""
    return datetime.fromtimestamp(lsn, tz=timezone.utc)


M = table_schema("public.t", [("id", "bigint"), ("v", "text"), ("n", "int")], ("id",))


def tasks(changes: list[Change]) -> list[pa.Table]:
    """The model's changes of one epoch as the multi-table stream, one task per partition: (``_lsn``, ``_seq``)
    in the model's order (``_seq`` numbers the changes that share an ``_lsn``, one transaction)."""
    seq: dict[int, int] = {}
    count: collections.Counter[int] = collections.Counter()
    for c in ordered(changes):
        if c.lsn is not None:
            seq[id(c)], count[c.lsn] = count[c.lsn], count[c.lsn] + 1
    by_part: dict[int, list[Change]] = collections.defaultdict(list)
    for c in changes:
        by_part[c.part].append(c)
    out = []
    for part in sorted(by_part):
        rows: list[dict[str, Any]] = [{"_table": M.table, "_op": "s", "_schema_id": M.schema_id, "row": M.to_json()}]
        rows += [{"_table": M.table, "_op": c.op, "_lsn": c.lsn, "_seq": seq.get(id(c)), "_commit_ts": c.ts,
                  "_schema_id": M.schema_id, "row": json.dumps({"id": c.key} if c.op == "d" else c.row_dict())}
                 for c in sorted(by_part[part], key=lambda c: c.row)]
        out.append(pa.Table.from_pylist(rows, schema=ARROW))
    return out


@pytest.mark.parametrize("mode, deletes, track", [("upsert", "soft", None), ("upsert", "false", None),
                                                  ("history", "true", None), ("history", "false", None),
                                                  ("history", "true", "n")])
def test_each_mode_leaves_what_the_reference_model_does_and_a_replay_adds_nothing(pg_url, tmp_path: Path, mode: str,
                                                                                   deletes: str, track: str | None) -> None:
    """Three tasks per epoch; ``track``: history tracking 'n' only (a change of 'v' alone updates in place)."""
    m = Mirror(tmp_path, pg_url, modes=modes(mode=mode, deletes=deletes,
                                             **({"trackHistoryColumns": track} if track else {})))
    model = Model(mode, deletes, (track,) if track else None)
    extra = HISTORY if mode == "history" else ("_deleted",) if deletes == "soft" else ()
    epochs = random_epochs(seed=30, epochs=6, keys=12, per_epoch=40, tasks=3)
    for changes in epochs:
        m.epoch(*tasks(changes))
        model.apply(changes)
        assert read(pg_url, "public_t", ("id", "v", "n") + extra) == model.table()
    m.epoch(*tasks(epochs[-1]), epoch=m.epochs - 1)  # the committed epoch again (a replay): nothing added
    assert read(pg_url, "public_t", ("id", "v", "n") + extra) == model.table()
    assert m.staged() == 0


def test_unchanged_toasted_values_are_filled_from_the_epoch_or_the_current_row_in_history_and_soft(
        pg_url, tmp_path: Path, monkeypatch) -> None:
    """An update that left a TOASTed value unchanged does not carry it: each new history version and a soft-deleted
    row hold the key's value from its latest earlier row in the epoch (any task), else its current target row."""
    from flinkish_spark.connectors.postgres import routed

    h = table_schema("public.h", [("id", "int"), ("n", "int"), ("body", "text")], ("id",))
    s_ = table_schema("public.s", [("id", "int"), ("n", "int"), ("body", "text")], ("id",))
    rules = '[{"tables": "public.h", "mode": "history"}, {"tables": "public.s", "deletes": "soft"}]'
    m = Mirror(tmp_path, pg_url, modes=modes(tableModes=rules))
    s = StreamBuilder()
    s.snapshot(h, [{"id": 1, "n": 0, "body": "one"}, {"id": 2, "n": 0, "body": None}])
    s.snapshot(s_, [{"id": 1, "n": 0, "body": "one"}, {"id": 2, "n": 0, "body": "two"}])
    m.epoch(s.batch())
    chunk = s.snapshot(h, [{"id": 3, "n": 0, "body": "three"}]).batch()  # a chunk read in the same epoch
    s.transaction((h, "u", {"id": 1, "n": 1, UNCHANGED_FIELD: ["body"]}),  # the current row's
                  (h, "c", {"id": 4, "n": 0, "body": "four"}), (h, "u", {"id": 4, "n": 1, UNCHANGED_FIELD: ["body"]}),
                  (h, "u", {"id": 3, "n": 1, UNCHANGED_FIELD: ["body"]}),  # the other task's snapshot row
                  (h, "u", {"id": 2, "n": 1, UNCHANGED_FIELD: ["body"]}),  # a null stays null
                  (h, "u", {"id": 5, "n": 1, UNCHANGED_FIELD: ["body"]}),  # nothing holds it: null
                  (s_, "u", {"id": 1, "n": 1, UNCHANGED_FIELD: ["body"]}), (s_, "d", {"id": 1}),
                  (s_, "u", {"id": 2, "n": 1, UNCHANGED_FIELD: ["body"]}))
    t1 = ts(s.lsn)
    m.epoch(chunk, s.batch())
    cols = ("id", "n", "body") + HISTORY
    want = [(1, 0, "one", None, t1, False), (1, 1, "one", t1, None, True), (2, 0, None, None, t1, False),
            (2, 1, None, t1, None, True), (3, 0, "three", None, t1, False), (3, 1, "three", t1, None, True),
            (4, 0, "four", t1, t1, False), (4, 1, "four", t1, None, True), (5, 1, None, t1, None, True)]
    assert read(pg_url, "public_h", cols) == normalized([dict(zip(cols, r)) for r in want])
    soft = ("id", "n", "body", "_deleted")
    assert read(pg_url, "public_s", soft) == normalized([dict(zip(soft, r)) for r in [(1, 1, "one", True),
                                                                                       (2, 1, "two", False)]])

    s.transaction((h, "u", {"id": 1, "n": 2, UNCHANGED_FIELD: ["body"]}), (s_, "d", {"id": 2}))
    t2 = ts(s.lsn)
    s.transaction((h, "u", {"id": 1, "n": 3, UNCHANGED_FIELD: ["body"]}))
    t3 = ts(s.lsn)
    again = s.batch()

    kill_at(monkeypatch, routed, "sink.between_tables")
    with pytest.raises(Killed):  # public.h applied inside the open transaction, then the kill
        m.epoch(again)
    monkeypatch.undo()
    m.epoch(again, epoch=m.epochs)  # the restart commits the decided epoch
    m.epoch(again, epoch=m.epochs - 1)  # and a replay of it adds no version
    want[1] = (1, 1, "one", t1, t2, False)
    want += [(1, 2, "one", t2, t3, False), (1, 3, "one", t3, None, True)]
    assert read(pg_url, "public_h", cols) == normalized([dict(zip(cols, r)) for r in want])
    assert read(pg_url, "public_s", soft) == normalized([dict(zip(soft, r)) for r in [(1, 1, "one", True),
                                                                                       (2, 1, "two", True)]])
    assert m.staged() == 0


def test_truncate_and_resnapshot_mark_deleted_close_versions_or_remove_nothing(pg_url, tmp_path: Path) -> None:
    """The same changes into a soft, a history and a deletes=false table: a truncate (with the epoch's rows before
    it) and a re-snapshot whose end retires the keys it did not deliver."""
    tables = {t: table_schema(f"public.{t}", [("id", "int"), ("v", "text")], ("id",)) for t in ("f", "h", "s")}
    rules = ('[{"tables": "public.s", "deletes": "soft"}, {"tables": "public.h", "mode": "history"}, '
             '{"tables": "public.f", "deletes": "false"}]')
    m = Mirror(tmp_path, pg_url, modes=modes(tableModes=rules))
    s = StreamBuilder()
    for t in tables.values():
        s.snapshot(t, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}])
    m.epoch(s.batch())
    s.transaction(*[(t, "u", {"id": 1, "v": "a1"}) for t in tables.values()])
    t1 = ts(s.lsn)
    s.transaction(*[(t, "t", None) for t in tables.values()])
    t2 = ts(s.lsn)
    s.transaction(*[c for t in tables.values() for c in ((t, "c", {"id": 4, "v": "d"}), (t, "c", {"id": 5, "v": "e"}))])
    t3 = ts(s.lsn)
    m.epoch(s.batch())
    kv = ("id", "v")
    assert read(pg_url, "public_f", kv) == normalized([dict(zip(kv, r)) for r in [
        (1, "a1"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]])  # nothing removed
    sd = kv + ("_deleted",)
    assert read(pg_url, "public_s", sd) == normalized([dict(zip(sd, r)) for r in [
        (1, "a1", True), (2, "b", True), (3, "c", True), (4, "d", False), (5, "e", False)]])
    hc = kv + HISTORY
    history = [(1, "a", None, t1, False), (1, "a1", t1, t2, False), (2, "b", None, t2, False), (3, "c", None, t2, False),
               (4, "d", t3, None, True), (5, "e", t3, None, True)]
    assert read(pg_url, "public_h", hc) == normalized([dict(zip(hc, r)) for r in history])

    for t in tables.values():  # a re-snapshot after a lost slot: keys 2 and 4 exist, 5 went in the gap
        s.marker(t, "B").snapshot(t, [{"id": 2, "v": "b2"}, {"id": 4, "v": "d"}]).marker(t, "E")
    before = datetime.now(timezone.utc)
    m.epoch(s.batch())
    after = datetime.now(timezone.utc)
    assert read(pg_url, "public_f", kv) == normalized([dict(zip(kv, r)) for r in [
        (1, "a1"), (2, "b2"), (3, "c"), (4, "d"), (5, "e")]])
    assert read(pg_url, "public_s", sd) == normalized([dict(zip(sd, r)) for r in [
        (1, "a1", True), (2, "b2", False), (3, "c", True), (4, "d", False), (5, "e", True)]])
    # Key 4's snapshot row equals its current version: no new version. Key 2 had none current (the truncate
    # closed it): a version without times. Key 5 went in the gap: closed at the commit's own time (the epoch has
    # no change of the table to take the time from), never a null _valid_to.
    got = read(pg_url, "public_h", hc)
    closed = [r["_valid_to"] for r in got if r["id"] == 5]
    assert len(closed) == 1 and closed[0] is not None and before <= closed[0] <= after, got
    history[4:] = [(4, "d", t3, None, True), (5, "e", t3, closed[0], False), (2, "b2", None, None, True)]
    assert got == normalized([dict(zip(hc, r)) for r in history])


def test_history_resnapshot_adds_versions_only_for_changed_rows_at_one_time(pg_url, tmp_path: Path) -> None:
    """As the routed Delta and Iceberg sinks: a re-snapshot row equal to its key's current version adds no version
    (it stays open); a changed one closes the current version and opens the new one at one time, the epoch's
    newest change of the table (the change's own time is unknown); the end closes the keys it did not deliver at
    that time too. A replay of the epoch adds nothing."""
    from flinkish_spark.connectors.postgres.rows import TableSchema, make_column

    h = table_schema("public.h", [("id", "int"), ("v", "text"), ("n", "numeric(6,2)")], ("id",))
    h = TableSchema(h.table, h.columns + (make_column("j", "json", "json", -1, None),), h.key)  # json has no "="
    m = Mirror(tmp_path, pg_url, modes=modes(mode="history"))
    s = StreamBuilder()
    first = [{"id": i, "v": v, "n": "1.50", "j": '{"a": 1}'} for i, v in ((1, "a"), (2, "b"), (3, "c"), (4, "d"))]
    first[0]["v"] = None  # a null equals a null
    m.epoch(s.snapshot(h, first).batch())
    s.transaction((h, "u", {"id": 3, "v": "c1", "n": "1.50", "j": '{"a": 1}'}))
    t1 = ts(s.lsn)
    m.epoch(s.batch())
    cols = ("id", "v", "_valid_from", "_valid_to", "_current")
    want = [(1, None, None, None, True), (2, "b", None, None, True), (3, "c", None, t1, False),
            (3, "c1", t1, None, True), (4, "d", None, None, True)]
    assert read(pg_url, "public_h", cols) == normalized([dict(zip(cols, r)) for r in want])

    again = [dict(first[0]), {**first[1], "v": "b2"}, {"id": 3, "v": "c1", "n": "1.50", "j": '{"a": 1}'}]
    s.marker(h, "B").snapshot(h, again).marker(h, "E")  # key 4 went in the gap
    s.transaction((h, "c", {"id": 6, "v": "f", "n": "2.00", "j": "{}"}))
    t2 = ts(s.lsn)
    batch = s.batch()
    m.epoch(batch)
    want = [(1, None, None, None, True),  # unchanged: still the one open version
            (2, "b", None, t2, False), (2, "b2", t2, None, True),  # changed: closed and opened at one time
            (3, "c", None, t1, False), (3, "c1", t1, None, True),  # unchanged
            (4, "d", None, t2, False),  # not delivered: closed at the epoch's newest change
            (6, "f", t2, None, True)]
    assert read(pg_url, "public_h", cols) == normalized([dict(zip(cols, r)) for r in want])
    m.epoch(batch, epoch=m.epochs - 1)  # a replay adds nothing
    assert read(pg_url, "public_h", cols) == normalized([dict(zip(cols, r)) for r in want])

    # A whole re-snapshot that finds nothing changed adds no version at all.
    m.epoch(s.marker(h, "B").snapshot(h, [dict(first[0]), {**first[1], "v": "b2"}, again[2],
                                          {"id": 6, "v": "f", "n": "2.00", "j": "{}"}]).marker(h, "E").batch())
    assert read(pg_url, "public_h", cols) == normalized([dict(zip(cols, r)) for r in want])
    assert m.staged() == 0


def test_a_target_of_another_mode_is_refused_naming_table_and_fix_and_history_targets_evolve(pg_url, tmp_path: Path) -> None:
    a = table_schema("public.a", [("id", "int"), ("v", "text")], ("id",))
    b = table_schema("public.b", [("id", "int"), ("v", "text")], ("id",))
    s = StreamBuilder()
    s.snapshot(a, [{"id": 1, "v": "x"}]).snapshot(b, [{"id": 1, "v": "x"}])
    Mirror(tmp_path, pg_url).epoch(s.batch())  # both upsert
    m = Mirror(tmp_path, pg_url, modes=modes(tableModes='[{"tables": "public.b", "mode": "history"}]'))
    m.epochs = 1
    s.transaction((a, "u", {"id": 1, "v": "y"}), (b, "u", {"id": 1, "v": "y"}))
    with pytest.raises(TargetSchemaError) as e:
        m.epoch(s.batch())
    text = str(e.value)
    assert ("source table public.b is mirrored as history" in text and "_current, _valid_from, _valid_to" in text
            and "mirror.public_b has none of them" in text and "Nothing of this epoch was written" in text
            and "tableModes rule for public.b" in text and "drop mirror.public_b" in text), text
    assert m.rows("public_a", "id") == [(1, "x")]  # nothing of the epoch in any table

    h = table_schema("public.h", [("id", "int"), ("v", "varchar(5)")], ("id",))
    m = Mirror(tmp_path, pg_url, uid="h", modes=modes(mode="history"))
    s = StreamBuilder()
    m.epoch(s.snapshot(h, [{"id": 1, "v": "x"}]).batch())
    wide = table_schema("public.h", [("id", "int"), ("v", "text"), ("w", "int")], ("id",))
    m.epoch(s.transaction((wide, "u", {"id": 1, "v": "longer", "w": 7})).batch())
    assert m.types("public_h") == {"id": "integer", "v": "text", "_valid_from": "timestamp with time zone",
                                   "_valid_to": "timestamp with time zone", "_current": "boolean", "w": "integer"}
    assert [r[:2] + r[4:] for r in m.rows("public_h", "id, _current")] == [(1, "x", False, None), (1, "longer", True, 7)]
    with psycopg.connect(pg_url) as c:
        indexes = [r[0] for r in c.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'mirror' "
                                           "AND tablename = 'public_h'").fetchall()]
    assert len(indexes) == 1 and "UNIQUE INDEX" in indexes[0] and "(id) WHERE _current" in indexes[0]  # no primary key

    clash = table_schema("public.c", [("id", "int"), ("_deleted", "bool")], ("id",))
    m = Mirror(tmp_path, pg_url, uid="c", modes=modes(deletes="soft"))
    with pytest.raises(SchemaChangeError, match=r"public.c has the column\(s\) _deleted, which its mode \(upsert, "
                                                r"deletes soft\) writes itself.*mode upsert, deletes true"):
        m.epoch(StreamBuilder().snapshot(clash, [{"id": 1, "_deleted": False}]).batch())


def test_history_tracking_columns_updates_the_current_version_in_place_for_untracked_changes(pg_url, tmp_path: Path) -> None:
    """The Delta and Iceberg case (tests/connectors/delta/test_routed_modes.py): in place within an epoch, after a
    tracked change, and across epochs (the current row replaced, its _valid_from kept), TOAST values filled."""
    from tests.connectors.delta.test_routed_modes import modes as shapes, tracked_toast_case

    tracked_toast_case(Mirror(tmp_path, pg_url, modes=shapes()),
                       lambda m, table: read(pg_url, table.replace(".", "_"), ("id", "n", "body") + HISTORY))


def test_history_tracking_columns_does_not_update_a_version_a_truncate_closed(pg_url, tmp_path: Path) -> None:
    from tests.connectors.delta.test_routed_modes import modes as shapes, tracked_truncate_case

    tracked_truncate_case(Mirror(tmp_path, pg_url, modes=shapes()),
                          lambda m, table: read(pg_url, table.replace(".", "_"), ("id", "v", "n") + HISTORY))
