"""Fixtures of the MySQL tests: a fresh database per test on the session's MariaDB (tests/conftest.py ``mariadb``).

PyMySQL comes with the extra ``flinkish_spark[mysql]`` (pulled by ``[test]``): without it the tests are
skipped on a developer's machine and fail under CI, as a missing server does."""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest


@pytest.fixture(autouse=True)
def _require_pymysql(pymysql_installed: None) -> None:
    """Every test here needs PyMySQL, also those that start no server (tests/conftest.py ``pymysql_installed``)."""


@pytest.fixture
def mysql_db(mariadb: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """The name of an empty database for this test (dropped afterwards); ``mariadb.url_for(name)`` is its URL."""
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    mariadb.sql(f"DROP DATABASE IF EXISTS `{name}`; CREATE DATABASE `{name}`")
    yield name
    mariadb.sql(f"DROP DATABASE IF EXISTS `{name}`")
