"""The embedded PostgreSQL (the wheel's 18, and the machine's 15 started by the same module): the settings
the connectors need, TCP, restart."""

from __future__ import annotations

import pytest


@pytest.mark.both_postgres
def test_embedded_server_has_two_phase_commit_logical_wal_and_tcp(pg_server) -> None:
    if pg_server.embedded is None:
        pytest.skip("FLINKISH_TEST_POSTGRES_URL names an external server")
    import psycopg

    with psycopg.connect(pg_server.url) as conn:  # TCP on 127.0.0.1
        assert int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0
        assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000
    assert major == pg_server.embedded.version  # the 18 of the wheel, or the machine's 15


@pytest.mark.both_postgres
def test_prepared_transaction_survives_restart(pg_server, pg_url) -> None:
    postgres = pg_server
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
