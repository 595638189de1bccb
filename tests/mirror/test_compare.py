"""flinkish_spark.mirror.compare: a mirror's targets against their source tables, row by row.

Rows in Arrow (fast), Delta targets written by the keyed ``flinkish.delta`` sink (deletion vectors) and by
delta-rs, on a local folder and on moto S3, and the whole comparison against the embedded PostgreSQL.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.table_modes import TableMode
from flinkish_spark.connectors.postgres.rows import TableSchema, decode_rows, make_column
from flinkish_spark.mirror.compare import TableComparison, compare_delta, compare_rows, delta_storage, read_delta

deltalake = pytest.importorskip("deltalake")

SCHEMA = TableSchema("public.t", (
    make_column("id", "bigint", "int8", -1, None),
    make_column("v", "text", "text", -1, None),
    make_column("n", "numeric(10,2)", "numeric", (10 << 16 | 2) + 4, None),
    make_column("f", "double precision", "float8", -1, None),
    make_column("tags", "text[]", "_text", -1, "text"),
), ("id",))

ROWS = [{"id": 1, "v": "a", "n": 1.5, "f": float("nan"), "tags": ["x", "y"]},
        {"id": 2, "v": "b", "n": 2, "f": 0.25, "tags": None},
        {"id": 3, "v": None, "n": None, "f": None, "tags": []}]


def source(rows: list[dict] = ROWS) -> pa.Table:
    return decode_rows([json.dumps(r) for r in rows], SCHEMA)


def test_a_target_with_the_same_rows_is_equal_whatever_its_column_order_extra_columns_and_decimal_scale() -> None:
    target = source().select(["tags", "f", "v", "id"]).append_column("n", pa.array(
        [Decimal("1.5000"), Decimal("2.0000"), None], pa.decimal128(14, 4)))
    target = target.append_column("dropped", pa.array(["x", None, None]))  # a column the table no longer has
    result = compare_rows("public.t", SCHEMA, source(), target)
    assert result == TableComparison("public.t", 3, 3, (), (), ())
    assert result.equal and result.summary() == "equal"  # NaN equals NaN


def test_missing_extra_and_different_keys() -> None:
    target = source([ROWS[0], {**ROWS[1], "tags": ["z"]}, {"id": 4, "v": "d"}])
    result = compare_rows("public.t", SCHEMA, source(), target)
    assert (result.source_rows, result.target_rows) == (3, 3)
    assert (result.missing, result.extra, result.different) == (((3,),), ((4,),), ((2,),))
    assert not result.equal
    assert result.summary() == "1 missing (e.g. (3,)); 1 extra (e.g. (4,)); 1 different (e.g. (2,))"


def test_a_history_or_soft_delete_target_is_compared_by_what_it_holds_now() -> None:
    ts = pa.array([1, 2, 3, 4], pa.timestamp("us", tz="UTC"))
    old_2 = {**ROWS[1], "v": "old"}
    history = source([ROWS[0], old_2, ROWS[1], ROWS[2]]).append_column("_valid_from", ts).append_column(
        "_valid_to", pa.array([None, 3, None, None], pa.timestamp("us", tz="UTC"))).append_column(
        "_current", pa.array([True, False, True, True]))
    assert compare_rows("public.t", SCHEMA, source(), history, TableMode("history", "true")).equal
    assert not compare_rows("public.t", SCHEMA, source(), history).equal  # read as upsert: two versions of key 2
    gone = {"id": 9, "v": "deleted at the source"}
    soft = source([*ROWS, gone]).append_column("_deleted", pa.array([False, False, None, True]))
    assert compare_rows("public.t", SCHEMA, source(), soft, TableMode("upsert", "soft")).equal
    views = soft.cast(pa.schema([f.with_type(pa.string_view()) if f.name == "v" else
                                 f.with_type(pa.list_(pa.string_view())) if f.name == "tags" else f for f in soft.schema]))
    assert compare_rows("public.t", SCHEMA, source(), views, TableMode("upsert", "soft")).equal  # as delta-rs reads
    twice = source([*ROWS, ROWS[0]]).append_column("_deleted", pa.array([False, False, False, True]))
    assert compare_rows("public.t", SCHEMA, source(), twice, TableMode("upsert", "soft")).duplicated == ((1,),)
    kept = source([*ROWS, gone])  # deletes=false: a key the table no longer has is not extra; a missing one is missing
    assert compare_rows("public.t", SCHEMA, source(), kept, TableMode("upsert", "false")).equal
    assert compare_rows("public.t", SCHEMA, source(), kept.slice(1), TableMode("upsert", "false")).missing == ((1,),)


def test_a_key_the_target_holds_twice_is_a_difference_even_with_equal_values() -> None:
    """A row written twice (an epoch applied twice) is what a mirror must never do: the last of the two equal to
    the source's row is no excuse."""
    result = compare_rows("public.t", SCHEMA, source(), source([*ROWS, ROWS[1]]))
    assert (result.duplicated, result.equal) == (((2,),), False)
    assert result.summary() == "1 duplicated (e.g. (2,))"


def test_no_target_and_a_column_the_target_lacks() -> None:
    result = compare_rows("public.t", SCHEMA, source(), None)
    assert (result.target_rows, result.missing, result.equal, result.summary()) == (None, ((1,), (2,), (3,)), False,
                                                                                    "no target")
    without_f = source().drop_columns(["f"])  # an ADD COLUMN not followed: counts as null
    assert compare_rows("public.t", SCHEMA, source(), without_f).different == ((1,), (2,))
    nulls = source([{**r, "f": None} for r in ROWS])
    assert compare_rows("public.t", SCHEMA, nulls, without_f).equal


