"""Connections of the ``flinkish.postgres`` source: URL + password handling, masked in every message.

The password comes from the libpq URI, from the environment variable that the option
``passwordEnv`` names, or from libpq's own ``PGPASSWORD``. It is never logged, never part
of an error message and never written to checkpoint metadata (see :func:`mask_url`).

psycopg and ADBC are imported here, inside functions: ``import flinkish_spark`` must work
without them, and a missing one is one clear :class:`EnvironmentSetupError`.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any

# One error hierarchy and one install hint for both directions of flinkish.postgres.
from flinkish_spark.connectors.postgres.connection import INSTALL_HINT, require_adbc, require_psycopg  # noqa: F401
from flinkish_spark.errors import ConfigError, DatabaseUnavailableError, PostgresSourceError  # noqa: F401


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (URIs and key=value conninfo strings)."""
    if "://" in url:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = re.sub(r"(?i)(^|&)(password)=[^&]*", r"\1\2=***", parts.query)
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
    return re.sub(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", "password=***", url)


def mask_text(text: str, url: str) -> str:
    """``text`` (e.g. a driver's error message) with the password of ``url`` removed wherever it appears."""
    password = password_of(url)
    if password:
        text = text.replace(password, "***")
        text = text.replace(urllib.parse.quote(password, safe=""), "***")
    return text.replace(url, mask_url(url))


def password_of(url: str) -> str | None:
    if "://" in url:
        parts = urllib.parse.urlsplit(url)
        if parts.password:
            return urllib.parse.unquote(parts.password)
        q = urllib.parse.parse_qs(parts.query).get("password")
        return q[0] if q else None
    m = re.search(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", url)
    return m.group(1).strip("'") if m else None


def resolve_url(url: str, password_env: str | None) -> str:
    """The URL to connect with: the password of ``passwordEnv`` added when the option is set."""
    if not password_env:
        return url
    password = os.environ.get(password_env)
    if password is None:
        raise ConfigError(
            f"flinkish.postgres source: option 'passwordEnv' names the environment variable "
            f"{password_env!r}, which is not set (in the driver and the executors)"
        )
    if "://" in url:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, v) for k, v in query if k.lower() != "password"] + [("password", password)]
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    return f"{url} password='{password}'"


def connect(url: str, password_env: str | None, autocommit: bool = True) -> Any:
    """A psycopg connection; errors name the masked URL and never the password."""
    psycopg = require_psycopg()
    full = resolve_url(url, password_env)
    try:
        return psycopg.connect(full, autocommit=autocommit, connect_timeout=30)
    except psycopg.OperationalError as e:
        msg = mask_text(str(e).strip(), full)
        if "password authentication failed" in msg or "no password supplied" in msg:
            raise PostgresSourceError(
                f"flinkish.postgres source: authentication to {mask_url(url)} failed ({msg}); give the "
                "password in the URL, in PGPASSWORD or in the variable that the option 'passwordEnv' names"
            ) from None
        raise DatabaseUnavailableError(f"flinkish.postgres source: cannot connect to {mask_url(url)}: {msg}") from None


def connect_adbc(url: str, password_env: str | None) -> Any:
    """An ADBC connection for Arrow reads (snapshot chunks)."""
    dbapi = require_adbc()
    full = resolve_url(url, password_env)
    try:
        return dbapi.connect(full)
    except Exception as e:  # noqa: BLE001 - ADBC raises its own DatabaseError family
        raise DatabaseUnavailableError(
            f"flinkish.postgres source: cannot connect to {mask_url(url)}: {mask_text(str(e), full)}"
        ) from None
