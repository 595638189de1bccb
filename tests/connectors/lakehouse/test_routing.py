"""Routing a multi-table stream (connectors/lakehouse/routing.py): target names, refused options and inputs,
one table's rows as a keyed input (truncate, re-snapshot markers)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.figures import Figures, epoch_figures
from flinkish_spark.connectors.lakehouse.routing import (
    STREAM_COLUMNS, Route, check_stream, is_routed, parse_route, refuse_keyed_options, table_input, task_tables,
)
from flinkish_spark.connectors.postgres.rows import split_tables
from flinkish_spark.errors import ConfigError, SchemaChangeError
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema


def test_placeholders_become_the_source_tables_schema_and_name() -> None:
    route = parse_route("s3://lake/{schema}/{table}", "path", "path", "flinkish.delta sink")
    assert is_routed("s3://lake/{table}") and not is_routed("s3://lake/orders") and not is_routed(None)
    assert route.target("public.orders") == "s3://lake/public/orders"
    assert Route("mirror.{schema}_{table}", "iceberg").target("sales.order_lines") == "mirror.sales_order_lines"


def test_a_path_holds_every_name_and_other_names_that_cannot_be_part_of_the_target_are_refused() -> None:
    route = Route("s3://lake/{schema}/{table}", "path")
    got = {name: route.target(name) for name in ("public.m_a", "public.m_straße", "public.a b", "public.a/b", "public.a~b",
                                                 "public.a%41", "public..", "Sales.x$y.z")}
    assert got == {"public.m_a": "s3://lake/public/m_a", "public.m_straße": "s3://lake/public/m_straße",
                   "public.a b": "s3://lake/public/a~20b", "public.a/b": "s3://lake/public/a~2fb",
                   "public.a~b": "s3://lake/public/a~7eb", "public.a%41": "s3://lake/public/a~2541",
                   "public..": "s3://lake/public/~2e", "Sales.x$y.z": "s3://lake/Sales/x$y.z"}
    assert all(route.matches(target) for target in got.values()) and not route.matches("s3://lake/public/a b")
    with pytest.raises(ConfigError, match=r"'public\.x\.y'.*another Iceberg namespace"):
        Route("mirror.{table}", "iceberg").target("public.x.y")
    with pytest.raises(ConfigError, match="longer than PostgreSQL's 63 bytes"):
        Route("{schema}.mirror_{table}", "postgres").target("public." + "t" * 60)


def test_a_template_without_table_or_with_another_placeholder_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"needs '\{table\}'"):
        parse_route("s3://lake/{schema}", "path", "path", "c")
    with pytest.raises(ConfigError, match=r"placeholder other than \{schema\} and \{table\}"):
        parse_route("s3://lake/{db}/{table}", "path", "path", "c")


def test_keyed_options_and_other_inputs_are_refused_with_routing() -> None:
    with pytest.raises(ConfigError, match=r"option 'key', 'partitionBy' cannot be combined with routing"):
        refuse_keyed_options(lambda o: o in ("mode", "key", "partitionBy"), "flinkish.delta sink", "path")
    refuse_keyed_options(lambda o: o in ("mergeMode", "mode", "deletes", "tableModes"), "flinkish.delta sink", "path")
    with pytest.raises(ConfigError, match=r"option 'key' cannot be combined with routing.*primary key, unpartitioned"):
        refuse_keyed_options(lambda o: o in ("mode", "key"), "flinkish.postgres sink", "table")
    check_stream(list(STREAM_COLUMNS), "c", "path")
    with pytest.raises(ConfigError, match=r"multi-table stream.*writes id, v.*option\('tables'"):
        check_stream(["id", "v"], "flinkish.delta sink", "path")


def test_one_tables_rows_keep_only_what_follows_the_last_truncate_and_report_the_markers() -> None:
    a = table_schema("public.a", [("id", "int"), ("v", "text")], ("id",))
    s = StreamBuilder()
    s.marker(a, "B").snapshot(a, [{"id": 1, "v": "snap"}])
    s.transaction((a, "c", {"id": 2, "v": "x"}))
    s.transaction((a, "t", None))
    s.transaction((a, "c", {"id": 3, "v": "y"}), (a, "d", {"id": 3}))
    got = table_input(split_tables(s.batch())["public.a"].rows)
    assert got.truncate and got.begin and not got.end
    assert got.changes.column_names == ["id", "v", "_op", "_lsn", "_commit_ts", "_unchanged"]
    assert got.truncate_us == 1200 * 1_000_000  # the truncate's commit time (history closes the versions there)
    assert got.changes.select(["id", "_op"]).to_pylist() == [{"id": 3, "_op": "c"}, {"id": 3, "_op": "d"}]
    assert got.lsn == got.changes.column("_lsn")[-1].as_py()
    only_snapshot = table_input(split_tables(StreamBuilder().snapshot(a, [{"id": 1, "v": "s"}]).marker(a, "E").batch())["public.a"].rows)
    assert only_snapshot.end and only_snapshot.lsn == -1 and only_snapshot.changes.column("_lsn").null_count == 1
    assert pa.types.is_int64(only_snapshot.changes.schema.field("_lsn").type)


def test_a_tasks_rows_are_counted_per_table_as_the_stream_carries_them() -> None:
    """What a mirror's status shows per table (mirror.counts): snapshot rows, changes, truncates, the newest
    change's commit time -- every row, also the changes a later truncate of the task empties."""
    a = table_schema("public.a", [("id", "int"), ("v", "text")], ("id",))
    b = table_schema("public.b", [("id", "int")], ("id",))
    s = StreamBuilder()
    s.marker(a, "B").snapshot(a, [{"id": 1, "v": "snap"}, {"id": 2, "v": "snap"}]).snapshot(b, [{"id": 1}])
    s.transaction((a, "c", {"id": 3, "v": "x"}), (b, "u", {"id": 1}))  # lsn 1100
    s.transaction((a, "t", None))  # lsn 1200
    s.transaction((a, "d", {"id": 3}))  # lsn 1300
    got = {name: data.figures for name, _, data in task_tables(s.batch().to_batches())}
    assert got == {"public.a": Figures(2, 2, 1, 1300 * 10**6), "public.b": Figures(1, 1, 0, 1100 * 10**6)}
    parts = [SimpleNamespace(table="public.a", figures=got["public.a"]), SimpleNamespace(table="public.a", figures=Figures(1)),
             SimpleNamespace(table="public.b", figures=got["public.b"])]
    assert epoch_figures(parts) == {"tables": {"public.a": [3, 2, 1, 1300 * 10**6], "public.b": [1, 1, 0, 1100 * 10**6]}}
    assert Figures.from_json(Figures(3, 2, 1, 7).to_json()) == Figures(3, 2, 1, 7) and Figures.from_json(None) == Figures()


