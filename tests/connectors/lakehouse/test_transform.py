"""Transforms (columns chosen, row filter, computed columns): parsing, evaluation and the rules, without Spark."""

from __future__ import annotations

import json
import pickle
from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routing import table_input
from flinkish_spark.connectors.lakehouse.transform.hooks import transform_input, transform_stream
from flinkish_spark.connectors.lakehouse.transform.parse import parse_expression, parse_projection
from flinkish_spark.connectors.lakehouse.transform.rules import Transforms, parse_transforms
from flinkish_spark.connectors.postgres.rows import TableSchema, split_tables
from flinkish_spark.connectors.postgres.rows.schema import make_column
from flinkish_spark.errors import ChangeDataError, ConfigError

UTC = timezone.utc
SCHEMA = TableSchema("public.users", (
    make_column("id", "integer", "int4", -1, None), make_column("name", "text", "text", -1, None),
    make_column("country", "text", "text", -1, None), make_column("password_hash", "text", "text", -1, None),
    make_column("amount", "numeric(10,2)", "numeric", (10 << 16 | 2) + 4, None),
    make_column("born", "date", "date", -1, None)), ("id",))


def rules(*rules: dict) -> Transforms:
    return parse_transforms({"transforms": json.dumps(list(rules))}.get, "test")


def evaluate(text: str, rows: pa.Table) -> list:
    v = parse_expression(text, "test").evaluate(rows)
    return v.as_py() if isinstance(v, pa.Scalar) else v.to_pylist()


ROWS = pa.table({"a": pa.array([1, 5, None], pa.int32()), "s": ["ab", "Xy", None],
                 "d": pa.array([Decimal("1.50"), Decimal("20.00"), None], pa.decimal128(10, 2)),
                 "ts": pa.array([datetime(2026, 1, 2, 3, 4, tzinfo=UTC), None, datetime(2025, 12, 31, tzinfo=UTC)],
                                pa.timestamp("us", tz="UTC"))})


@pytest.mark.parametrize("text, expected", [
    ("a + 1", [2, 6, None]), ("a / 2", [0.5, 2.5, None]), ("-a * 2", [-2, -10, None]),
    ("a > 2 AND s IS NOT NULL", [False, True, False]), ("a > 2 OR s IS NULL", [False, True, True]),
    ("NOT a = 1", [False, True, None]), ("a IN (1, 2)", [True, False, None]), ("a BETWEEN 2 AND 9", [False, True, None]),
    ("s LIKE 'a%'", [True, False, None]), ("s ILIKE 'x%'", [False, True, None]),
    ("CASE WHEN a > 2 THEN 'big' WHEN a = 1 THEN 'one' ELSE 'none' END", ["one", "big", "none"]),
    ("if(a > 2, 1, 0)", [0, 1, 0]), ("coalesce(a, 0)", [1, 5, 0]), ("upper(s) || '-' || a", ["AB-1", "XY-5", None]),
    ("concat(lower(s), '!')", ["ab!", "xy!", None]), ("length(trim(s))", [2, 2, None]),
    ("substring(s, 2, 1)", ["b", "y", None]), ("CAST(a AS string)", ["1", "5", None]),
    ("d > 10", [False, True, None]), ("CAST(d AS double)", [1.5, 20.0, None]),
    ("ts >= '2026-01-01'", [True, None, False]), ("year(ts)", [2026, None, 2025]), ("month(ts)", [1, None, 12]),
    ("to_date(ts)", [date(2026, 1, 2), None, date(2025, 12, 31)]), ("date_format(ts, 'yyyy-MM')", ["2026-01", None, "2025-12"]),
    ("'x'", "x"), ("A + 1", [2, 6, None]),  # column names case-insensitive, as Spark
    ("a % 2 = 0", [False, False, None]), ("-a % 3", [-1, -2, None]), ("pmod(-a, 3)", [2, 1, None]),
    ("mod(a, -3)", [1, 2, None]), ("d % 3", [Decimal("1.50"), Decimal("2.00"), None]),
    ("a = 1 OR 10 % (a - 1) = 2", [True, True, None]), ("if(a = 1, 0, 10 % (a - 1))", [0, 2, None]),  # guarded
])
def test_expressions_evaluate_as_spark_sql(text: str, expected: object) -> None:
    assert evaluate(text, ROWS) == expected


