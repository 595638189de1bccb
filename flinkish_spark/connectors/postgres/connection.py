"""Connecting to PostgreSQL from options: the one connection module of ``flinkish.postgres``,
for both directions (the sink writing, the source reading snapshot chunks and its slot).

* :func:`parse_url` reads a libpq URI (``postgresql://user[:password]@host[:port]/db[?...]``)
  into a :class:`ConnectionInfo` that never holds the password: it is resolved where a
  connection is opened, from the URI, the variable named by ``passwordEnv`` or
  ``PGPASSWORD``, so it is never pickled into Spark tasks, logged, written to metadata
  or put in an error message (:meth:`ConnectionInfo.mask` scrubs driver messages too).
* :func:`connect` (psycopg) and :func:`adbc_connect` (ADBC, Arrow bulk load) map
  connection failures to :class:`DatabaseUnavailableError` (retryable: server down or
  restarting) and :class:`DatabaseAccessError` (terminal: authentication, role, database).
* :func:`pg_type_for` / :func:`arrow_type_for` / :func:`compatible` map Spark and Arrow
  types to PostgreSQL ones and back.

psycopg and the ADBC driver are optional (``pip install 'flinkish_spark[postgres]'``):
they are imported inside the functions, so importing this module needs neither.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from flinkish_spark.connectors.passwords import MASK, password_from
from flinkish_spark.connectors.urls import split_password
from flinkish_spark.errors import ConfigError, DatabaseAccessError, DatabaseUnavailableError, EnvironmentSetupError

INSTALL_HINT = "pip install 'flinkish_spark[postgres]'"
#: The oldest server both connectors support (``server_version_num``): 13 has ``wal_status`` in
#: ``pg_replication_slots`` and ``publish_via_partition_root``; 12 has neither. Newer columns
#: (``conflicting`` 16, ``invalidation_reason`` 17, publication column lists and row filters 15)
#: are read only where the server has them.
MIN_SERVER_VERSION = 130000

# Messages of a refused (not an unreachable) connection: retrying cannot help.
_ACCESS_DENIED = re.compile(
    r"password authentication failed|authentication failed|role \".*\" does not exist|"
    r"database \".*\" does not exist|no password supplied|permission denied|pg_hba\.conf",
    re.IGNORECASE,
)


def require_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as e:
        raise EnvironmentSetupError(f"the PostgreSQL connectors need the package 'psycopg': {INSTALL_HINT}") from e
    return psycopg


def require_adbc() -> Any:
    try:
        import adbc_driver_postgresql.dbapi as adbc
    except ImportError as e:
        raise EnvironmentSetupError(
            f"the PostgreSQL connectors need the package 'adbc-driver-postgresql': {INSTALL_HINT}"
        ) from e
    return adbc


@dataclass(frozen=True)
class ConnectionInfo:
    """Where to connect, without the password (safe to pickle, log and store)."""

    url: str  # the libpq URI with any password removed
    password_env: str | None = None  # a variable that holds the password (on every executor too)
    url_password: str | None = None  # only set when the URI carried one; never shown (repr=False below)

    def __repr__(self) -> str:
        return f"ConnectionInfo({self.masked!r}, password_env={self.password_env!r})"

    @property
    def masked(self) -> str:
        """The URI as shown in messages and metadata: a password, if any, as ``***``."""
        parts = urllib.parse.urlsplit(self.url)
        if self.url_password is None:
            return self.url
        user = parts.username or ""
        host = parts.netloc.rsplit("@", 1)[-1]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))

    def password(self) -> str | None:
        return password_from(self.url_password, self.password_env, "PGPASSWORD")

    def mask(self, text: str) -> str:
        """``text`` with the password (from wherever it came) replaced by ``***``."""
        try:
            secret = self.password()
        except ConfigError:
            secret = None
        if secret:
            text = text.replace(secret, MASK).replace(urllib.parse.quote(secret, safe=""), MASK)
        return text

    def uri_with_password(self) -> str:
        """The full URI (for ADBC, which takes one string); only ever passed to the driver."""
        secret = self.password()
        if not secret:
            return self.url
        parts = urllib.parse.urlsplit(self.url)
        user = urllib.parse.quote(urllib.parse.unquote(parts.username or ""), safe="")
        host = parts.netloc.rsplit("@", 1)[-1]
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{urllib.parse.quote(secret, safe='')}@{host}"))


def parse_url(url: str, password_env: str | None = None, what: str = "option 'url'") -> ConnectionInfo:
    """Check a libpq URI and split the password off it (:func:`flinkish_spark.connectors.urls.split_password`):
    the rest is kept as written (several hosts, libpq's own parameters)."""
    parts, password = split_password(url, ("postgresql", "postgres"), what, "postgresql://user@host:5432/db",
                                     noun="a libpq URI")
    return ConnectionInfo(urllib.parse.urlunsplit(parts), password_env or None, password)


def _connection_error(info: ConnectionInfo, exc: BaseException) -> Exception:
    text = info.mask(str(exc).strip())
    if _ACCESS_DENIED.search(text):
        return DatabaseAccessError(
            f"PostgreSQL at {info.masked} refused the connection: {text}. Check the user, the password "
            "(in the URI, PGPASSWORD or the variable named by 'passwordEnv') and the database name"
        )
    return DatabaseUnavailableError(
        f"PostgreSQL at {info.masked} is unreachable: {text}. Check that the server runs and that host and port are right"
    )


def connect(info: ConnectionInfo, autocommit: bool = False, connect_timeout: int = 10) -> Any:
    """A psycopg connection (the caller closes it)."""
    psycopg = require_psycopg()
    try:
        return psycopg.connect(info.url, password=info.password(), autocommit=autocommit, connect_timeout=connect_timeout)
    except psycopg.OperationalError as e:
        raise _connection_error(info, e) from None


def server_version(conn: Any) -> int:
    """``server_version_num`` of a psycopg connection: 150018 for 15.18."""
    return int(conn.info.server_version)


def check_server_version(conn: Any, info: ConnectionInfo, what: str) -> int:
    """The server's version, or a clear error when it is older than :data:`MIN_SERVER_VERSION`."""
    version = server_version(conn)
    if version < MIN_SERVER_VERSION:
        raise ConfigError(
            f"{what}: the PostgreSQL server at {info.masked} runs version {version // 10000}; the flinkish.postgres "
            f"connectors need {MIN_SERVER_VERSION // 10000} or later (replication slot status, publications of "
            "partitioned tables). Upgrade the server"
        )
    return version


def adbc_connect(info: ConnectionInfo) -> Any:
    """An ADBC connection with autocommit off (the caller commits or prepares, and closes it)."""
    adbc = require_adbc()
    try:
        conn = adbc.connect(info.uri_with_password())
        # A first round trip: ADBC connects lazily on some versions.
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchall()
        return conn
    except adbc.Error as e:
        raise _connection_error(info, e) from None


# -- tables and types ---------------------------------------------------------------------

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def split_table(name: str, what: str = "option 'table'") -> tuple[str, str]:
    """``schema.table`` (or ``table``, schema ``public``) as two names, as the user spelled them."""
    pieces = name.strip().split(".")
    if len(pieces) == 1:
        pieces = ["public", pieces[0]]
    if len(pieces) != 2 or not all(_IDENT.match(p) for p in pieces):
        raise ConfigError(f"{what} must be 'schema.table' (plain identifiers), got {name!r}")
    return pieces[0], pieces[1]


def qualified(schema: str, table: str) -> str:
    return f"{quote_ident(schema)}.{quote_ident(table)}"


def pg_type_for(dt: T.DataType) -> str:
    """The PostgreSQL column type createTable uses for a Spark type."""
    simple: dict[type, str] = {
        T.BooleanType: "boolean", T.ByteType: "smallint", T.ShortType: "smallint", T.IntegerType: "integer",
        T.LongType: "bigint", T.FloatType: "real", T.DoubleType: "double precision", T.StringType: "text",
        T.BinaryType: "bytea", T.DateType: "date", T.TimestampType: "timestamp with time zone",
        T.TimestampNTZType: "timestamp without time zone",
    }
    for cls, name in simple.items():
        if isinstance(dt, cls):
            return name
    if isinstance(dt, T.DecimalType):
        return f"numeric({dt.precision},{dt.scale})"
    raise ConfigError(f"the PostgreSQL sink cannot write the Spark type {dt.simpleString()}; cast the column first")


# PostgreSQL type (format_type without modifiers) -> the Arrow type ADBC writes it from.
_ARROW_FOR_PG: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "smallint": pa.int16(), "integer": pa.int32(), "bigint": pa.int64(),
    "real": pa.float32(), "double precision": pa.float64(), "text": pa.string(), "character varying": pa.string(),
    "bytea": pa.binary(), "date": pa.date32(), "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    "timestamp without time zone": pa.timestamp("us"),
}

