"""flinkish.iceberg with ``{schema}``/``{table}`` routing, in process (no Spark): the multi-table stream's rows,
made by hand, through prepare / the decision log / commit, each target read back with pyiceberg's scan
(and polars' own Iceberg reader where field ids matter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.errors import ConfigError, SchemaChangeError, TableMismatchError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema
from flinkish_spark.testing.widening import LAYOUTS, TABLE, widening_during_the_snapshot
from flinkish_spark.testing.kills import Killed, kill_at

pyiceberg = pytest.importorskip("pyiceberg")

A = table_schema("public.a", [("id", "int"), ("v", "text")], ("id",))
B = table_schema("public.b", [("k", "text"), ("n", "numeric(12,2)")], ("k",))


class Mirror:
    """A routed sink and its decision log; :meth:`epoch` prepares batches (one per task) and commits."""

    def __init__(self, tmp_path: Path, uid: str = "m", create_table: bool = True, merge_mode: str = "mergeOnRead",
                 template: str = "mirror.{schema}_{table}", modes: Any = None, compact_every: int = 0) -> None:
        from flinkish_spark.connectors.iceberg.catalog import catalog_properties

        self.modes, self.compact_every = modes, compact_every
        self.tmp, self.uid, self.create_table, self.merge_mode, self.template = tmp_path, uid, create_table, merge_mode, template
        self.meta = str(tmp_path / "meta")
        self.props = catalog_properties(None, None, None, str(tmp_path / "cp"), {}, "test")
        self.epochs = 0

    def sink(self) -> Any:
        from flinkish_spark.connectors.iceberg.routed import RoutedIcebergSink

        return RoutedIcebergSink(self.props, Route(self.template, "iceberg"), self.uid, {}, self.merge_mode,  # type: ignore[arg-type]
                                 rows_per_file=3, create_table=self.create_table,
                                 metadata_io=FileIO.for_url(self.meta), metadata_dir=self.log().directory,
                                 compact_every=self.compact_every,
                                 **({"modes": self.modes} if self.modes is not None else {}))

    def log(self) -> DecisionLog:
        return DecisionLog(FileIO.for_url(self.meta), self.meta, self.uid)

    def prepare(self, *batches: pa.Table) -> list:
        sink = self.sink()
        return [sink.prepare(iter(b.to_batches()), PrepareContext(self.uid, self.epochs, i, 0))
                for i, b in enumerate(batches)]

    def epoch(self, *batches: pa.Table) -> None:
        prepared = self.prepare(*batches)
        commit_epoch(self.sink(), self.log(), self.epochs, [p for p in prepared if p is not None], "run")
        self.epochs += 1

    def catalog(self) -> Any:
        from flinkish_spark.connectors.iceberg.catalog import load

        return load(self.props)

    def name(self, table: str) -> str:
        return "mirror." + table.replace(".", "_")

    def table(self, table: str) -> Any:
        return self.catalog().load_table(self.name(table))

    def rows(self, table: str, key: str) -> list[dict]:
        import polars as pl

        t = self.table(table)
        got = sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r[key])
        native = pl.scan_iceberg(t, reader_override="native").collect().to_dicts()
        assert sorted(native, key=lambda r: r[key]) == got  # polars resolves columns by field id itself
        return got

    def snapshot(self, table: str) -> int | None:
        if not self.catalog().table_exists(self.name(table)):
            return None
        s = self.table(table).current_snapshot()
        return None if s is None else s.snapshot_id

    def stray_files(self, table: str, epoch: int | None = None) -> set[str]:
        """Files below the target's data folder (or the sink's folder of ``epoch``) that no live data or delete file of it is."""
        t = self.table(table)
        io = FileIO.for_url(t.location())
        named = set()
        for task in t.scan().plan_files():
            named.add(io.strip(task.file.file_path))
            named.update(io.strip(d.file_path) for d in task.delete_files)
        folder = f"{t.location()}/data" + ("" if epoch is None else f"/flinkish/{self.uid}/e{epoch:012d}")
        return set(io.find(folder)) - named

    def epochs_of(self, table: str) -> list[int]:
        return sorted(int(s.summary.additional_properties["flinkish.epoch"]) for s in self.table(table).snapshots()
                      if s.summary.additional_properties.get("flinkish.uid") == self.uid)


def shape(t: Any) -> list[tuple[int, str, str]]:
    return [(f.field_id, f.name, str(f.field_type)) for f in t.schema().fields]


@pytest.mark.parametrize("merge_mode", ["mergeOnRead", "copyOnWrite"])
def test_each_table_is_mirrored_to_its_own_keyed_target_and_quiet_tables_get_no_snapshot(tmp_path: Path, merge_mode: str) -> None:
    m = Mirror(tmp_path, merge_mode=merge_mode)
    s = StreamBuilder()
    snapshot_a = s.snapshot(A, [{"id": i, "v": f"a{i}"} for i in range(1, 6)]).snapshot(B, [{"k": "x", "n": 1.5}]).batch()
    m.epoch(snapshot_a, s.snapshot(B, [{"k": "y", "n": 2}]).batch())  # two tasks, B's chunks in both
    s.transaction((A, "u", {"id": 1, "v": "one"}), (A, "d", {"id": 2}), (A, "c", {"id": 9, "v": "nine"}))
    s.transaction((A, "u", {"id": 1, "v": "uno"}), (A, "d", {"id": 9}), (A, "c", {"id": 9, "v": "again"}))
    b_snapshot = m.snapshot("public.b")
    m.epoch(s.batch())
    assert m.rows("public.a", "id") == [{"id": 1, "v": "uno"}, {"id": 3, "v": "a3"}, {"id": 4, "v": "a4"},
                                        {"id": 5, "v": "a5"}, {"id": 9, "v": "again"}]
    assert m.rows("public.b", "k") == [{"k": "x", "n": pytest.approx(1.5)}, {"k": "y", "n": 2}]
    assert m.snapshot("public.b") == b_snapshot  # an epoch without rows of b writes nothing to b
    t = m.table("public.a")
    assert t.properties["flinkish.primary-key"] == "id" and t.properties["flinkish.source-table"] == "public.a"
    assert t.metadata.format_version == 2
    # A replay of a committed epoch changes nothing (each table's snapshot marker).
    m.epochs -= 1
    m.epoch(s.transaction((A, "d", {"id": 1})).batch())
    assert {r["id"] for r in m.rows("public.a", "id")} == {1, 3, 4, 5, 9}
    assert m.epochs_of("public.a") == [0, 1] and m.epochs_of("public.b") == [0]


def test_added_dropped_and_widened_columns_evolve_the_target(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    a2 = table_schema("public.a", [("id", "int"), ("v", "text"), ("extra", "int")], ("id",))
    a3 = table_schema("public.a", [("id", "int"), ("extra", "bigint")], ("id",))  # v dropped, extra widened
    s.transaction((A, "c", {"id": 2, "v": "b"}))
    s.transaction((a2, "c", {"id": 3, "v": "c", "extra": 7}))
    m.epoch(s.batch())
    m.epoch(s.transaction((a3, "u", {"id": 1, "extra": 2**40})).batch())
    assert shape(m.table("public.a")) == [(1, "id", "int"), (2, "v", "string"), (3, "extra", "long")]
    assert m.rows("public.a", "id") == [{"id": 1, "v": None, "extra": 2**40},  # the dropped column: null from then on
                                        {"id": 2, "v": "b", "extra": None}, {"id": 3, "v": "c", "extra": 7}]


def recreate(m: Mirror, table: str, schema: pa.Schema) -> None:
    """The user's fix of a narrowing: the target created anew with the narrower type, its rows cast."""
    rows = m.table(table).scan().to_arrow().cast(schema)
    m.catalog().drop_table(m.name(table))
    m.catalog().create_table(m.name(table), schema=schema).append(rows)


