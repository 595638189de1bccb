"""Where a database connector's password comes from, the same for every database: the URL, else the variable
``passwordEnv`` names, else the database's own variable (``PGPASSWORD``, ``MYSQL_PWD``).

Guarantee: a password is never part of a message; a ``passwordEnv`` naming an unset variable is one
:class:`~flinkish_spark.errors.ConfigError` (each process -- the driver and every executor -- reads its own
environment, so the message says that all of them need it).
"""

from __future__ import annotations

import os

from flinkish_spark.errors import ConfigError

#: What a password is shown as wherever a URL or an error would hold it.
MASK = "***"


def password_from(url_password: str | None, password_env: str | None, variable: str) -> str | None:
    """The password: ``url_password``, else ``$password_env`` (which must be set), else ``$variable`` (None if unset)."""
    if url_password is not None:
        return url_password
    if password_env:
        value = os.environ.get(password_env)
        if value is None:
            raise ConfigError(
                f"option 'passwordEnv' names the environment variable {password_env!r}, which is not set "
                "in this process (the driver and every executor need it)"
            )
        return value
    return os.environ.get(variable)
