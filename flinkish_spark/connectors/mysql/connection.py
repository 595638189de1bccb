"""Connecting to MySQL and MariaDB from options: the connection module of the ``flinkish.mysql`` source.

* :func:`parse_url` reads ``mysql://user[:password]@host[:port]/db`` (also ``mariadb://``) into a
  :class:`ConnectionInfo` that never holds the password in its URL: the password is resolved where a
  connection is opened -- from the URL, the variable named by ``passwordEnv``, or ``MYSQL_PWD`` (the
  variable the server's own clients read) -- so it is never pickled into Spark tasks, logged, written
  to metadata or put in an error message (:meth:`ConnectionInfo.mask` scrubs driver messages too).
  The conventions are those of :mod:`flinkish_spark.connectors.postgres.connection`.
* :func:`connect` (PyMySQL, the client of the binary log reader ``mysql-replication``) maps failures to
  :class:`DatabaseAccessError` (terminal: wrong user or password, unknown database, a privilege) and
  :class:`DatabaseUnavailableError` (retryable: server down, restarting, unreachable).

PyMySQL is optional (``pip install 'flinkish_spark[mysql]'``): imported inside :func:`connect`.
"""

from __future__ import annotations

import re
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from flinkish_spark.connectors.passwords import MASK, password_from
from flinkish_spark.connectors.urls import split_password
from flinkish_spark.errors import ConfigError, DatabaseAccessError, DatabaseUnavailableError, EnvironmentSetupError

INSTALL_HINT = "pip install 'flinkish_spark[mysql]'"
DEFAULT_PORT = 3306
PASSWORD_VARIABLE = "MYSQL_PWD"
#: PyMySQL's codes of a session the server ended or cannot keep: shutdown in progress, cannot connect, gone away,
#: lost during a query, lost at the handshake, connection killed (MariaDB).
LOST_CODES = frozenset({1053, 2003, 2006, 2013, 2055, 1927})

# Server error numbers of a refused (not an unreachable) connection: retrying cannot help.
# 1044 access denied to a database, 1045 access denied for a user (wrong password), 1049 unknown
# database, 1698 access denied (socket authentication), 1227 missing privilege, 1251/2059 an
# authentication plugin the client cannot speak.
_ACCESS_CODES = frozenset({1044, 1045, 1049, 1227, 1251, 1698, 2059})
_IDENT = re.compile(r"^[A-Za-z0-9_$]{1,64}$")


def require_pymysql() -> Any:
    try:
        import pymysql
    except ImportError as e:
        raise EnvironmentSetupError(f"the MySQL source needs the package 'PyMySQL': {INSTALL_HINT}") from e
    return pymysql


@dataclass(frozen=True)
class ConnectionInfo:
    """Where to connect, without the password (safe to pickle, log and store)."""

    host: str
    port: int
    user: str
    database: str | None
    password_env: str | None = None  # a variable that holds the password (on every executor too)
    url_password: str | None = field(default=None, repr=False)  # only set when the URL carried one

    def __repr__(self) -> str:
        return f"ConnectionInfo({self.masked!r}, password_env={self.password_env!r})"

    @property
    def masked(self) -> str:
        """The URL as shown in messages and metadata: a password, if the URL had one, as ``***``."""
        return self._render(f":{MASK}" if self.url_password is not None else "")

    @property
    def url(self) -> str:
        """The URL without any password (what a configuration stores; the password travels apart)."""
        return self._render("")

    def _render(self, secret: str) -> str:
        user = urllib.parse.quote(self.user, safe="")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"mysql://{user}{secret}@{host}:{self.port}/{self.database or ''}"

    def password(self) -> str:
        """From the URL, else the variable named by ``passwordEnv``, else ``MYSQL_PWD``, else empty."""
        return password_from(self.url_password, self.password_env, PASSWORD_VARIABLE) or ""

    def mask(self, text: str) -> str:
        """``text`` with the password (from wherever it came) replaced by ``***``."""
        try:
            secret = self.password()
        except ConfigError:
            secret = ""
        if secret:
            text = text.replace(secret, MASK).replace(urllib.parse.quote(secret, safe=""), MASK)
        return text

    def replication_settings(self) -> dict[str, Any]:
        """Keyword arguments for PyMySQL / ``mysql-replication``'s ``connection_settings`` (holds the password:
        pass it to the driver, never to a log or an error)."""
        settings: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user, "passwd": self.password()}
        return settings