@pytest.mark.parametrize("text, says", [
    ("current_timestamp()", "not deterministic"), ("rand()", "not deterministic"),
    ("foo(a)", "foo is not supported"), ("a IN (SELECT 1)", "IN takes a list of literals"),
    ("sum(a)", "aggregate"), ("a +", "is not a Spark SQL expression"), ("CAST(a AS map<string,int>)", "CAST to"),
    ("t.a = 1", "without a table"), ("pmod(a)", "pmod takes two arguments"),
])
def test_unsupported_constructs_are_refused_at_start_naming_them(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        rules({"tables": "public.*", "filter": text})


def test_projection_forms_of_flink_cdc_and_databricks() -> None:
    p = parse_projection("*, upper(name) AS uname, __table_name__ AS t", "x")
    assert (p.columns, p.exclude, [n for n, _ in p.computed]) == (None, (), ["uname", "t"])
    p = parse_projection("* EXCEPT (password_hash, born)", "x")
    assert (p.columns, p.exclude) == (None, ("password_hash", "born"))
    assert parse_projection("id, name", "x").columns == ("id", "name")
    with pytest.raises(ConfigError, match="needs a name"):
        parse_projection("id, upper(name)", "x")


def test_bad_rules_are_one_error_each() -> None:
    with pytest.raises(ConfigError, match="unknown key.*'primary-keys'"):
        rules({"tables": "public.*", "primary-keys": "id"})
    with pytest.raises(ConfigError, match="not both"):
        rules({"tables": "public.*", "columns": "id", "columns.exclude": "name"})
    with pytest.raises(ConfigError, match="no 'tables'"):
        rules({"filter": "true"})
    with pytest.raises(ConfigError, match="not JSON"):
        parse_transforms({"transforms": "[{"}.get, "test")


def test_the_schema_a_target_sees_and_the_errors_naming_the_table() -> None:
    t = rules({"tables": "public.users", "columns.exclude": ["password_hash"],
               "computed": {"source": "_source_table", "changed": "_commit_ts", "total": "amount * 2"}})
    schema = t.of("public.users").schema(SCHEMA)
    assert schema.names == ("id", "name", "country", "amount", "born", "source", "changed", "total")
    assert [c.spark_type for c in schema.columns[5:]] == ["string", "timestamp", "decimal(12,2)"]
    assert [c.type for c in schema.columns[5:]] == ["text", "timestamp with time zone", "numeric(12,2)"]
    assert t.of("public.other") is None
    with pytest.raises(ConfigError, match="source table public.users: .*leaves out its key column.*id"):
        rules({"tables": "public.users", "columns.exclude": "id"}).of("public.users").schema(SCHEMA)
    with pytest.raises(ConfigError, match="names column.*nope \\(in the filter 'nope > 1'\\).*its columns: id, name"):
        rules({"tables": "public.*", "filter": "nope > 1"}).of("public.users").schema(SCHEMA)
    with pytest.raises(ConfigError, match="computes column.*name"):
        rules({"tables": "public.*", "computed": ["name = upper(name)"]}).of("public.users").schema(SCHEMA)
    with pytest.raises(ConfigError, match=r"the filter 'name % 2 = 0' cannot be evaluated over the table's column "
                                          r"types \(% takes numbers, not string and int32\)"):
        rules({"tables": "public.*", "filter": "name % 2 = 0"}).of("public.users").schema(SCHEMA)  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="CAST\\(NULL AS <type>\\)"):
        rules({"tables": "public.*", "computed": {"x": "NULL"}}).of("public.users").schema(SCHEMA)


