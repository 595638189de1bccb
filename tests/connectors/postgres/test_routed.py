"""flinkish.postgres with ``{schema}``/``{table}`` routing, in process (no Spark): the multi-table stream's rows,
made by hand, through prepare / the decision log / commit; each target read back with psycopg."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.connectors.lakehouse.table_modes import TableModes
from flinkish_spark.errors import SchemaChangeError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema
from flinkish_spark.testing.widening import LAYOUTS, TABLE, widening_during_the_snapshot
from flinkish_spark.testing.kills import Killed, kill_at

psycopg = pytest.importorskip("psycopg")

A = table_schema("public.a", [("id", "int"), ("v", "text"), ("n", "numeric(12,2)")], ("id",))
B = table_schema("public.b", [("k", "text"), ("f", "float8"), ("ok", "bool")], ("k",))


class Mirror:
    """A routed sink into ``mirror.{schema}_{table}`` and its decision log; :meth:`epoch` prepares batches
    (one per task) and commits them."""

    def __init__(self, tmp_path: Path, url: str, uid: str = "m", modes: TableModes = TableModes()) -> None:
        self.tmp, self.url, self.uid, self.modes = tmp_path, url, uid, modes
        self.meta = str(tmp_path / "meta")
        self.epochs = 0

    def sink(self) -> Any:
        from flinkish_spark.connectors.postgres.connection import parse_url
        from flinkish_spark.connectors.postgres.routed import RoutedPostgresSink, resolve_routed_plan

        plan = resolve_routed_plan(parse_url(self.url), Route("mirror.{schema}_{table}", "postgres"), self.uid, True, "test",
                                   self.modes)
        return RoutedPostgresSink(plan, self.uid, 60)

    def log(self) -> DecisionLog:
        return DecisionLog(FileIO.for_url(self.meta), self.meta, self.uid)

    def epoch(self, *batches: pa.Table, epoch: int | None = None) -> None:
        sink = self.sink()
        e = self.epochs if epoch is None else epoch
        prepared = [sink.prepare(iter(b.to_batches()), PrepareContext(self.uid, e, i, 0)) for i, b in enumerate(batches)]
        commit_epoch(sink, self.log(), e, prepared, "run")
        self.epochs = e + 1

    def rows(self, table: str, key: str) -> list[tuple]:
        with psycopg.connect(self.url) as c:
            return c.execute(f"SELECT * FROM mirror.{table} ORDER BY {key}").fetchall()

    def types(self, table: str) -> dict[str, str]:
        with psycopg.connect(self.url) as c:
            return dict(c.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                                  "to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                                  (f"mirror.{table}",)).fetchall())

    def commits(self) -> list[tuple]:
        with psycopg.connect(self.url) as c:
            return c.execute("SELECT epoch, target FROM mirror.flinkish_commits WHERE sink_uid = %s ORDER BY 1, 2",
                             (self.uid,)).fetchall()

    def staged(self) -> int:
        from flinkish_spark.connectors.postgres.staging import staging_table_name

        with psycopg.connect(self.url) as c:
            return c.execute(f"SELECT count(*) FROM mirror.{staging_table_name(self.uid, 'mirror.{schema}_{table}')}").fetchone()[0]


def test_each_table_goes_to_its_own_keyed_target_with_deletes_truncates_and_one_commit_row_per_table(pg_url, tmp_path: Path) -> None:
    from decimal import Decimal

    m = Mirror(tmp_path, pg_url)
    s = StreamBuilder()
    s.snapshot(A, [{"id": i, "v": f"a{i}", "n": f"{i}.25"} for i in range(1, 4)])
    first = s.batch()
    s.snapshot(B, [{"k": "x", "f": 0.1, "ok": True}, {"k": "y", "f": float("nan"), "ok": False}])
    m.epoch(first, s.batch())  # two tasks
    assert m.rows("public_a", "id") == [(1, "a1", Decimal("1.25")), (2, "a2", Decimal("2.25")), (3, "a3", Decimal("3.25"))]
    assert m.types("public_a") == {"id": "integer", "v": "text", "n": "numeric(12,2)"}  # the source's own types
    rows_b = m.rows("public_b", "k")
    assert rows_b[0] == ("x", 0.1, True) and rows_b[1][0] == "y" and rows_b[1][1] != rows_b[1][1]  # NaN stays NaN

    s.transaction((A, "u", {"id": 1, "v": "one", "n": "1.10"}), (A, "d", {"id": 2}), (A, "c", {"id": 9, "v": "nine", "n": None}))
    s.transaction((A, "d", {"id": 9}), (A, "c", {"id": 9, "v": "again", "n": "99999999.99"}), (B, "t", None),
                  (B, "c", {"k": "z", "f": 1e-300, "ok": None}))
    m.epoch(s.batch())
    assert m.rows("public_a", "id") == [(1, "one", Decimal("1.10")), (3, "a3", Decimal("3.25")), (9, "again", Decimal("99999999.99"))]
    assert m.rows("public_b", "k") == [("z", 1e-300, None)]  # the truncate emptied it first
    assert m.commits() == [(0, "mirror.public_a"), (0, "mirror.public_b"), (1, "mirror.public_a"), (1, "mirror.public_b")]
    assert m.staged() == 0

    s.transaction((A, "u", {"id": 3, "v": "three", "n": "3.00"}))
    m.epoch(s.batch())  # public.b did not change: no statement, no commit row for it
    assert m.commits()[-1:] == [(2, "mirror.public_a")]


def test_added_column_and_widened_types_evolve_the_target_in_the_epochs_transaction(pg_url, tmp_path: Path) -> None:
    m = Mirror(tmp_path, pg_url)
    narrow = table_schema("public.w", [("id", "int"), ("s", "varchar(5)"), ("c", "int")], ("id",))
    s = StreamBuilder()
    s.snapshot(narrow, [{"id": 1, "s": "abc", "c": 7}])
    m.epoch(s.batch())
    wide = table_schema("public.w", [("id", "bigint"), ("s", "text"), ("c", "bigint"), ("extra", "numeric(14,2)")], ("id",))
    s.transaction((narrow, "u", {"id": 1, "s": "abcde", "c": 8}))
    s.transaction((wide, "c", {"id": 2**40, "s": "a much longer text", "c": 2**50, "extra": "12.50"}))
    m.epoch(s.batch())
    assert m.types("public_w") == {"id": "bigint", "s": "text", "c": "bigint", "extra": "numeric(14,2)"}
    from decimal import Decimal

    assert m.rows("public_w", "id") == [(1, "abcde", 8, None), (2**40, "a much longer text", 2**50, Decimal("12.50"))]


def test_a_narrowed_type_ends_the_epoch_with_nothing_written_and_after_alter_the_restart_finishes(pg_url, tmp_path: Path) -> None:
    m = Mirror(tmp_path, pg_url)
    wide = table_schema("public.a", [("id", "int"), ("n", "numeric(14,2)")], ("id",))
    s = StreamBuilder()
    # A change announced numeric(14,2), so the narrowing below is one (before any change, a narrower type may
    # be from before an ALTER the snapshot chunk saw: test_a_chunk_read_after_a_widening_in_any_layout_...).
    s.snapshot(wide, [{"id": 1, "n": "1.00"}]).snapshot(B, [{"k": "x", "f": 1.0, "ok": True}])
    m.epoch(s.transaction((wide, "u", {"id": 1, "n": "1.00"})).batch())
    narrowed = table_schema("public.a", [("id", "int"), ("n", "numeric(12,2)")], ("id",))
    s.transaction((B, "u", {"k": "x", "f": 2.0, "ok": True}), (narrowed, "u", {"id": 1, "n": "2.00"}))
    batch = s.batch()
    with pytest.raises(SchemaChangeError) as e:
        m.epoch(batch)
    text = str(e.value)
    assert "source table public.a" in text and "column 'n'" in text and "numeric(12,2)" in text and "numeric(14,2)" in text
    assert "ALTER TABLE mirror.public_a ALTER COLUMN n TYPE numeric(12,2)" in text
    assert m.rows("public_b", "k") == [("x", 1.0, True)]  # nothing of the epoch in any table
    assert m.commits() == [(0, "mirror.public_a"), (0, "mirror.public_b")]
    from flinkish_spark.connectors.postgres.connection import parse_url
    from flinkish_spark.connectors.postgres.orphans import scan

    staged = scan(parse_url(pg_url), m.log())  # what `flinkish orphans` shows meanwhile: the decided epoch's rows
    assert staged and {(e.kind, e.epoch, e.state) for e in staged} == {("staged", 1, "decided")}

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("ALTER TABLE mirror.public_a ALTER COLUMN n TYPE numeric(12,2)")  # what the error says
    m.epoch(batch, epoch=1)  # the restart: the decided epoch is committed again
    from decimal import Decimal

    assert m.rows("public_a", "id") == [(1, Decimal("2.00"))]
    assert m.rows("public_b", "k") == [("x", 2.0, True)]
    assert m.commits()[-2:] == [(1, "mirror.public_a"), (1, "mirror.public_b")]


def test_a_changed_primary_key_is_refused_naming_table_and_fix(pg_url, tmp_path: Path) -> None:
    m = Mirror(tmp_path, pg_url)
    s = StreamBuilder()
    s.snapshot(A, [{"id": 1, "v": "a", "n": "1.00"}])
    m.epoch(s.batch())
    rekeyed = table_schema("public.a", [("id", "int"), ("v", "text"), ("n", "numeric(12,2)")], ("id", "v"))
    s.transaction((rekeyed, "u", {"id": 1, "v": "b", "n": "1.00"}))
    with pytest.raises(SchemaChangeError, match=r"primary key is now \(id, v\).*keyed by \(id\).*PRIMARY KEY"):
        m.epoch(s.batch())


def test_a_kill_between_two_tables_leaves_nothing_and_the_restart_commits_every_table_once(pg_url, tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.postgres import routed

    m = Mirror(tmp_path, pg_url)
    s = StreamBuilder()
    s.snapshot(A, [{"id": 1, "v": "a", "n": "1.00"}]).snapshot(B, [{"k": "x", "f": 1.0, "ok": True}])
    m.epoch(s.batch())
    added = table_schema("public.a", [("id", "int"), ("v", "text"), ("n", "numeric(12,2)"), ("extra", "int")], ("id",))
    s.transaction((added, "u", {"id": 1, "v": "a2", "n": "1.00", "extra": 5}), (B, "u", {"k": "x", "f": 2.0, "ok": True}))
    batch = s.batch()

    kill_at(monkeypatch, routed, "sink.between_tables")
    with pytest.raises(Killed):
        m.epoch(batch)
    assert m.rows("public_a", "id") == [(1, "a", __import__("decimal").Decimal("1.00"))]  # the open transaction is gone
    assert "extra" not in m.types("public_a")  # with its ALTER TABLE
    monkeypatch.undo()
    m.epoch(batch, epoch=1)  # the restart: recover-and-commit of the recorded decision
    m.epoch(batch, epoch=1)  # and a replay of the committed epoch changes nothing
    # the .done marker counts the decision's rows once (a mirror's status: mirror.counts), with their commit time
    assert m.log().read_done(1).figures == {"tables": {"public.a": [0, 1, 0, 1100 * 10**6], "public.b": [0, 1, 0, 1100 * 10**6]}}
    assert m.rows("public_a", "id") == [(1, "a2", __import__("decimal").Decimal("1.00"), 5)]
    assert m.rows("public_b", "k") == [("x", 2.0, True)]
    assert m.commits() == [(0, "mirror.public_a"), (0, "mirror.public_b"), (1, "mirror.public_a"), (1, "mirror.public_b")]
    assert m.staged() == 0


def test_a_kill_before_the_decision_of_a_snapshot_epoch_and_the_restart_commits_its_new_attempt_once(
        pg_url, tmp_path: Path, monkeypatch) -> None:
    """kill -9 after the tasks staged an epoch of snapshot chunks and changes, before its decision: nothing of it in
    a target; the restart's tasks stage the epoch again (new attempts), its commit applies them once, the killed
    attempt's staged rows are deleted. (The MySQL source's mirror kill test killed a PostgreSQL-target mirror
    here in a child driver; the source's replay of a planned snapshot epoch is its Delta run's kill.)"""
    from flinkish_spark.sink import committer

    m = Mirror(tmp_path, pg_url)
    s = StreamBuilder()
    s.snapshot(A, [{"id": 1, "v": "a", "n": "1.00"}]).snapshot(B, [{"k": "x", "f": 1.0, "ok": True}])
    m.epoch(s.batch())
    chunk = s.snapshot(A, [{"id": 2, "v": "b", "n": "2.00"}]).batch()  # a chunk of the snapshot, a task of its own
    s.transaction((A, "u", {"id": 1, "v": "a2", "n": "1.00"}), (B, "d", {"k": "x"}), (B, "c", {"k": "y", "f": 2.0, "ok": False}))
    changes = s.batch()

    kill_at(monkeypatch, committer, "sink.before_decision")
    with pytest.raises(Killed):
        m.epoch(chunk, changes)
    assert m.staged() > 0 and m.log().epochs() == ([0], {0})  # staged by the tasks, nothing decided
    assert m.rows("public_a", "id") == [(1, "a", __import__("decimal").Decimal("1.00"))]
    assert m.commits() == [(0, "mirror.public_a"), (0, "mirror.public_b")]
    monkeypatch.undo()
    m.epoch(chunk, changes, epoch=1)  # the restart: the epoch's tasks again, then its decision and commit
    assert m.rows("public_a", "id") == [(1, "a2", __import__("decimal").Decimal("1.00")),
                                        (2, "b", __import__("decimal").Decimal("2.00"))]
    assert m.rows("public_b", "k") == [("y", 2.0, False)]
    assert m.commits() == [(0, "mirror.public_a"), (0, "mirror.public_b"), (1, "mirror.public_a"), (1, "mirror.public_b")]
    assert m.staged() == 0  # the killed attempt's rows too


def test_the_last_committed_epoch_is_the_newest_of_any_target_and_a_reset_is_refused(pg_url, tmp_path: Path) -> None:
    import shutil

    from flinkish_spark.errors import CheckpointMismatchError
    from flinkish_spark.sink import incarnation

    m = Mirror(tmp_path, pg_url)
    assert m.sink().last_committed_epoch() == -1
    s = StreamBuilder()
    s.snapshot(A, [{"id": 1, "v": "a", "n": "1.00"}]).snapshot(B, [{"k": "x", "f": 1.0, "ok": True}])
    m.epoch(s.batch())
    s.transaction((B, "u", {"k": "x", "f": 2.0, "ok": True}))
    m.epoch(s.batch())
    assert m.sink().last_committed_epoch() == 1
    assert Mirror(tmp_path, pg_url, uid="another").sink().last_committed_epoch() == -1
    shutil.rmtree(m.meta)
    with pytest.raises(CheckpointMismatchError, match="sink uid 'm' has last committed epoch 1 in its target"):
        incarnation.resolve(FileIO.for_url(m.meta), m.log(), m.sink().last_committed_epoch, "q-new", "cp", None,
                            "continueAfterEpoch")


def test_a_snapshot_chunk_read_after_a_widening_does_not_make_the_older_changes_a_narrowing(pg_url, tmp_path: Path) -> None:
    """Snapshot chunks and changes are read side by side: a chunk read after ``numeric(12,2) -> (14,2)``
    widens the target, while the change stream still delivers changes from before the ALTER, announced
    with (12,2). That is no narrowing (found by test_routed_mirror.py: SchemaChangeError in the drain);
    a (12,2) announced after the change stream itself reached (14,2) is."""
    m = Mirror(tmp_path, pg_url)
    old = table_schema("public.c", [("id", "int"), ("amount", "numeric(12,2)")], ("id",))
    new = table_schema("public.c", [("id", "int"), ("amount", "numeric(14,2)")], ("id",))
    s = StreamBuilder()
    s.snapshot(old, [{"id": 1, "amount": "1.00"}])
    m.epoch(s.batch())
    s.snapshot(new, [{"id": 2, "amount": "123456789012.34"}])  # a chunk read after the ALTER
    m.epoch(s.batch())
    assert m.types("public_c")["amount"] == "numeric(14,2)"
    s.transaction((old, "u", {"id": 1, "amount": "1.50"}))  # a change from before the ALTER
    m.epoch(s.batch())
    s.transaction((new, "u", {"id": 1, "amount": "2.50"}))  # the change stream reaches the ALTER
    m.epoch(s.batch())
    from decimal import Decimal

    assert m.rows("public_c", "id") == [(1, Decimal("2.50")), (2, Decimal("123456789012.34"))]
    s.transaction((old, "u", {"id": 1, "amount": "3.00"}))  # now a real narrowing
    with pytest.raises(SchemaChangeError, match="column 'amount' is now numeric\\(12,2\\)"):
        m.epoch(s.batch())


@pytest.mark.parametrize("existing", [False, True], ids=["created-by-the-chunk", "existing"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_chunk_read_after_a_widening_in_any_layout_is_followed_and_a_later_narrowing_refused(
        pg_url, tmp_path: Path, layout: str, existing: bool) -> None:
    """The Delta and Iceberg tests' scenario (flinkish_spark/testing/widening.py): also when the chunk
    read after the ALTER creates the target, or shares its epoch with the older changes."""
    m = Mirror(tmp_path, pg_url)
    w = widening_during_the_snapshot(layout, existing)
    for tasks in w.epochs:
        m.epoch(*tasks)
    assert m.rows("public_w", "id") == [(r["id"], r["n"]) for r in w.rows]
    assert m.types("public_w") == {"id": "bigint", "n": "numeric(14,2)"}
    with pytest.raises(SchemaChangeError, match=r"column 'n' is now numeric\(12,2\).* holds numeric\(14,2\).*narrower"):
        m.epoch(w.narrowing)
    assert m.rows("public_w", "id") == [(r["id"], r["n"]) for r in w.rows]


@pytest.mark.both_postgres
def test_an_unchanged_column_keeps_the_value_of_the_keys_latest_version_in_the_epoch_or_the_target(pg_url, tmp_path: Path) -> None:
    """Rows that list a column unchanged (an update that left a TOASTed value unchanged) do not carry it; the
    target keeps it: from an earlier staged row of the key (any task), else its own stored value."""
    from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD

    d = table_schema("public.d", [("id", "int"), ("n", "int"), ("body", "text")], ("id",))
    m = Mirror(tmp_path, pg_url)
    s = StreamBuilder()
    s.snapshot(d, [{"id": 1, "n": 0, "body": "one"}, {"id": 2, "n": 0, "body": None}])
    m.epoch(s.batch())
    snapshot = s.snapshot(d, [{"id": 3, "n": 0, "body": "three"}]).batch()  # a chunk read in the same epoch
    s.transaction((d, "u", {"id": 1, "n": 1, UNCHANGED_FIELD: ["body"]}),  # the target's row
                  (d, "c", {"id": 4, "n": 0, "body": "four"}), (d, "u", {"id": 4, "n": 1, UNCHANGED_FIELD: ["body"]}),
                  (d, "u", {"id": 3, "n": 1, UNCHANGED_FIELD: ["body"]}),  # the other task's snapshot row
                  (d, "u", {"id": 2, "n": 1, UNCHANGED_FIELD: ["body"]}),  # a null stays null
                  (d, "u", {"id": 5, "n": 1, UNCHANGED_FIELD: ["body"]}))  # nothing holds it: null
    m.epoch(snapshot, s.batch())
    want = [(1, 1, "one"), (2, 1, None), (3, 1, "three"), (4, 1, "four"), (5, 1, None)]
    assert m.rows("public_d", "id") == want
    s.transaction((d, "u", {"id": 4, "n": 2, UNCHANGED_FIELD: ["body"]}), (d, "u", {"id": 2, "n": 2, "body": "new"}),
                  (d, "u", {"id": 2, "n": 3, UNCHANGED_FIELD: ["body"]}))
    again = s.batch()
    m.epoch(again)
    m.epoch(again, epoch=m.epochs - 1)  # the same epoch once more (a replay after a crash): nothing changes
    want[1], want[3] = (2, 3, "new"), (4, 2, "four")
    assert m.rows("public_d", "id") == want
    assert m.staged() == 0
