"""Records ``stream_rows_pg18.json``: pgoutput messages of a real server and the stream rows they gave.

``test_source_stream_rows.py`` decodes the recorded messages with today's code and compares every
row, byte for byte, with the rows recorded here (by the code of the day the file was made): a faster
decoder must give the same stream. Run it again only when the stream format changes on purpose::

    PYTHONPATH=. python tests/connectors/postgres/stream_fixture.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURE = Path(__file__).with_name("stream_rows_pg18.json")
sys.path.insert(0, str(Path(__file__).parent))

#: What the messages hold: every column kind of test_rows (NULLs, NaN, infinities, BC, arrays, bytea),
#: updates, a key change, deletes, unchanged TOASTed values under default and FULL identity, a key change
#: under FULL, a column added mid-stream, a truncate, a table the patterns leave out, 2 transactions of one row.
SCENARIO = [
    "INSERT INTO everything VALUES {rows}",
    "UPDATE everything SET t = 'changed', ai = '{{7,8}}' WHERE id = 1",
    "UPDATE everything SET id = 4 WHERE id = 2",
    "DELETE FROM everything WHERE id = 3",
    "INSERT INTO docs VALUES (1, 0, repeat('x', 5000)), (2, 0, repeat('y', 5000)), (3, 0, NULL)",
    "UPDATE docs SET n = 1 WHERE id = 1",
    "UPDATE docs SET n = 2, body = 'short' WHERE id = 2",
    "INSERT INTO full_docs VALUES (1, 0, repeat('z', 5000)), (2, 0, repeat('w', 5000))",
    "UPDATE full_docs SET n = 1 WHERE id = 1",
    "UPDATE full_docs SET id = 3 WHERE id = 2",
    "DELETE FROM full_docs WHERE id = 1",
    "INSERT INTO other VALUES (1)",
    "ALTER TABLE docs ADD COLUMN extra numeric",
    "INSERT INTO docs VALUES (4, 4, 'four', 'NaN'), (5, 5, NULL, '-Infinity')",
    "UPDATE docs SET n = 10 WHERE id = 1",
    "TRUNCATE docs",
    "INSERT INTO everything (id, tstz, d) VALUES (5, 'infinity', '0001-01-01 BC')",
]


def record() -> None:
    import psycopg

    from flinkish_spark.connectors.postgres.pgoutput import Relation, relations_in
    from flinkish_spark.connectors.postgres.rows.encode import SESSION_SETTINGS
    from flinkish_spark.connectors.postgres.source.catalog import RelationSchemas, psycopg_query
    from flinkish_spark.connectors.cdc.patterns import TablePatterns
    from flinkish_spark.connectors.postgres.source.tables_reader import stream_batches
    from flinkish_spark.embedded.postgres import start_postgres
    from test_rows import ROWS, make_table

    work = tempfile.mkdtemp(prefix="stream-fixture-")
    pg = start_postgres(os.path.join(work, "data"))
    try:
        with psycopg.connect(pg.uri, autocommit=True) as conn:
            for k, v in SESSION_SETTINGS.items():
                conn.execute(f"SET {k} = '{v}'")
            make_table(conn)
            conn.execute("CREATE TABLE docs (id int PRIMARY KEY, n int, body text)")
            conn.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
            conn.execute("CREATE TABLE full_docs (id int PRIMARY KEY, n int, body text)")
            conn.execute("ALTER TABLE full_docs ALTER COLUMN body SET STORAGE EXTERNAL")
            conn.execute("ALTER TABLE full_docs REPLICA IDENTITY FULL")
            conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
            conn.execute("CREATE PUBLICATION p FOR TABLE everything, docs, full_docs, other")
            conn.execute("SELECT pg_create_logical_replication_slot('fixture', 'pgoutput')")
            for statement in SCENARIO:
                conn.execute(statement.format(rows=", ".join(ROWS)))
            messages = [bytes(r[0]) for r in conn.execute(
                "SELECT data FROM pg_logical_slot_peek_binary_changes('fixture', NULL, NULL, 'proto_version', '1', "
                "'publication_names', 'p')").fetchall()]
            relations = relations_in(messages)
            patterns = TablePatterns.parse("public.*, !public.other", "fixture")
            schemas = RelationSchemas(psycopg_query(conn))
            schemas.prepare(relations.values())
            resolved: list[dict[str, Any]] = []

            def resolve(rel: Relation) -> Any:
                schema = schemas.schema(rel) if patterns.matches(f"{rel.namespace}.{rel.name}") else None
                resolved.append({"relid": rel.relid, "columns": [c.name for c in rel.columns],
                                 "schema": None if schema is None else schema.to_json()})
                return schema

            src = SimpleNamespace(component="fixture", slot_name="fixture")
            rows = [b.to_pylist() for b in stream_batches(src, messages, 0, 1 << 63, relations, resolve)]
    finally:
        pg.stop()
    flat = [dict(r, _commit_ts=None if r["_commit_ts"] is None else r["_commit_ts"].isoformat()) for b in rows for r in b]
    FIXTURE.write_text(json.dumps({"messages": [m.hex() for m in messages], "resolved": resolved, "rows": flat},
                                  indent=0, ensure_ascii=False) + "\n")
    print(f"wrote {FIXTURE}: {len(messages)} messages, {len(flat)} rows")


if __name__ == "__main__":
    record()