def test_a_narrowed_type_ends_before_any_table_is_written_and_the_restart_after_the_fix_continues(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    # A change announced numeric(12,2), so the narrowing below is one (before any change, a narrower type may
    # be from before an ALTER the snapshot chunk saw: test_a_chunk_read_after_a_widening_...).
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).snapshot(B, [{"k": "x", "n": 1}]).transaction((B, "u", {"k": "x", "n": 1})).batch())
    narrowed = table_schema("public.b", [("k", "text"), ("n", "numeric(6,2)")], ("k",))
    batch = s.transaction((A, "c", {"id": 2, "v": "b"}), (narrowed, "u", {"k": "x", "n": 3.25})).batch()
    before = (m.snapshot("public.a"), m.snapshot("public.b"))
    with pytest.raises(SchemaChangeError) as err:
        m.epoch(batch)
    text = str(err.value)
    assert "public.b" in text and "'n'" in text and "decimal128(6, 2)" in text and "decimal128(12, 2)" in text
    assert "create the table anew" in text  # what to do
    assert (m.snapshot("public.a"), m.snapshot("public.b")) == before  # nothing of the epoch, in neither table

    recreate(m, "public.b", pa.schema([("k", pa.string()), ("n", pa.decimal128(6, 2))]))
    commit_epoch(m.sink(), m.log(), m.epochs, m.prepare(batch), "run2")
    assert m.rows("public.b", "k") == [{"k": "x", "n": pytest.approx(3.25)}]
    assert m.rows("public.a", "id") == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]
    # (the user's new public.b does not name epoch 0's file: only the fixed epoch's folder counts)
    assert m.stray_files("public.a") == set() and m.stray_files("public.b", epoch=1) == set()