def test_a_table_whose_schema_has_no_key_is_one_clear_error_naming_it() -> None:
    """A routed target is applied by key: a schema without one (its primary key dropped while it is followed)
    stops the task with the table and the fix, not an IndexError deep in the key resolution."""
    a = table_schema("public.a", [("id", "int")], ("id",))
    keyless = table_schema("public.k", [("id", "int"), ("v", "text")], ())
    s = StreamBuilder().transaction((a, "c", {"id": 1}), (keyless, "u", {"id": 1, "v": "x"}))
    with pytest.raises(SchemaChangeError, match=r"source table public\.k: .* has no primary key.*ADD PRIMARY KEY.*!public\.k"):
        task_tables(s.batch().to_batches())
    assert [name for name, _, _ in task_tables(StreamBuilder().transaction((a, "c", {"id": 1})).batch().to_batches())] == ["public.a"]


def test_a_task_decoded_in_groups_gives_the_rows_of_one_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sink task decodes its rows a group at a time (a big transaction's texts are never all held): a schema
    change, a truncate and two tables spread over many groups give the same inputs as one decode of the task."""
    import flinkish_spark.connectors.lakehouse.routing as routing

    a1 = table_schema("public.a", [("id", "int"), ("v", "int")], ("id",))
    a2 = table_schema("public.a", [("id", "int"), ("v", "bigint"), ("w", "text")], ("id",))
    b = table_schema("public.b", [("id", "int")], ("id",))
    s = StreamBuilder()
    s.transaction(*[(a1, "c", {"id": i, "v": i}) for i in range(5)], (b, "c", {"id": 1}))
    s.transaction((a1, "u", {"id": 1, "v": 10}), (b, "t", None))
    s.transaction(*[(a2, "u", {"id": i, "v": 2**40 + i, "w": "x"}) for i in range(3)], (b, "c", {"id": 2}))
    s.transaction((a2, "d", {"id": 4}))
    batches = s.batch().to_batches(max_chunksize=2)

    def inputs() -> list[tuple[str, str, Any]]:
        return [(name, schema.to_json(), (d.changes.to_pylist(), d.truncate, d.lsn, d.earlier, d.figures))
                for name, schema, d in task_tables(iter(batches))]

    whole = inputs()
    monkeypatch.setattr(routing, "DECODE_ROWS", 3)
    assert inputs() == whole
    assert [n for n, _, _ in whole] == ["public.a", "public.b"] and whole[1][2][1]  # b's truncate
    rows_a = whole[0][2][0]
    assert len(rows_a) == 10 and rows_a[-4]["v"] == 2**40 and rows_a[0]["w"] is None


def test_a_task_decoded_batch_by_batch_until_a_second_table_or_schema_gives_the_rows_of_one_decode() -> None:
    """A one-table task in stream order is typed a batch at a time as it arrives; from the first batch that brings
    another schema or table on, the rest goes in groups, what was typed before kept: the tables, rows, schemas,
    figures and schema changes of one decode of the whole task (``split_tables``), whichever batch breaks it."""
    from flinkish_spark.connectors.lakehouse.figures import figures_by_table
    from flinkish_spark.connectors.lakehouse.routing import table_input

    a1 = table_schema("public.a", [("id", "int"), ("v", "int")], ("id",))
    a2 = table_schema("public.a", [("id", "int"), ("v", "bigint"), ("w", "text")], ("id",))
    b = table_schema("public.b", [("id", "int")], ("id",))
    for then in ("schema", "table", "none"):
        s = StreamBuilder()
        for t in range(4):
            s.transaction(*[(a1, "c", {"id": t * 10 + i, "v": i}) for i in range(5)])
        if then == "schema":
            s.transaction(*[(a2, "u", {"id": i, "v": 2**40 + i, "w": "x"}) for i in range(3)])
        elif then == "table":
            s.transaction((b, "c", {"id": 1}), (a1, "d", {"id": 3}))
        stream = s.batch()
        figures = figures_by_table(stream)
        want = [(name, t.schema.to_json(), table_input(t.rows).changes.to_pylist(), figures[name])
                for name, t in sorted(split_tables(stream).items())]
        for size in (1, 2, 7, 64):
            got = [(name, schema.to_json(), d.changes.to_pylist(), d.figures)
                   for name, schema, d in task_tables(iter(stream.to_batches(max_chunksize=size)))]
            assert [(n, sch, len(rows), f) for n, sch, rows, f in got] == [(n, sch, len(rows), f) for n, sch, rows, f in want]
            assert repr(got) == repr([(n, sch, rows, f) for n, sch, rows, f in want]), (then, size)
        if then == "schema":
            assert [d.earlier for _, _, d in task_tables(iter(stream.to_batches(max_chunksize=3)))] == [(a1.to_json(),)]


def test_truncates_as_deletes_keeps_the_changes_before_a_truncate_and_deletes_their_keys_at_it() -> None:
    from flinkish_spark.connectors.lakehouse.routing import truncates_as_deletes

    a = table_schema("public.a", [("id", "int"), ("v", "text")], ("id",))
    s = StreamBuilder()
    s.transaction((a, "c", {"id": 1, "v": "x"}), (a, "u", {"id": 1, "v": "y"}), (a, "c", {"id": 2, "v": "z"}))
    s.transaction((a, "t", None))
    s.transaction((a, "c", {"id": 3, "v": "w"}))
    (name, schema, got), = task_tables(s.batch().to_batches())
    whole = truncates_as_deletes(got, schema.key)
    assert [(r["id"], r["v"], r["_op"], r["_lsn"]) for r in whole.select(["id", "v", "_op", "_lsn"]).to_pylist()] == [
        (1, "x", "c", 1100), (1, "y", "u", 1100), (2, "z", "c", 1100), (1, None, "d", 1200), (2, None, "d", 1200),
        (3, "w", "c", 1300)]
    assert truncates_as_deletes(replace(got, whole=None), schema.key) == got.changes