# Which target column types accept a Spark type without losing values.
_ACCEPTS: dict[str, tuple[type, ...]] = {
    "boolean": (T.BooleanType,),
    "smallint": (T.ByteType, T.ShortType),
    "integer": (T.ByteType, T.ShortType, T.IntegerType),
    "bigint": (T.ByteType, T.ShortType, T.IntegerType, T.LongType),
    "real": (T.FloatType,),
    "double precision": (T.FloatType, T.DoubleType, T.ByteType, T.ShortType, T.IntegerType),
    "text": (T.StringType,), "character varying": (T.StringType,),
    "bytea": (T.BinaryType,), "date": (T.DateType,),
    "timestamp with time zone": (T.TimestampType,), "timestamp without time zone": (T.TimestampNTZType,),
}


def base_type(pg_type: str) -> str:
    """``numeric(10,2)`` -> ``numeric``; ``character varying(20)`` -> ``character varying``."""
    return pg_type.split("(", 1)[0].strip()


def compatible(dt: T.DataType, pg_type: str) -> bool:
    base = base_type(pg_type)
    if base == "numeric":
        return isinstance(dt, (T.DecimalType, T.ByteType, T.ShortType, T.IntegerType, T.LongType))
    return isinstance(dt, _ACCEPTS.get(base, ()))


def arrow_type_for(pg_type: str, dt: T.DataType) -> pa.DataType:
    """The Arrow type to cast a Spark column to so that a binary COPY into ``pg_type`` accepts it."""
    base = base_type(pg_type)
    if base == "numeric":
        if isinstance(dt, T.DecimalType):
            return pa.decimal128(dt.precision, dt.scale)
        return pa.decimal128(38, 0)
    return _ARROW_FOR_PG[base]