def test_a_keyed_delta_target_is_read_with_its_deletion_vectors(tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.testing.changes import SCHEMA as CHANGES, Change, Model, run_epoch

    path = str(tmp_path / "t")
    sink = DeltaSink.at(path, uid="u", schema=CHANGES, mode="upsert", key="id", deletes="true")
    epochs = [[Change(k, "r", f"v{k}", None) for k in range(1, 21)],
              [Change(3, "d", None, 10), Change(4, "u", "changed", 11), Change(30, "c", "new", 12)]]
    model = Model("upsert", "true")
    for epoch, changes in enumerate(epochs):
        assert run_epoch(sink, epoch, changes) == "COMMITTED"
        model.apply(changes)
    assert len(pa.table(deltalake.DeltaTable(path).deletion_vectors())) > 0  # rows 3 and 4 are marked, not rewritten
    schema = TableSchema("public.c", (make_column("id", "bigint", "int8", -1, None),
                                      make_column("v", "text", "text", -1, None),
                                      make_column("n", "integer", "int4", -1, None)), ("id",))
    wanted = pa.Table.from_pylist(model.table(), schema=schema.arrow_schema())
    target = read_delta(path)
    assert target is not None and target.num_rows == 20
    assert compare_rows("public.c", schema, wanted, target).equal
    stale = pa.Table.from_pylist([r for r in model.table() if r["id"] != 30], schema=schema.arrow_schema())
    assert compare_rows("public.c", schema, stale, target).extra == ((30,),)
    assert read_delta(str(tmp_path / "nothing")) is None


@pytest.mark.s3
def test_a_delta_target_on_s3_is_read_with_the_sinks_storage_options(s3_proc: str) -> None:
    storage = delta_storage("s3://test/lake/public/t", {"endpointUrl": s3_proc})
    assert storage["AWS_ENDPOINT_URL"] == s3_proc and storage["AWS_ALLOW_HTTP"] == "true"
    deltalake.write_deltalake("s3://test/lake/public/t", source(), storage_options=storage)
    target = read_delta("s3://test/lake/public/t", storage)
    assert target is not None and compare_rows("public.t", SCHEMA, source(), target).equal
    assert read_delta("s3://test/lake/public/none", storage) is None
    assert delta_storage("/local/lake", {"endpointUrl": s3_proc}) == {}


def test_compare_delta_reads_every_matching_table_of_the_server(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE m_a (id int PRIMARY KEY, v text, ts timestamptz, b bytea, n numeric(12,2));"
                     "INSERT INTO m_a SELECT g, 'a' || g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1.5 s',"
                     "  decode(md5(g::text), 'hex'), g / 3.0 FROM generate_series(1, 50) g;"
                     "CREATE TABLE m_b (k text PRIMARY KEY, j jsonb);"
                     "INSERT INTO m_b SELECT 'k' || g, jsonb_build_object('g', g) FROM generate_series(1, 5) g;"
                     "CREATE TABLE m_c (id int PRIMARY KEY);"
                     "CREATE TABLE other (id int PRIMARY KEY);")
    lake = tmp_path / "lake"
    # m_a mirrored exactly (the stream's types), m_b with one row missing, m_c without a target.
    from flinkish_spark.mirror.compare import source_rows

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for table, keep in (("public.m_a", None), ("public.m_b", 4)):
            schema, rows = source_rows(conn, table)
            deltalake.write_deltalake(str(lake / "public" / table.split(".")[1]), decode_rows(rows[:keep], schema))
    results = {r.table: r for r in compare_delta(pg_url, "public.m_*", str(lake))}
    assert list(results) == ["public.m_a", "public.m_b", "public.m_c"]  # never 'other'
    assert results["public.m_a"] == TableComparison("public.m_a", 50, 50, (), (), ())
    assert (results["public.m_b"].source_rows, results["public.m_b"].target_rows) == (5, 4)
    assert len(results["public.m_b"].missing) == 1 and not results["public.m_b"].equal
    assert (results["public.m_c"].target_rows, results["public.m_c"].source_rows) == (None, 0)
    # the same with the --to template spelled out
    assert [r.equal for r in compare_delta(pg_url, "public.m_a", str(lake / "{schema}" / "{table}"))] == [True]


def test_a_matching_table_the_mirror_does_not_follow_for_want_of_a_key_is_not_compared(pg_url: str, tmp_path: Path) -> None:
    """A table without a usable key is left out of a mirror with a warning (docs/mirror.md): compare leaves it out
    too, instead of ending with a ValueError for the whole comparison."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE k_a (id int PRIMARY KEY); INSERT INTO k_a VALUES (1);"
                     "CREATE TABLE k_nokey (x int); INSERT INTO k_nokey VALUES (1), (1);"
                     "CREATE TABLE k_full (x int); ALTER TABLE k_full REPLICA IDENTITY FULL")
    from flinkish_spark.mirror.compare import source_rows

    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema, rows = source_rows(conn, "public.k_a")
        deltalake.write_deltalake(str(tmp_path / "lake" / "public" / "k_a"), decode_rows(rows, schema))
    assert [(r.table, r.equal) for r in compare_delta(pg_url, "public.k_*", str(tmp_path / "lake"))] == [
        ("public.k_a", True)]