def test_a_decimal_scale_up_is_refused_iceberg_promotes_precision_only(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(B, [{"k": "x", "n": 1}]).batch())
    scaled = table_schema("public.b", [("k", "text"), ("n", "numeric(14,4)")], ("k",))
    with pytest.raises(SchemaChangeError, match=r"'n' is now decimal128\(14, 4\).*precision in place but not its scale"):
        m.epoch(s.transaction((scaled, "u", {"k": "x", "n": 1.2345})).batch())
    wider = table_schema("public.b", [("k", "text"), ("n", "numeric(14,2)")], ("k",))
    m.epochs += 1  # a new query (the refused epoch is left decided but uncommitted in this log: another uid)
    m.uid = "m2"
    m.epoch(s.transaction((wider, "u", {"k": "x", "n": 123456789012.5})).batch())
    assert str(m.table("public.b").schema().find_field("n").field_type) == "decimal(14, 2)"
    assert m.rows("public.b", "k") == [{"k": "x", "n": pytest.approx(123456789012.5)}]


def test_a_changed_primary_key_is_refused_naming_table_and_fix(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    rekeyed = table_schema("public.a", [("id", "int"), ("v", "text")], ("id", "v"))
    with pytest.raises(SchemaChangeError, match=r"public\.a: its primary key is now \(id, v\).*keyed by \(id\).*flinkish\.primary-key"):
        m.epoch(s.transaction((rekeyed, "c", {"id": 2, "v": "b"})).batch())


@pytest.mark.parametrize("merge_mode", ["mergeOnRead", "copyOnWrite"])
def test_truncate_empties_the_target_before_the_later_changes(tmp_path: Path, merge_mode: str) -> None:
    m = Mirror(tmp_path, merge_mode=merge_mode)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": i, "v": "x"} for i in range(1, 8)]).batch())
    m.epoch(s.transaction((A, "u", {"id": 1, "v": "y"})).batch())  # a delete file (mergeOnRead) the truncate removes too
    s.transaction((A, "c", {"id": 7, "v": "before"}))
    s.transaction((A, "t", None))
    s.transaction((A, "c", {"id": 8, "v": "after"}), (A, "c", {"id": 1, "v": "again"}))
    m.epoch(s.batch())
    assert m.rows("public.a", "id") == [{"id": 1, "v": "again"}, {"id": 8, "v": "after"}]
    live = m.table("public.a").scan().plan_files()
    assert all(not task.delete_files for task in live)  # the old files and their deletes are gone, not masked


@pytest.mark.parametrize("merge_mode", ["mergeOnRead", "copyOnWrite"])
def test_a_resnapshot_deletes_the_keys_it_did_not_deliver_at_its_end(tmp_path: Path, merge_mode: str) -> None:
    m = Mirror(tmp_path, merge_mode=merge_mode)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": i, "v": "old"} for i in range(1, 7)]).batch())
    m.epoch(s.marker(A, "B").snapshot(A, [{"id": 1, "v": "new"}, {"id": 2, "v": "new"}]).batch())
    assert len(m.rows("public.a", "id")) == 6  # nothing deleted before the end
    m.epoch(s.snapshot(A, [{"id": 4, "v": "new"}]).marker(A, "E").batch())
    assert m.rows("public.a", "id") == [{"id": 1, "v": "new"}, {"id": 2, "v": "new"}, {"id": 4, "v": "new"}]
    assert not list((Path(m.log().directory) / "resnapshot").glob("*/*.parquet"))  # forgotten after the end
    m.epoch(s.transaction((A, "c", {"id": 5, "v": "later"})).batch())  # after the end, changes apply as usual
    assert [r["id"] for r in m.rows("public.a", "id")] == [1, 2, 4, 5]


def test_a_crash_between_two_tables_commits_the_rest_and_never_reapplies_the_first(tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.iceberg import routed

    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).snapshot(B, [{"k": "x", "n": 1}]).batch())
    batch = s.transaction((A, "u", {"id": 1, "v": "a2"}), (B, "u", {"k": "x", "n": 2})).batch()

    kill_at(monkeypatch, routed, "sink.between_tables")
    with pytest.raises(Killed):
        m.epoch(batch)
    assert m.rows("public.a", "id") == [{"id": 1, "v": "a2"}]  # the first table has the epoch ...
    assert m.rows("public.b", "k") == [{"k": "x", "n": 1}]  # ... the second not yet
    a_snapshot = m.snapshot("public.a")
    monkeypatch.undo()
    m.epoch(batch)  # the restart (the killed epoch is still m.epochs): recover-and-commit of the recorded decision
    assert m.snapshot("public.a") == a_snapshot  # not applied again
    assert m.rows("public.b", "k") == [{"k": "x", "n": 2}]
    assert m.epochs_of("public.a") == [0, 1] and m.epochs_of("public.b") == [0, 1]
    assert m.stray_files("public.a") == set() and m.stray_files("public.b") == set()
    # the .done marker counts the decision's rows once, with their commit time (a mirror's status: mirror.counts)
    assert m.log().read_done(1).figures == {"tables": {"public.a": [0, 1, 0, 1100 * 10**6], "public.b": [0, 1, 0, 1100 * 10**6]}}


