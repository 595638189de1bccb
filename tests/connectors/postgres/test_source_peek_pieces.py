"""Reading a WAL range in pieces (``changes.peek_pieces``): the same messages as one peek, a piece at a time.

What a big transaction's epoch relies on (docs/postgres-source.md, "Big transactions"): the source's reader and the
enumerator hold one piece, not the range, and read exactly what the one-list peek reads -- so a replay after a kill
reads the same rows.
"""

from __future__ import annotations

import psycopg
import pytest

from flinkish_spark.connectors.postgres.pgoutput import Begin, decode_message, parse_lsn
from flinkish_spark.connectors.postgres.source.changes import peek, peek_pieces


@pytest.mark.both_postgres
def test_a_range_in_pieces_is_the_one_peek_and_a_bounded_peek_stops_after_a_whole_transaction(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pieces FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('pieces', 'pgoutput')")
        try:
            conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 2500) g")  # one big transaction
            conn.execute("UPDATE t SET v = v || '!' WHERE id <= 10")
            conn.execute("DELETE FROM t WHERE id > 2490")
            row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
            assert row is not None
            end = parse_lsn(row[0])

            whole = peek(conn, "pieces", "pieces", end, None)
            pieces = list(peek_pieces(conn, "pieces", "pieces", end, piece=1000))
            assert len(whole) == 2527 and [len(p) for p in pieces] == [1000, 1000, 527]
            assert [m for p in pieces for m in p] == whole
            # Between two pieces the connection takes other queries (the catalog's), and no transaction stays open.
            reading = peek_pieces(conn, "pieces", "pieces", end, piece=1000)
            first = next(reading)
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (2490,)
            with psycopg.connect(pg_url) as other:  # what vacuum waits for: no open transaction of the reader
                assert other.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                                     "pid <> pg_backend_pid() AND backend_xmin IS NOT NULL").fetchone() == (0,)
            assert first + [m for p in reading for m in p] == whole

            # nchanges: whole transactions only -- the first one entire, though it holds 2,500 changes.
            bounded = [m for p in peek_pieces(conn, "pieces", "pieces", end, 1, piece=1000) for m in p]
            assert sum(1 for m in bounded if m[:1] == b"B") == 1 and len(bounded) >= 2500
            assert bounded == whole[:len(bounded)]
            # A reader that stops after the first piece leaves the connection usable, the slot unconsumed.
            stopped = peek_pieces(conn, "pieces", "pieces", end, piece=10)
            assert isinstance(decode_message(next(stopped)[0]), Begin)
            stopped.close()
            assert peek(conn, "pieces", "pieces", end, None) == whole
        finally:
            conn.execute("SELECT pg_drop_replication_slot('pieces')")
