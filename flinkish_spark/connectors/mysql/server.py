"""What the MySQL source needs from the server, checked before it reads anything: one clear error each.

The change stream is the row-based binary log with whole rows and column names in it:

* ``log_bin`` ON -- no binary log, no changes;
* ``binlog_format = ROW`` -- STATEMENT or MIXED logs SQL text, not the rows it changed;
* ``binlog_row_image = FULL`` -- MINIMAL/NOBLOB log only the changed columns (and the key), so an
  update could not be written as the whole new row;
* ``binlog_row_metadata = FULL`` -- column names (and signedness, character sets) in every table map
  event, so that a change is decoded with the columns it was written with, not with today's catalog
  (MySQL 8.0.1+ and MariaDB 10.5+ have the setting; its default is MINIMAL).

The settings are read as ``@@GLOBAL``: a writer's session takes its own from them when it connects.
Each message names the setting and how to change it (``SET GLOBAL`` and the option file), since the
server is someone else's. :func:`binary_logs` and :func:`oldest_gtid_list` are what
:func:`..position.purged` needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flinkish_spark.connectors.mysql.connection import ConnectionInfo
from flinkish_spark.connectors.mysql.position import MariaGtidPosition, first_gtid_list
from flinkish_spark.errors import ConfigError

#: setting -> the value the source needs (checked in this order).
REQUIRED: dict[str, str] = {
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}


class BinlogSettingError(ConfigError):
    """The server's binary log is off or is not row-based with full rows and metadata."""


@dataclass(frozen=True)
class ServerInfo:
    """What the source learnt about the server (no secrets: safe to log and store)."""

    version: str  # @@version: 10.11.18-MariaDB-0+deb12u1-log, 8.0.36
    mariadb: bool
    server_id: int
    settings: dict[str, str]  # log_bin and REQUIRED's settings, as the server reported them

    @property
    def gtid_kind(self) -> str:
        """``mariadb`` (domain-server-seq, always on), ``mysql`` (uuid:interval sets, when gtid_mode=ON) or ``none``."""
        if self.mariadb:
            return "mariadb"
        return "mysql" if self.settings.get("gtid_mode", "OFF").upper() == "ON" else "none"


def _fix(info: ConnectionInfo, setting: str, value: str) -> str:
    return (f"set it on the server at {info.masked}: SET GLOBAL {setting} = '{value}' (for new sessions) and "
            f"{setting.replace('_', '-')} = {value} in its option file ([mysqld] section), so that a restart keeps it")


def setting_problems(info: ConnectionInfo, version: str, settings: dict[str, str],
                     changes: bool = True) -> list[BinlogSettingError]:
    """Every setting of ``settings`` (lower-case names -> values as the server reports them) the source cannot read
    changes with, one :class:`BinlogSettingError` each (a preflight names them all at once). No binary log at all is
    the one problem then. ``changes=False`` (a snapshot only): just the binary log, where the snapshot's position is."""
    log_bin = str(settings.get("log_bin", "")).upper()
    if log_bin not in ("1", "ON"):
        return [BinlogSettingError(
            f"the MySQL server at {info.masked} has no binary log (log_bin is OFF): the flinkish.mysql source reads "
            "changes from it. Start the server with log-bin (e.g. log-bin = mysql-bin, server-id = 1, "
            "binlog-format = ROW in its option file) and restart it"
        )]
    problems = []
    for setting, wanted in REQUIRED.items() if changes else ():
        have = settings.get(setting)
        if have is None:
            problems.append(BinlogSettingError(
                f"the MySQL server at {info.masked} ({version}) has no setting {setting}: the flinkish.mysql source "
                f"needs {setting} = {wanted} (MySQL 8.0.1+, MariaDB 10.5+). Upgrade the server"
            ))
        elif str(have).upper() != wanted:
            problems.append(BinlogSettingError(
                f"the MySQL server at {info.masked} logs {setting} = {have}; the flinkish.mysql source needs "
                f"{setting} = {wanted}: {_fix(info, setting, wanted)}"
            ))
    return problems


def check_settings(info: ConnectionInfo, version: str, settings: dict[str, str]) -> ServerInfo:
    """``settings`` as a :class:`ServerInfo`, or the :class:`BinlogSettingError` of the first setting the source
    cannot read changes with (:func:`setting_problems`)."""
    problems = setting_problems(info, version, settings)
    if problems:
        raise problems[0]
    server_id = int(settings.get("server_id") or 0)
    return ServerInfo(version, "mariadb" in version.lower(), server_id, dict(settings))


def read_settings(conn: Any) -> tuple[str, dict[str, str]]:
    """@@version and the global settings the checks read (a missing one is left out)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@version")
        version = str(cur.fetchone()[0])
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                    "('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata', 'server_id', 'gtid_mode')")
        settings = {str(name).lower(): str(value) for name, value in cur.fetchall()}
    return version, settings


def check_server(conn: Any, info: ConnectionInfo) -> ServerInfo:
    """Read and check the server's binary log settings (raises :class:`BinlogSettingError`)."""
    version, settings = read_settings(conn)
    return check_settings(info, version, settings)


def binary_logs(conn: Any) -> list[str]:
    """The server's binary log files, oldest first (``SHOW BINARY LOGS``)."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        return [str(row[0]) for row in cur.fetchall()]


def oldest_gtid_list(conn: Any, oldest_file: str) -> MariaGtidPosition:
    """MariaDB: the GTID state before ``oldest_file`` (its ``Gtid_list`` event, the file's second event)."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINLOG EVENTS IN %s LIMIT 3", (oldest_file,))
        return first_gtid_list(cur.fetchall())


def collation_charsets(conn: Any) -> dict[int, str]:
    """Collation id -> character set name, as this server numbers them (MariaDB and MySQL differ above 255)."""
    with conn.cursor() as cur:
        cur.execute("SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS")
        # MariaDB 10.10+ lists collations without an id (UCA 14.0.0 ones, named only): never in a table map.
        return {int(i): str(name) for i, name in cur.fetchall() if i is not None}