def test_a_column_dropped_within_an_epoch_keeps_the_rows_of_both_schemas(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    dropped = table_schema("public.a", [("id", "int")], ("id",))
    s.transaction((A, "c", {"id": 2, "v": "b"}))
    s.transaction((dropped, "c", {"id": 3}), (dropped, "u", {"id": 1}))
    m.epoch(s.batch())
    assert m.rows("public.a", "id") == [{"id": 1, "v": None}, {"id": 2, "v": "b"}, {"id": 3, "v": None}]


def test_a_widened_key_column_still_finds_the_rows_written_with_the_narrower_type(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": i, "v": "a"} for i in range(1, 4)]).batch())
    wide = table_schema("public.a", [("id", "bigint"), ("v", "text")], ("id",))
    m.epoch(s.transaction((wide, "u", {"id": 1, "v": "one"}), (wide, "d", {"id": 2}),
                          (wide, "c", {"id": 2**40, "v": "big"})).batch())
    assert m.rows("public.a", "id") == [{"id": 1, "v": "one"}, {"id": 3, "v": "a"}, {"id": 2**40, "v": "big"}]
    m.epoch(s.transaction((wide, "u", {"id": 2**40, "v": "bigger"}), (wide, "u", {"id": 3, "v": "three"})).batch())
    assert m.rows("public.a", "id") == [{"id": 1, "v": "one"}, {"id": 3, "v": "three"}, {"id": 2**40, "v": "bigger"}]


def test_tasks_that_saw_different_new_columns_get_the_ids_the_commit_gave_them(tmp_path: Path) -> None:
    # Each task writes with the field ids it expects the commit to give its new columns; two tasks
    # with different new columns cannot both be right -- the commit rewrites the files that are not.
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    with_x = table_schema("public.a", [("id", "int"), ("v", "text"), ("x", "text")], ("id",))
    with_y = table_schema("public.a", [("id", "int"), ("v", "text"), ("y", "bigint")], ("id",))
    first = s.transaction((with_x, "c", {"id": 2, "v": "b", "x": "ex"})).batch()
    second = s.transaction((with_y, "c", {"id": 3, "v": "c", "y": 33})).batch()
    m.epoch(first, second)
    assert shape(m.table("public.a")) == [(1, "id", "int"), (2, "v", "string"), (3, "x", "string"), (4, "y", "long")]
    assert m.rows("public.a", "id") == [{"id": 1, "v": "a", "x": None, "y": None},
                                        {"id": 2, "v": "b", "x": "ex", "y": None},
                                        {"id": 3, "v": "c", "x": None, "y": 33}]
    assert m.stray_files("public.a") == set()  # the files written with the wrong ids are gone


def test_create_table_false_names_the_missing_target_and_creates_nothing(tmp_path: Path) -> None:
    m = Mirror(tmp_path, create_table=False)
    s = StreamBuilder()
    with pytest.raises(TableMismatchError, match=r"no Iceberg table 'mirror\.public_a' for source table public\.a and createTable is false"):
        m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    assert m.snapshot("public.a") is None


def test_snapshot_rows_of_an_older_narrower_schema_are_written_into_the_widened_target(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(B, [{"k": "x", "n": 1}]).batch())
    wide = table_schema("public.b", [("k", "text"), ("n", "numeric(14,2)")], ("k",))
    m.epoch(s.transaction((wide, "u", {"k": "x", "n": 123456789012.5})).batch())
    m.epoch(s.snapshot(B, [{"k": "y", "n": 2.25}]).batch())  # the table's second chunk, read with the schema it joined with
    assert m.rows("public.b", "k") == [{"k": "x", "n": pytest.approx(123456789012.5)}, {"k": "y", "n": pytest.approx(2.25)}]


def test_after_a_narrowing_the_users_fix_continues_even_with_rows_of_both_schemas_in_the_epoch(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(B, [{"k": "x", "n": 1}]).batch())
    narrowed = table_schema("public.b", [("k", "text"), ("n", "numeric(6,2)")], ("k",))
    s.transaction((B, "u", {"k": "x", "n": 5}))
    s.transaction((narrowed, "c", {"k": "y", "n": 3.25}))  # ALTER ... TYPE numeric(6,2) between the two
    batch = s.batch()
    with pytest.raises(SchemaChangeError, match=r"'n' is now decimal128\(6, 2\)"):
        m.epoch(batch)
    recreate(m, "public.b", pa.schema([("k", pa.string()), ("n", pa.decimal128(6, 2))]))
    commit_epoch(m.sink(), m.log(), m.epochs, m.prepare(batch), "run2")
    assert m.rows("public.b", "k") == [{"k": "x", "n": 5}, {"k": "y", "n": pytest.approx(3.25)}]


def test_two_source_tables_routed_to_one_target_are_refused_naming_both(tmp_path: Path) -> None:
    public_x = table_schema("public.x", [("id", "int")], ("id",))
    sales_x = table_schema("sales.x", [("id", "int")], ("id",))
    m = Mirror(tmp_path, template="mirror.{table}")
    s = StreamBuilder()
    with pytest.raises(ConfigError, match=r"public\.x and sales\.x both route to mirror\.x.*\{schema\}"):
        m.epoch(s.snapshot(public_x, [{"id": 1}]).snapshot(sales_x, [{"id": 2}]).batch())  # in one epoch
    assert not m.catalog().table_exists("mirror.x")
    m2 = Mirror(tmp_path / "2", template="mirror.{table}")
    m2.epoch(s.snapshot(public_x, [{"id": 1}]).batch())
    with pytest.raises(ConfigError, match=r"public\.x and sales\.x both route to mirror\.x"):
        m2.epoch(s.snapshot(sales_x, [{"id": 2}]).batch())  # in a later epoch
    assert [r["id"] for r in m2.catalog().load_table("mirror.x").scan().to_arrow().to_pylist()] == [1]


def test_an_aborted_epoch_leaves_no_file_of_any_table(tmp_path: Path) -> None:
    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    prepared = m.prepare(s.transaction((A, "c", {"id": 2, "v": "b"})).snapshot(B, [{"k": "x", "n": 1}]).batch())
    m.sink().abort(prepared, m.epochs)
    left = [p for p in (tmp_path / "cp").rglob(f"e{m.epochs:012d}/*") if p.is_file()]
    assert left == []


def test_a_crash_after_the_schema_update_before_the_data_snapshot_continues_without_an_error(tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.iceberg import routed

    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    a2 = table_schema("public.a", [("id", "int"), ("v", "text"), ("extra", "int")], ("id",))
    batch = s.transaction((a2, "u", {"id": 1, "v": "b", "extra": 5}), (B, "c", {"k": "x", "n": 1})).batch()

    kill_at(monkeypatch, routed, "iceberg.routed.after_schema")
    with pytest.raises(Killed):
        m.epoch(batch)
    assert [f.name for f in m.table("public.a").schema().fields] == ["id", "v", "extra"]  # the schema moved ...
    assert m.rows("public.a", "id") == [{"id": 1, "v": "a", "extra": None}] and m.epochs_of("public.a") == [0]  # ... the data not
    monkeypatch.undo()
    m.epoch(batch)
    assert m.rows("public.a", "id") == [{"id": 1, "v": "b", "extra": 5}] and m.epochs_of("public.a") == [0, 1]
    assert m.rows("public.b", "k") == [{"k": "x", "n": 1}] and m.epochs_of("public.b") == [1]


def test_exact_types_arrays_and_a_new_array_column_are_read_back_by_field_id(tmp_path: Path) -> None:
    import datetime as dt

    from flinkish_spark.connectors.postgres.rows import TableSchema, make_column

    cols = (make_column("id", "bigint", "int8", -1, None), make_column("n", "numeric(40,10)", "numeric", ((40 << 16) | 10) + 4, None),
            make_column("ts", "timestamp with time zone", "timestamptz", -1, None), make_column("b", "bytea", "bytea", -1, None),
            make_column("tags", "text[]", "_text", -1, "text"), make_column("d", "date", "date", -1, None),
            make_column("local", "timestamp without time zone", "timestamp", -1, None))
    wide = TableSchema("public.t", cols, ("id",))
    more = TableSchema("public.t", cols + (make_column("nums", "integer[]", "_int4", -1, "int4"),), ("id",))
    m = Mirror(tmp_path)
    s = StreamBuilder()
    row = {"id": 1, "n": "123456789012345678901234567890.0123456789", "ts": "2024-01-01 00:00:00.000001+00",
           "b": "AP8=", "tags": ["t1", "x y"], "d": "2020-01-02", "local": "2024-01-01 12:00:00"}
    m.epoch(s.snapshot(wide, [row]).batch())
    m.epoch(s.transaction((more, "c", {**row, "id": 2, "nums": [1, 2]}), (more, "u", {**row, "tags": None})).batch())
    got = m.rows("public.t", "id")
    assert [r["id"] for r in got] == [1, 2] and got[0]["tags"] is None and got[1]["tags"] == ["t1", "x y"]
    assert got[1]["nums"] == [1, 2] and got[0]["nums"] is None
    assert got[1]["n"] == "123456789012345678901234567890.0123456789"  # beyond decimal(38): the exact text
    assert got[1]["ts"] == dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=dt.timezone.utc) and got[1]["d"] == dt.date(2020, 1, 2)
    assert got[1]["b"] == b"\x00\xff" and got[1]["local"] == dt.datetime(2024, 1, 1, 12)
    fields = {f.name: str(f.field_type) for f in m.table("public.t").schema().fields}
    assert fields["ts"] == "timestamptz" and fields["local"] == "timestamp" and fields["nums"] == "list<int>"


def test_an_existing_target_is_used_with_its_own_field_ids_and_one_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import IntegerType, NestedField, StringType

    m = Mirror(tmp_path)
    catalog = m.catalog()
    catalog.create_namespace("mirror")
    # made by the user, with a column dropped since (its id is not given again)
    t = catalog.create_table("mirror.public_a", Schema(NestedField(7, "id", IntegerType()), NestedField(3, "v", StringType()),
                                                       NestedField(9, "gone", StringType())),
                             properties={"format-version": "2"})
    with t.update_schema() as u:
        u.delete_column("gone")
    s = StreamBuilder()
    a2 = table_schema("public.a", [("id", "int"), ("v", "text"), ("extra", "int")], ("id",))
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    m.epoch(s.transaction((a2, "c", {"id": 2, "v": "b", "extra": 5})).batch())
    assert m.rows("public.a", "id") == [{"id": 1, "v": "a", "extra": None}, {"id": 2, "v": "b", "extra": 5}]
    assert [f.field_id for f in m.table("public.a").schema().fields] == [1, 2, 4]  # 3 was the dropped column's
    files = [task.file.file_path.rsplit("/", 1)[1] for task in m.table("public.a").scan().plan_files()]
    assert not [f for f in files if f.startswith("99999-")]  # the tasks chose the ids the commit gave: no rewrite

    catalog.create_table("mirror.public_b", Schema(NestedField(1, "k", StringType())),
                         partition_spec=PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "k")))
    with pytest.raises(TableMismatchError, match=r"'mirror\.public_b' is partitioned by k, but the sink's tableModes "
                                                 r"give source table public.b no partitionBy; nothing was written"):
        m.epoch(s.snapshot(B, [{"k": "x", "n": 1}]).batch())