def _changes(rows: list[dict]) -> pa.Table:
    """Rows of SCHEMA as task_tables gives them."""
    data = SCHEMA.arrow_schema()
    cols = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in data}
    cols.update({"_op": pa.array([r["_op"] for r in rows]), "_lsn": pa.array([r.get("_lsn") for r in rows], pa.int64()),
                 "_seq": pa.array([r.get("_lsn") and 0 for r in rows], pa.int32()),
                 "_commit_ts": pa.array([r.get("ts") for r in rows], pa.timestamp("us", tz="UTC")),
                 "_unchanged": pa.array([r.get("_unchanged") for r in rows], pa.list_(pa.string()))})
    return pa.table(cols)


T1 = datetime(2026, 11, 26, 12, tzinfo=UTC)
ROW_CHANGES = [
    {"_op": "r", "id": 1, "name": "a", "country": "DE", "password_hash": "h1"},
    {"_op": "r", "id": 2, "name": "b", "country": "FR", "password_hash": "h2"},  # not matching: skipped
    {"_op": "u", "id": 1, "name": "a2", "country": "FR", "password_hash": "h1", "_lsn": 10, "ts": T1},  # leaves
    {"_op": "u", "id": 2, "name": "b2", "country": "DE", "password_hash": "h2", "_lsn": 11, "ts": T1},  # enters
    {"_op": "c", "id": 3, "name": "c", "country": None, "password_hash": "h3", "_lsn": 12, "ts": T1},  # null: no match
    {"_op": "d", "id": 2, "_lsn": 13, "ts": T1},  # a delete stays a delete
]


def test_rows_enter_and_leave_the_filter_and_excluded_columns_are_gone() -> None:
    t = rules({"tables": "public.users", "projection": "* EXCEPT (password_hash), _op AS op, _commit_ts AS at",
               "filter": "country = 'DE'"})
    out = table_input(split_tables(_stream(ROW_CHANGES))["public.users"].rows)
    schema, data = transform_input(t, "public.users", SCHEMA, out)
    got = data.changes.to_pylist()
    assert "password_hash" not in schema.names and "password_hash" not in data.changes.column_names
    assert [(r["_op"], r["id"], r["name"], r["op"], r["at"]) for r in got] == [
        ("r", 1, "a", "r", None), ("d", 1, None, None, None), ("u", 2, "b2", "u", T1), ("d", 3, None, None, None),
        ("d", 2, None, None, None)]
    # the JSON stream of the PostgreSQL sink: the same rows, in the transformed schema
    stream = transform_stream(t, _stream(ROW_CHANGES))
    again = split_tables(stream)["public.users"]
    assert again.schema.names == schema.names
    assert [(r["_op"], r["id"], r["name"], r["op"]) for r in again.rows.to_pylist()] == [
        (r["_op"], r["id"], r["name"], r["op"]) for r in got]


def test_a_filter_over_a_value_the_update_did_not_carry_stops_with_the_fix() -> None:
    t = rules({"tables": "public.users", "filter": "name <> 'x'"})
    rows = _changes([{"_op": "u", "id": 1, "country": "DE", "_lsn": 1, "_unchanged": ["name"]}])
    with pytest.raises(ConfigError, match="REPLICA IDENTITY FULL"):
        t.of("public.users").rows(SCHEMA, rows)
    # an excluded column an update did not carry is no longer named
    t = rules({"tables": "public.users", "columns.exclude": "password_hash"})
    out = t.of("public.users").rows(SCHEMA, _changes([{"_op": "u", "id": 1, "_lsn": 1,
                                                       "_unchanged": ["password_hash", "name"]}]))
    assert out.column("_unchanged").to_pylist() == [["name"]]


def test_rules_survive_pickling_into_tasks() -> None:
    t = rules({"tables": "public.*", "filter": "country = 'DE'", "computed": {"u": "upper(name)"}})
    again = pickle.loads(pickle.dumps(t))
    rows = _changes([{"_op": "r", "id": 1, "name": "a", "country": "DE"}])
    assert again.of("public.users").rows(SCHEMA, rows).column("u").to_pylist() == ["A"]