def parse_url(url: str, password_env: str | None = None, what: str = "option 'url'") -> ConnectionInfo:
    """Check ``mysql://user[:password]@host[:port][/database]`` and split the password off it
    (:func:`flinkish_spark.connectors.urls.split_password`)."""
    parts, password = split_password(url, ("mysql", "mariadb"), what, "mysql://user@host:3306/db")
    if not parts.hostname:
        raise ConfigError(f"{what} names no host: write mysql://user@host:3306/db")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"{what} has a port that is not a number (1-65535)") from None
    if not parts.username:
        raise ConfigError(f"{what} names no user: write mysql://user@{parts.hostname}:{port}/db")
    database = urllib.parse.unquote(parts.path.lstrip("/")) or None
    if database is not None and not _IDENT.match(database):
        raise ConfigError(f"{what}: the database name {database!r} is not a plain MySQL identifier")
    for key, _value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        raise ConfigError(f"{what}: unknown URL parameter {key!r} (only ?password=... is read)")
    return ConnectionInfo(parts.hostname, port, urllib.parse.unquote(parts.username), database,
                          password_env or None, password)


def error_code(exc: BaseException) -> int | None:
    """A PyMySQL error's server or client code (its first argument), None for another error."""
    return exc.args[0] if exc.args and isinstance(exc.args[0], int) else None


def connection_error(info: ConnectionInfo, exc: BaseException) -> Exception:
    """The flinkish error for a PyMySQL failure to connect, the password scrubbed from its text."""
    code = error_code(exc)
    text = info.mask(str(exc.args[1] if len(exc.args) > 1 else exc).strip())
    if code in _ACCESS_CODES:
        return DatabaseAccessError(
            f"the MySQL server at {info.masked} refused the connection ({code}): {text}. Check the user, the "
            f"password (in the URL, {PASSWORD_VARIABLE} or the variable named by 'passwordEnv') and the database name"
        )
    return DatabaseUnavailableError(
        f"the MySQL server at {info.masked} is unreachable ({code}): {text}. Check that the server runs and that "
        "host and port are right"
    )


def connect(info: ConnectionInfo, database: str | None = None, connect_timeout: int = 10) -> Any:
    """A PyMySQL connection in autocommit mode (the caller closes it); ``database`` overrides the URL's."""
    pymysql = require_pymysql()
    try:
        return pymysql.connect(host=info.host, port=info.port, user=info.user, password=info.password(),
                               database=database or info.database, connect_timeout=connect_timeout,
                               autocommit=True, charset="utf8mb4")
    except pymysql.MySQLError as e:
        raise connection_error(info, e) from None


@contextmanager
def session(info: ConnectionInfo, database: str | None = None) -> Iterator[Any]:
    """:func:`connect` for a block, closed after it. A session the server ends inside the block (a restart, a kill)
    is the retryable :class:`DatabaseUnavailableError`, as a failed connect is -- never the driver's raw
    ``OperationalError``: the mirror's "transient failure" and the retries of the CDC core go by the error's class."""
    conn = connect(info, database)
    try:
        yield conn
    except Exception as e:
        error = lost_session(info, e)
        if error is None:
            raise
        raise error from None
    finally:
        try:
            conn.close()
        except Exception:  # already closed by the server's side: nothing to release
            pass


def lost_session(info: ConnectionInfo, exc: BaseException) -> Exception | None:
    """The :class:`DatabaseUnavailableError` for a PyMySQL error of a session the server ended (:data:`LOST_CODES`),
    else None (the error stands as it is)."""
    code = error_code(exc)
    if type(exc).__module__.startswith("pymysql") and code in LOST_CODES:
        return connection_error(info, exc)
    return None


def lost_sessions_retryable(info: ConnectionInfo, rows: Iterator[Any]) -> Iterator[Any]:
    """``rows`` (a task's read on its own connection) with a session the server ended as
    :class:`DatabaseUnavailableError` (:func:`lost_session`)."""
    try:
        yield from rows
    except Exception as e:
        error = lost_session(info, e)
        if error is None:
            raise
        raise error from None