def test_another_writer_committing_first_makes_the_epoch_look_its_keys_up_again(tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.iceberg import routed

    m = Mirror(tmp_path)
    s = StreamBuilder()
    m.epoch(s.snapshot(A, [{"id": 1, "v": "a"}]).batch())
    real = routed.commit_snapshot
    raced: list[int] = []

    calls: list[int] = []

    def racing(catalog, table, *args, **kwargs):
        calls.append(1)
        if not raced:  # before our first attempt lands: someone else writes id 2 to the target
            raced.append(1)
            other = catalog.load_table(table.name())
            other.append(pa.table({"id": pa.array([2], pa.int32()), "v": ["theirs"]}))
        return real(catalog, table, *args, **kwargs)

    monkeypatch.setattr(routed, "commit_snapshot", racing)
    m.epoch(s.transaction((A, "u", {"id": 2, "v": "ours"}), (A, "u", {"id": 1, "v": "one"})).batch())
    assert len(calls) == 2  # the first attempt was refused (main moved), the second looked the keys up again
    # the retry saw their row 2 and replaced it: one row per key
    assert m.rows("public.a", "id") == [{"id": 1, "v": "one"}, {"id": 2, "v": "ours"}]
    assert m.epochs_of("public.a") == [0, 1]


def test_the_last_committed_epoch_is_the_newest_in_any_target_and_a_reset_is_refused(tmp_path: Path) -> None:
    """What a reset checkpointLocation is checked against (flinkish_spark/sink/incarnation.py): the newest
    epoch of the uid in any catalog table the route names -- also one the current epoch's tables do not include."""
    import shutil

    from flinkish_spark.errors import CheckpointMismatchError
    from flinkish_spark.sink import incarnation

    m = Mirror(tmp_path)
    assert m.sink().last_committed_epoch() == -1  # no target yet
    s = StreamBuilder()
    s.snapshot(A, [{"id": 1, "v": "a"}]).snapshot(B, [{"k": "x", "n": 1.5}])
    m.epoch(s.batch())
    s.transaction((B, "u", {"k": "x", "n": 2.5}))
    m.epoch(s.batch())  # epoch 1 changes only public.b
    m.catalog().create_namespace_if_not_exists("other")
    m.catalog().create_table("other.public_b", m.table("public.b").schema())  # not a target of the route: not read
    assert m.sink().last_committed_epoch() == 1
    assert Mirror(tmp_path, uid="another").sink().last_committed_epoch() == -1

    shutil.rmtree(m.meta)  # the sink's metadata went with a deleted checkpointLocation
    with pytest.raises(CheckpointMismatchError, match="sink uid 'm' has last committed epoch 1 in its target"):
        incarnation.resolve(FileIO.for_url(m.meta), m.log(), m.sink().last_committed_epoch, "q-new", "cp", None,
                            "continueAfterEpoch")


@pytest.mark.parametrize("existing", [False, True], ids=["created-by-the-chunk", "existing"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_chunk_read_after_a_widening_does_not_make_the_older_changes_a_narrowing(tmp_path: Path, layout: str,
                                                                                   existing: bool) -> None:
    """Chunks and changes are read side by side: a chunk read after ``int -> bigint``, ``numeric(12,2) ->
    (14,2)`` widens (or creates) the target ahead of changes from before the ALTER, announced narrow -- in a
    later epoch or in the same one, either task first. Those fit; a narrowing after the changes reached
    the wide type is refused with nothing written (flinkish_spark/testing/widening.py)."""
    m = Mirror(tmp_path)
    w = widening_during_the_snapshot(layout, existing)
    for tasks in w.epochs:
        m.epoch(*tasks)
    assert m.rows(TABLE, "id") == list(w.rows)
    assert [(name, t) for _, name, t in shape(m.table(TABLE))] == [("id", "long"), ("n", "decimal(14, 2)")]
    snapshot = m.snapshot(TABLE)
    with pytest.raises(SchemaChangeError, match=r"column 'n' is now decimal128\(12, 2\).* holds decimal128\(14, 2\).*narrower"):
        m.epoch(w.narrowing)
    assert m.snapshot(TABLE) == snapshot