def _stream(rows: list[dict]) -> pa.Table:
    from flinkish_spark.connectors.postgres.rows.packed import _row_json
    from flinkish_spark.connectors.postgres.source.stream_rows import STREAM_ARROW

    def ts(r: dict) -> object:
        return r.get("ts")
    out = [{"_table": SCHEMA.table, "_op": "s", "_lsn": None, "_seq": None, "_commit_ts": None,
            "_schema_id": SCHEMA.schema_id, "row": SCHEMA.to_json()}]
    for r in rows:
        typed = {**{c: None for c in SCHEMA.names}, **r}
        out.append({"_table": SCHEMA.table, "_op": r["_op"], "_lsn": r.get("_lsn"), "_seq": 0 if r.get("_lsn") else None,
                    "_commit_ts": ts(r), "_schema_id": SCHEMA.schema_id, "row": _row_json(SCHEMA, typed)})
    return pa.Table.from_pylist(out, schema=STREAM_ARROW)


def test_a_tables_current_rows_as_its_transformed_target_must_hold_them() -> None:
    """What `flinkish mirror compare` compares a transformed target with: matching rows, kept and computed columns;
    a computed column of the change's metadata is not known from the table, so not compared."""
    from flinkish_spark.connectors.lakehouse.transform.hooks import as_target

    t = rules({"tables": "public.users", "columns": "id, name", "filter": "country = 'DE'",
               "computed": {"u": "upper(name)", "at": "_commit_ts", "src": "__table_name__"}})
    rows = SCHEMA.arrow_schema().empty_table().from_pylist(
        [{"id": 1, "name": "a", "country": "DE"}, {"id": 2, "name": "b", "country": "FR"}], schema=SCHEMA.arrow_schema())
    schema, got = as_target(t, "public.users", SCHEMA, rows)
    assert schema.names == ("id", "name", "u", "src") and got.to_pylist() == [{"id": 1, "name": "a", "u": "A", "src": "users"}]
    assert as_target(t, "public.other", SCHEMA, rows) == (SCHEMA, rows)


def test_a_column_added_within_a_task_and_read_by_a_computed_column() -> None:
    """The older schema of the task lacks the column the computed column reads: it takes the newest's computed
    columns (its rows are typed in the newest schema), in the Delta/Iceberg path and in PostgreSQL's stream alike."""
    from flinkish_spark.connectors.lakehouse.routing import task_tables
    from flinkish_spark.connectors.postgres.rows.packed import _row_json
    from flinkish_spark.connectors.postgres.source.stream_rows import STREAM_ARROW

    v1 = TableSchema("public.users", SCHEMA.columns[:2], ("id",))
    v2 = TableSchema("public.users", (*SCHEMA.columns[:2], make_column("extra", "integer", "int4", -1, None)), ("id",))
    rows = [{"_table": "public.users", "_op": "s", "_lsn": 1, "_seq": 0, "_schema_id": v1.schema_id, "row": v1.to_json()},
            {"_table": "public.users", "_op": "u", "_lsn": 1, "_seq": 1, "_schema_id": v1.schema_id,
             "row": _row_json(v1, {"_op": "u", "id": 1, "name": "a"})},
            {"_table": "public.users", "_op": "s", "_lsn": 2, "_seq": 0, "_schema_id": v2.schema_id, "row": v2.to_json()},
            {"_table": "public.users", "_op": "u", "_lsn": 2, "_seq": 1, "_schema_id": v2.schema_id,
             "row": _row_json(v2, {"_op": "u", "id": 1, "name": "b", "extra": 4})}]
    stream = pa.Table.from_pylist(rows, schema=STREAM_ARROW)
    t = rules({"tables": "public.users", "computed": {"more": "extra + 1"}, "columns.exclude": "name"})
    [(name, schema, data)] = task_tables(stream.to_batches())
    schema, data = transform_input(t, name, schema, data)
    assert schema.names == ("id", "extra", "more") and data.changes.column("more").to_pylist() == [None, 5]
    assert [TableSchema.from_json(e).names for e in data.earlier] == [("id", "more")]
    again = split_tables(transform_stream(t, stream))["public.users"]
    assert [s.names for s in again.schemas] == [("id", "more"), ("id", "extra", "more")]
    assert again.rows.column("more").to_pylist() == [None, 5]


