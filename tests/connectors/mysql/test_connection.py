"""``mysql://`` URLs, where the password comes from, what a refused or unreachable server says (never the password)."""

from __future__ import annotations

import pickle

import pytest

from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.errors import ConfigError, DatabaseAccessError, DatabaseUnavailableError


def test_url_parts_and_defaults() -> None:
    info = parse_url("mysql://app@db.example:3307/shop")
    assert (info.host, info.port, info.user, info.database) == ("db.example", 3307, "app", "shop")
    info = parse_url("mariadb://root@127.0.0.1")
    assert (info.port, info.database) == (3306, None)


@pytest.mark.parametrize("url, words", [
    ("postgresql://u@h/db", "mysql://user@host:3306/db"),
    ("mysql://h:3306/db", "names no user"),
    ("mysql://u@h:x/db", "port"),
    ("mysql://u@h/db?ssl=1", "unknown URL parameter 'ssl'"),
    ("mysql://u@h/my-db", "not a plain MySQL identifier"),
])
def test_bad_urls_say_what_to_write(url: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_url(url)


def test_the_password_is_in_no_repr_pickle_or_message(monkeypatch: pytest.MonkeyPatch) -> None:
    info = parse_url("mysql://app:s3cr%40t@h:3306/shop")
    assert info.password() == "s3cr@t"
    for text in (repr(info), info.masked, str(pickle.loads(pickle.dumps(info)))):
        assert "s3cr" not in text
    assert info.masked == "mysql://app:***@h:3306/shop"
    assert info.mask("Access denied (using password: s3cr@t)") == "Access denied (using password: ***)"
    assert parse_url("mysql://app@h/db?password=pw").password() == "pw"

    monkeypatch.setenv("MYSQL_PWD", "from-mysql-pwd")
    assert parse_url("mysql://app@h/db").password() == "from-mysql-pwd"
    monkeypatch.setenv("SHOP_PW", "from-env")
    assert parse_url("mysql://app@h/db", password_env="SHOP_PW").password() == "from-env"
    with pytest.raises(ConfigError, match="'NOT_SET_ANYWHERE', which is not set"):
        parse_url("mysql://app@h/db", password_env="NOT_SET_ANYWHERE").password()


def test_wrong_password_is_an_access_error_without_the_password(mariadb, mysql_db: str) -> None:
    mariadb.sql("CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'right-one'; "
                f"GRANT ALL ON `{mysql_db}`.* TO 'app'@'%'")
    with connect(parse_url(f"mysql://app:right-one@127.0.0.1:{mariadb.port}/{mysql_db}")) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT DATABASE()")
            assert cur.fetchone()[0] == mysql_db
    with pytest.raises(DatabaseAccessError, match="refused the connection") as refused:
        connect(parse_url(f"mysql://app:wrong-one@127.0.0.1:{mariadb.port}/{mysql_db}"))
    assert "wrong-one" not in str(refused.value) and "mysql://app:***@" in str(refused.value)
    with pytest.raises(DatabaseAccessError, match="Unknown database"):
        connect(parse_url(f"mysql://root@127.0.0.1:{mariadb.port}/no_such_db"))


def test_no_server_is_retryable() -> None:
    from flinkish_spark.embedded.mariadb import free_port

    with pytest.raises(DatabaseUnavailableError, match="unreachable") as err:
        connect(parse_url(f"mysql://root:pw@127.0.0.1:{free_port()}/db"), connect_timeout=2)
    assert err.value.retryable


def test_a_connection_lost_mid_session_is_retryable_not_a_raw_driver_error(mariadb, mysql_db: str) -> None:
    """A server restarted under a running mirror drops its open sessions: the dialect's next query on one is the
    retryable DatabaseUnavailableError (the mirror says "a transient failure" and the same command continues),
    not PyMySQL's OperationalError 2013 (found by the MySQL kill test at a server restart)."""
    from flinkish_spark.connectors.mysql.dialect import MysqlDialect

    info = parse_url(f"mysql://root@127.0.0.1:{mariadb.port}/{mysql_db}")
    dialect = MysqlDialect(info)
    with pytest.raises(DatabaseUnavailableError, match="unreachable|lost") as err:
        with dialect.connect() as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT CONNECTION_ID()")
                mariadb.sql(f"KILL {cur.fetchone()[0]}")
                cur.execute("SELECT 1")
    assert err.value.retryable
