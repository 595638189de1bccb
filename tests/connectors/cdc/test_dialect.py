"""PostgreSQL implements the CDC core's dialect protocol: statically (mypy, tests/test_typing.py) and against a server."""

from __future__ import annotations

from pathlib import Path

import psycopg

from flinkish_spark.connectors.cdc.dialect import SourceDialect
from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.cdc.registry import TableEntry
from flinkish_spark.connectors.postgres.source.dialect import PostgresDialect
from flinkish_spark.testing.tables_source import source


def test_the_postgres_dialect_answers_the_core_questions(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE TABLE m_a (id int PRIMARY KEY, v text); INSERT INTO m_a SELECT g, 'x' FROM generate_series(1, 25) g")
        c.execute("CREATE TABLE m_nokey (v text)")
    dialect: SourceDialect = PostgresDialect(source(pg_url, tmp_path, startup="snapshot"))
    assert dialect.format_position(dialect.parse_position("1/2A")) == "1/2A"
    with dialect.connect() as conn:
        found = dialect.find_tables(conn, TablePatterns.parse("public.m_*", "t"))
        assert [(t.name, t.key_problem) for t in found] == [("public.m_a", None), ("public.m_nokey", "it has no primary key")]
        oid = found[0].oid
        assert dialect.table_name(conn, oid) == "public.m_a" and dialect.primary_keys(conn, [oid]) == {oid: ("id",)}
        mark, now = dialect.join_mark(conn), dialect.current_position(conn)
        assert mark.after_xid is not None and dialect.transaction_horizon(conn) >= mark.after_xid  # no one else runs
        assert 0 < mark.position <= now
        sig = dialect.signatures(conn, [oid])[oid]
        conn.execute("ALTER TABLE m_a ADD COLUMN d int DEFAULT 7")  # the existing rows take 7 without row changes
        assert "default value" in (dialect.signature_change(conn, sig, dialect.signatures(conn, [oid])[oid]) or "")
        chunks = dialect.plan_chunks(conn, TableEntry(0, oid, "public", "m_a", "snapshot"), 10)
        assert chunks.bounds == [(None, "11"), ("11", "21"), ("21", None)] and chunks.fields == {"column": "id", "type": "int4"}
