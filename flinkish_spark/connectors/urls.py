"""A database URL's password split off, the same for every database connector (PostgreSQL, MySQL).

``scheme://user[:password]@host[:port]/path[?password=...&...]``: :func:`split_password` checks the scheme and
returns the URL's parts without the password (from the user part or a ``?password=`` parameter) and the password
apart. What each database then reads from the parts differs -- libpq keeps the URI as written (several hosts,
its own parameters), MySQL reads host, port, user and database -- and stays in its ``connection`` module.

Guarantee: no message of this module holds the password, or any part of a value that could be one (a value
without a scheme is named by its first characters only when they cannot reach a password).
"""

from __future__ import annotations

import urllib.parse
from typing import Sequence

from flinkish_spark.errors import ConfigError


def _start_of(url: str, parts: urllib.parse.SplitResult) -> str:
    """How a value with the wrong scheme is named: its scheme, or its first characters up to any ``:``/``@``
    (``user:secret@host`` shows as ``'user'``)."""
    if parts.scheme and url.strip().startswith(parts.scheme + "://"):
        return parts.scheme + "://"
    head = url.strip()[:12]
    for stop in (":", "@"):
        head = head.split(stop, 1)[0]
    return repr(head)


def split_password(url: str, schemes: Sequence[str], what: str, example: str, noun: str = "a URL"
                   ) -> tuple[urllib.parse.SplitResult, str | None]:
    """``url``'s parts with the password removed (from the user part and a ``password`` query parameter), and the
    password (None: the URL has none). A scheme not in ``schemes`` is a :class:`ConfigError` showing ``example``."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in schemes:
        raise ConfigError(f"{what} must be {noun} such as {example}, got a value starting with {_start_of(url, parts)}")
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    if password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        user = parts.username or ""
        parts = parts._replace(netloc=f"{user}@{host}" if user else host)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    if any(k.lower() == "password" for k, _ in query):  # ?password=... : split off the same way
        password = next(v for k, v in query if k.lower() == "password")
        parts = parts._replace(query=urllib.parse.urlencode([(k, v) for k, v in query if k.lower() != "password"]))
    return parts, password
