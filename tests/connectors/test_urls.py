"""The one URL helper both database connectors split passwords off with: the same rules, no password in an error."""

from __future__ import annotations

import pytest

from flinkish_spark.connectors.mysql.connection import parse_url as mysql_url
from flinkish_spark.connectors.postgres.connection import parse_url as pg_url
from flinkish_spark.errors import ConfigError


def test_both_databases_split_the_password_off_the_user_part_and_the_query() -> None:
    assert pg_url("postgresql://a:p%40w@h:5432/db?sslmode=require").url == "postgresql://a@h:5432/db?sslmode=require"
    assert pg_url("postgresql://a@h/db?password=pw&sslmode=require").url == "postgresql://a@h/db?sslmode=require"
    assert pg_url("postgresql://a@h1:5432,h2:5433/db").url == "postgresql://a@h1:5432,h2:5433/db"  # libpq's hosts
    for url in ("mysql://a:p%40w@h:3307/db", "mysql://a@h:3307/db?password=p%40w"):
        info = mysql_url(url)
        assert (info.url, info.password()) == ("mysql://a@h:3307/db", "p@w")


@pytest.mark.parametrize("parse, example", [(pg_url, "postgresql://user@host:5432/db"),
                                            (mysql_url, "mysql://user@host:3306/db")])
def test_a_value_without_its_scheme_is_refused_without_showing_a_password(parse, example) -> None:
    with pytest.raises(ConfigError) as err:
        parse("app:hunter2@db.example/shop", what="--from")
    assert example in str(err.value) and "'app'" in str(err.value) and "hunter2" not in str(err.value)
    with pytest.raises(ConfigError, match="got a value starting with jdbc://"):
        parse("jdbc://app:hunter2@db/shop", what="--from")