def test_a_value_an_expression_cannot_compute_stops_naming_the_table_and_rule() -> None:
    t = rules({"tables": "public.users", "computed": {"n": "CAST(name AS int)"}})
    with pytest.raises(ChangeDataError, match=r"source table public.users: transforms rule for 'public.users' cannot "
                                              r"compute a row's value: .*abc"):
        t.of("public.users").rows(SCHEMA, _changes([{"_op": "r", "id": 1, "name": "abc"}]))


def test_a_modulo_filter_splits_rows_and_a_zero_divisor_stops_unless_guarded() -> None:
    """``id % 2 = 0`` keeps the even keys; an unguarded zero divisor stops naming the table and the rule (Spark's
    ANSI error), a guarded one (``b <> 0 AND ...``, ``try_mod``) is evaluated only where it may divide."""
    changes = _changes([{"_op": "r", "id": i, "name": str(i), "amount": Decimal(i % 3)} for i in range(1, 7)])

    def kept(predicate: str) -> list[int]:
        rule = rules({"tables": "public.users", "filter": predicate}).of("public.users")
        assert rule is not None
        return [r["id"] for r in rule.rows(SCHEMA, changes).to_pylist() if r["_op"] == "r"]
    assert kept("id % 2 = 0") == [2, 4, 6]
    with pytest.raises(ChangeDataError, match=r"source table public.users: transforms rule for 'public.users' "
                                              r"cannot compute a row's value: remainder by zero .*try_mod"):
        kept("id % amount = 0")
    for guarded in ("amount <> 0 AND id % amount = 0", "try_mod(id, amount) = 0",
                    "CASE WHEN amount = 0 THEN false ELSE id % amount = 0 END"):
        assert kept(guarded) == [1, 2, 4], guarded


def test_the_column_wise_json_writer_writes_what_the_stream_writer_does() -> None:
    from flinkish_spark.connectors.lakehouse.transform.json_rows import json_rows
    from flinkish_spark.connectors.postgres.rows.packed import _row_json
    from flinkish_spark.testing.stream_rows import table_schema

    schema = table_schema("public.x", [("id", "bigint"), ("s", "text"), ("n", "numeric(12,2)"), ("f", "float8"),
                                       ("ok", "bool")], ("id",))
    schema = TableSchema(schema.table, (*schema.columns, make_column("d", "date", "date", -1, None),
                                        make_column("ts", "timestamp with time zone", "timestamptz", -1, None),
                                        make_column("b", "bytea", "bytea", -1, None),
                                        make_column("tags", "text[]", "_text", -1, "text")), schema.key)
    rows = [{"_op": "r", "id": 1, "s": 'q"é\n', "n": Decimal("-1.50"), "f": 0.1, "ok": True, "d": date(2026, 1, 2),
             "ts": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "b": b"\x00\xff", "tags": ["a", None]},
            {"_op": "u", "id": 2, "s": None, "n": None, "f": float("nan"), "ok": False, "_unchanged": ["b", "tags"]},
            {"_op": "d", "id": 3}, {"_op": "t"}]
    typed = pa.Table.from_pylist([{c: r.get(c) for c in (*schema.names, "_op", "_unchanged")} for r in rows],
                                 schema=pa.schema([*schema.arrow_schema(), pa.field("_op", pa.string()),
                                                   pa.field("_unchanged", pa.list_(pa.string()))]))
    assert json_rows(schema, typed) == [_row_json(schema, r) for r in typed.to_pylist()]
