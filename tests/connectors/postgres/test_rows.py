"""The multi-table stream's row format: the same JSON from a snapshot chunk and from a change, exact typed values back.

A table with one column of every kind is read twice -- as the snapshot query builds its
rows on the server (``row_sql``) and as the change reader builds them from pgoutput's text
(``RowEncoder``, from a real slot) -- and the two must be identical, byte for byte. Then
pyarrow's decoder and Spark's ``from_json`` with the table's schema must give back the values
PostgreSQL holds (numeric(40,10) and 50-digit numerics as exact text, timestamptz to the
microsecond, bytea, int[]/text[], json text, uuid, date, interval), and ``split_tables`` must
bring rows of an old and a new schema of one table to one typed table.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from flinkish_spark.connectors.postgres.pgoutput import decode_changes
from flinkish_spark.connectors.postgres.rows import (
    RowEncoder, TableSchema, decode_rows, make_column, mirror_rows, net_changes, row_sql, split_tables,
)
from flinkish_spark.connectors.postgres.rows.encode import SESSION_SETTINGS
from flinkish_spark.connectors.postgres.source.catalog import RelationSchemas, load_table_schema, psycopg_query, table_oid

COLUMNS = """id bigint PRIMARY KEY, i2 smallint, n numeric(12,2), n40 numeric(40,10), nn numeric, f4 real, f8 double precision,
  b boolean, t text, ch char(4), u uuid, j json, jb jsonb, d date, ts timestamp, tstz timestamptz, iv interval, ba bytea,
  ai int[], at text[], an numeric(10,2)[], af float8[], atz timestamptz[], m money2, e mood, aa int[]"""
ROWS = [
    r"""(1, -32768, 12.30, 123456789012345678901234567890.0123456789, 12345678901234567890123456789012345678901234567890.5,
    3.4e38, 0.1, true, E'quote " back \\ nl \n tab \t é ✓ ctrl \x01', 'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
    '{"a":  [1, 2.50]}', '{"b": 1.000000000000000000000000000000000000001}', '2024-02-29', '2024-01-02 03:04:05.123456',
    '2024-01-02 03:04:05.123456+05:30', '1 year 2 mons 3 days 04:05:06.5', '\x00ff10', '{1,NULL,3}',
    '{"a b","NULL",NULL,"q\"x","c\\d",""}', '{1.50,NaN}', '{1.5,NaN,-Infinity,1e300}',
    '{"2024-01-01 00:00:00+00"}', 12.5, 'ok', '[0:1][1:2]={{1,2},{3,4}}')""",
    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL, NULL)",
    r"""(3, 0, 'NaN', -0.0000000001, 'NaN', '-Infinity', 'NaN', false, '', '', NULL, 'null', '[]', '-infinity', 'infinity',
    '0044-03-15 10:00:00+00 BC', '-1 days', '\x', '{}', '{}', '{}', '{}', '{}', -1, 'sad', '{}')""",
]


def session(url: str) -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=True)
    for k, v in SESSION_SETTINGS.items():
        conn.execute(f"SET {k} = '{v}'")
    return conn


def make_table(conn: psycopg.Connection) -> TableSchema:
    conn.execute("CREATE DOMAIN money2 AS numeric(10,2)")
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    conn.execute(f"CREATE TABLE everything ({COLUMNS})")
    schema = load_table_schema(psycopg_query(conn), table_oid(conn, "everything", "test"))
    assert schema is not None
    return schema


@pytest.mark.both_postgres
def test_snapshot_and_change_rows_are_the_same_json_byte_for_byte(pg_url: str) -> None:
    with session(pg_url) as conn:
        schema = make_table(conn)
        conn.execute("CREATE PUBLICATION p FOR TABLE everything")
        conn.execute("SELECT pg_create_logical_replication_slot('rows_test', 'pgoutput')")
        conn.execute("INSERT INTO everything VALUES " + ", ".join(ROWS))
        snapshot = [r[0] for r in conn.execute(f"SELECT {row_sql(schema)} FROM everything ORDER BY id").fetchall()]
        messages = [bytes(r[0]) for r in conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('rows_test', NULL, NULL, 'proto_version', '1', "
            "'publication_names', 'p')").fetchall()]
        relations = RelationSchemas(psycopg_query(conn))
        changes = []
        for change in decode_changes(messages):
            assert relations.schema(change.relation).schema_id == schema.schema_id  # the same schema, the same id
            changes.append(RowEncoder(schema).encode(change.values))
        conn.execute("SELECT pg_drop_replication_slot('rows_test')")
    assert len(snapshot) == 3
    assert changes == snapshot
    assert json.loads(snapshot[0].replace("NaN", "null").replace("-Infinity", "null"))["ch"] == "ab  "  # char(n) keeps its padding
    by_type = {c.name: (c.encoding, c.spark_type) for c in schema.columns}
    assert by_type["n"] == ("number", "decimal(12,2)")
    assert by_type["n40"] == by_type["nn"] == ("string", "string")  # beyond Spark's decimal: exact text
    assert by_type["m"] == ("number", "decimal(10,2)")  # a domain is its base type
    assert by_type["ai"] == ("array", "array<int>") and by_type["atz"] == ("string", "string")


def expected_first_row() -> dict[str, Any]:
    return {
        "id": 1, "i2": -32768, "n": Decimal("12.30"), "n40": "123456789012345678901234567890.0123456789",
        "nn": "12345678901234567890123456789012345678901234567890.5", "f8": 0.1, "b": True,
        "t": 'quote " back \\ nl \n tab \t é ✓ ctrl \x01', "ch": "ab  ", "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "j": '{"a":  [1, 2.50]}', "jb": '{"b": 1.000000000000000000000000000000000000001}', "d": date(2024, 2, 29),
        "ts": datetime(2024, 1, 2, 3, 4, 5, 123456), "tstz": datetime(2024, 1, 1, 21, 34, 5, 123456, tzinfo=timezone.utc),
        "iv": "1 year 2 mons 3 days 04:05:06.5", "ba": b"\x00\xff\x10", "ai": [1, None, 3],
        "at": ["a b", "NULL", None, 'q"x', "c\\d", ""], "an": [Decimal("1.50"), None], "e": "ok", "m": Decimal("12.50"),
    }


def test_typed_decoding_gives_back_exact_values(pg_url: str) -> None:
    with session(pg_url) as conn:
        schema = make_table(conn)
        conn.execute("INSERT INTO everything VALUES " + ", ".join(ROWS))
        rows = [r[0] for r in conn.execute(f"SELECT {row_sql(schema)} FROM everything ORDER BY id").fetchall()]
    table = decode_rows(rows, schema)
    assert table.schema == schema.arrow_schema()
    first, empty, edge = table.to_pylist()
    expected = expected_first_row()
    assert {k: first[k] for k in expected} == expected
    assert first["aa"] is None  # two dimensions in a column typed one-dimensional: null (the JSON text keeps it)
    assert all(v is None for k, v in empty.items() if k != "id")
    # Values no Arrow type holds become null; the JSON text keeps them.
    assert edge["n"] is None and edge["d"] is None and edge["ts"] is None and edge["tstz"] is None
    assert edge["f8"] != edge["f8"] and edge["n40"] == "-0.0000000001" and edge["j"] == "null" and edge["ba"] == b""


def test_spark_from_json_with_the_table_schema_gives_the_same_values(spark: Any, pg_url: str) -> None:
    with session(pg_url) as conn:
        schema = make_table(conn)
        conn.execute("INSERT INTO everything VALUES " + ROWS[0])
        row = conn.execute(f"SELECT {row_sql(schema)} FROM everything").fetchone()[0]
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    stream = spark.createDataFrame([("public.everything", "r", None, None, None, schema.schema_id, row)],
                                   "_table string, _op string, _lsn bigint, _seq int, _commit_ts timestamp, "
                                   "_schema_id string, row string")
    (got,) = mirror_rows(stream, schema).collect()
    expected = expected_first_row()
    expected["tstz"] = expected["tstz"].replace(tzinfo=None)  # Spark hands out session-time-zone (UTC) datetimes
    expected["an"] = None  # Spark nulls the whole array when one element (NaN) does not fit its decimal type
    assert {k: got[k] for k in expected} == expected
    # The same columns filtered and projected in SQL with the schema the helper gives.
    stream.createOrReplaceTempView("stream")
    (sql_row,) = spark.sql(f"SELECT r.n, r.n40, r.ba FROM (SELECT from_json(row, '{schema.spark_ddl()}') AS r FROM stream "
                           "WHERE _table = 'public.everything') WHERE r.ai[0] = 1").collect()
    assert (sql_row.n, sql_row.n40, bytes(sql_row.ba)) == (Decimal("12.30"), expected["n40"], b"\x00\xff\x10")


def col(name: str, pg: str, display: str) -> Any:
    return make_column(name, display, pg, -1, None)


V1 = TableSchema("public.t", (col("id", "int4", "integer"), col("gone", "text", "text")), ("id",))
V2 = TableSchema("public.t", (col("id", "int8", "bigint"), col("added", "bool", "boolean")), ("id",))


def stream_batch(rows: list[tuple[Any, ...]]) -> pa.Table:
    """Stream rows (_table, _op, _lsn, _seq, _schema_id, row) as the Arrow table a sink gets."""
    return pa.table({
        "_table": [r[0] for r in rows], "_op": [r[1] for r in rows], "_lsn": pa.array([r[2] for r in rows], pa.int64()),
        "_seq": pa.array([r[3] for r in rows], pa.int32()), "_commit_ts": pa.nulls(len(rows), pa.timestamp("us", tz="UTC")),
        "_schema_id": [r[4] for r in rows], "row": [r[5] for r in rows],
    })


def test_split_tables_brings_old_and_new_schema_rows_to_one_typed_table() -> None:
    v1, v2 = V1, V2
    other = TableSchema("public.o", (col("k", "text", "text"),), ("k",))
    rows = [
        ("public.t", "s", None, None, v1.schema_id, v1.to_json()), ("public.t", "r", None, None, v1.schema_id, '{"id":1,"gone":"x"}'),
        ("public.o", "s", 10, 0, other.schema_id, other.to_json()), ("public.o", "c", 10, 1, other.schema_id, '{"k":"a"}'),
        ("public.t", "u", 11, 0, v1.schema_id, '{"id":1,"gone":"y"}'),
        ("public.t", "s", 12, 0, v2.schema_id, v2.to_json()), ("public.t", "c", 12, 1, v2.schema_id, '{"id":5000000000,"added":true}'),
        ("public.t", "d", 13, 0, v2.schema_id, '{"id":1}'), ("public.t", "t", 14, 0, v2.schema_id, None),
    ]
    tables = split_tables(stream_batch(rows))
    assert set(tables) == {"public.t", "public.o"}
    t = tables["public.t"]
    assert [s.schema_id for s in t.schemas] == [v1.schema_id, v2.schema_id] and t.schema == v2
    assert t.rows.column_names == ["id", "added", "gone", "_op", "_lsn", "_seq", "_commit_ts", "_unchanged"]
    assert t.rows.schema.field("id").type == pa.int64()  # widened to the newest type
    assert [(r["_op"], r["id"], r["added"], r["gone"]) for r in t.rows.to_pylist()] == [
        ("r", 1, None, "x"), ("u", 1, None, "y"), ("c", 5000000000, True, None), ("d", 1, None, None), ("t", None, None, None),
    ]
    assert tables["public.o"].rows.column("k").to_pylist() == ["a"]


def test_rows_naming_a_schema_without_its_s_row_are_refused() -> None:
    batch = pa.table({"_table": ["public.t"], "_op": ["c"], "_lsn": pa.array([1], pa.int64()), "_seq": pa.array([0], pa.int32()),
                      "_commit_ts": pa.nulls(1, pa.timestamp("us", tz="UTC")), "_schema_id": ["abc"], "row": ['{"id":1}']})
    with pytest.raises(ValueError, match="public.t name schemas \\['abc'\\] without an 's' row"):
        split_tables(batch)


def test_net_changes_keep_each_keys_last_row_and_start_over_after_a_truncate() -> None:
    s1, s2 = (V1.schema_id, V1.to_json()), (V2.schema_id, V2.to_json())
    rows = [
        ("public.t", "s", None, None, *s1), ("public.t", "r", None, None, s1[0], '{"id":1,"gone":"x"}'),
        ("public.t", "r", None, None, s1[0], '{"id":2,"gone":"x"}'),
        ("public.t", "u", 10, 0, s1[0], '{"id":1,"gone":"y"}'), ("public.t", "d", 10, 1, s1[0], '{"id":2}'),
        ("public.t", "s", 11, 0, *s2), ("public.t", "c", 11, 1, s2[0], '{"id":2,"added":true}'),
        ("public.t", "c", 11, 2, s2[0], '{"id":3,"added":false}'), ("public.t", "d", 12, 0, s2[0], '{"id":3}'),
    ]
    net = net_changes(split_tables(stream_batch(rows))["public.t"])
    assert (net.truncate, net.key, net.resnapshot_begin, net.resnapshot_end) == (False, ("id",), False, False)
    assert net.upserts.to_pylist() == [{"id": 1, "added": None, "gone": "y"}, {"id": 2, "added": True, "gone": None}]
    assert net.deletes.to_pylist() == [{"id": 3}]
    truncated = rows + [("public.t", "t", 13, 0, s2[0], None), ("public.t", "c", 14, 0, s2[0], '{"id":9,"added":true}')]
    net = net_changes(split_tables(stream_batch(truncated))["public.t"])
    assert net.truncate and net.upserts.column("id").to_pylist() == [9] and net.deletes.num_rows == 0


def test_an_update_that_did_not_carry_a_column_lists_it_and_split_tables_gives_the_list() -> None:
    from flinkish_spark.connectors.postgres.rows import UNCHANGED, UNCHANGED_FIELD, RowEncoder
    from flinkish_spark.testing.stream_rows import table_schema

    t = table_schema("public.t", [("id", "int"), ("n", "int"), ("body", "text")], ("id",))
    text = RowEncoder(t).encode({"id": "1", "n": "2", "body": None}, unchanged=["body"])
    assert json.loads(text) == {"id": 1, "n": 2, UNCHANGED_FIELD: ["body"]}  # no value for it, and its name
    rows = [("public.t", "s", 10, 0, t.schema_id, t.to_json()), ("public.t", "c", 10, 1, t.schema_id, '{"id":1,"n":1,"body":"b"}'),
            ("public.t", "u", 11, 0, t.schema_id, text)]
    got = split_tables(stream_batch(rows))["public.t"].rows.to_pylist()
    assert [(r["_op"], r["n"], r["body"], r[UNCHANGED]) for r in got] == [("c", 1, "b", None), ("u", 2, None, ["body"])]
