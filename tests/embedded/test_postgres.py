"""The embedded PostgreSQL: the settings the connectors need, TCP, restart."""

from __future__ import annotations

import pytest


def test_embedded_server_has_two_phase_commit_logical_wal_and_tcp(postgres) -> None:
    if postgres.embedded is None:
        pytest.skip("FLINKISH_TEST_POSTGRES_URL names an external server")
    import psycopg

    with psycopg.connect(postgres.url) as conn:  # TCP on 127.0.0.1
        assert int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0
        assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"


def test_prepared_transaction_survives_restart(postgres, pg_url) -> None:
    if postgres.embedded is None:
        pytest.skip("an external server cannot be restarted by the tests")
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'embedded-test'")
    postgres.embedded.restart()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
        conn.execute("COMMIT PREPARED 'embedded-test'")
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1
