"""A MySQL/MariaDB mirror's source settings: ``--from mysql://`` with ``--source-option``, or a pipeline file's
``source: type: mysql`` in the keys of Flink CDC's MySQL pipeline connector -> the ``flinkish.mysql`` options.

Flink CDC's keys and what they become:

* ``hostname``, ``port`` (3306), ``username``, ``password`` -> ``url = mysql://username@hostname:port/`` and the
  password apart (never in the URL, a message or the configuration's JSON); or one ``url`` instead;
* ``tables`` (``tables.exclude``) -> ``tables``, ``database.table`` patterns (shell-style: ``shop.*``);
* ``server-id`` -> ``serverId``: the id the binary log reader registers as a replica with, unique among the
  server's replicas (a Flink CDC range ``5400-5404`` gives one id per parallel reader; flinkish reads the log
  with one connection and takes the range's first);
* ``scan.incremental.snapshot.chunk.size`` -> ``splitSize`` (rows per snapshot chunk);
* ``scan.startup.mode`` ``initial`` | ``snapshot`` | ``latest-offset`` -> ``startup`` ``snapshotThenChanges`` |
  ``snapshot`` | ``changes`` (Flink CDC's other modes -- ``earliest-offset``, ``specific-offset``, ``timestamp``
  -- are refused by :func:`flinkish_spark.mirror.config.startup_mode`).

Guarantee: a setting that exists for PostgreSQL but means nothing for MySQL (a replication slot, a
publication, ``database-name``) is one :class:`ConfigError` saying why and what MySQL does instead, not an
"unknown key"; every other unknown key is refused as for PostgreSQL.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Callable, Mapping

from flinkish_spark.errors import ConfigError

#: Options of the ``flinkish.mysql`` source a mirror may set besides url/tables (their own names).
MYSQL_SOURCE_OPTIONS = ("splitSize", "maxRowsPerTrigger", "snapshotRowsPerTrigger", "snapshotPartitions",
                        "discoveryInterval", "onSlotLost", "passwordEnv", "startup", "serverId", "changeReaders",
                        "changeReaderMinChanges")
#: Flink CDC's MySQL pipeline connector names for some of them.
MYSQL_FLINK_NAMES = {"server-id": "serverId", "scan.incremental.snapshot.chunk.size": "splitSize",
                     "scan.startup.mode": "startup"}
_NO_SLOT = ("MySQL has no replication slot: the binary log position lives in the mirror's checkpoint, and the server "
            "keeps its logs for binlog_expire_logs_seconds (keep them longer than the mirror may be stopped)")
#: PostgreSQL's settings (flag and pipeline-file names) -> why a MySQL source has no use for them.
NOT_FOR_MYSQL = {
    "slotName": _NO_SLOT,
    "slot.name": _NO_SLOT,
    "heartbeatInterval": "it carries a PostgreSQL replication slot forward while the followed tables are idle; "
                         + _NO_SLOT,
    "publication": "MySQL has no publications: the source reads the server's binary log and keeps the changes of "
                   "the tables that match 'tables'",
    "database-name": "Flink CDC's MySQL connector names the databases in 'tables' (shop.*, crm.customers), not "
                     "apart; give them there",
}
DEFAULT_PORT = "3306"
_MAX_SERVER_ID = 2**32 - 1


def not_for_mysql(key: str, what: str) -> ConfigError:
    return ConfigError(f"{what}: {key!r} has no meaning for a MySQL source: {NOT_FOR_MYSQL[key]}. Drop it")


def server_id(value: str, what: str) -> str:
    """``5400`` or Flink CDC's range ``5400-5404`` -> ``"5400"`` (one reader, one id: the range's first)."""
    text = str(value).strip()
    first, dash, last = text.partition("-")
    ok = first.strip().isdigit() and (not dash or last.strip().isdigit())
    if not ok or not 0 < int(first) <= _MAX_SERVER_ID or (dash and int(last) < int(first)):
        raise ConfigError(f"{what}: {text!r} is not a server id: give a number from 1 to {_MAX_SERVER_ID} (or a "
                          "range such as 5400-5404) that no other replica of the server uses")
    return str(int(first))


def check_source_options(given: dict[str, str], what: str) -> None:
    """``--source-option`` pairs of a MySQL mirror: PostgreSQL's refused by name; ``serverId`` checked in place."""
    for key in given:
        if key in NOT_FOR_MYSQL:
            raise not_for_mysql(key, f"{what} {key}")
    if "serverId" in given:
        given["serverId"] = server_id(given["serverId"], f"{what} serverId")


def source_keys(connection: tuple[str, ...]) -> tuple[str, ...]:
    """The keys a pipeline file's ``source: type: mysql`` may hold."""
    return ("type", "name", "tables", "tables.exclude", *(k for k in connection if k != "database-name"),
            *MYSQL_SOURCE_OPTIONS, *MYSQL_FLINK_NAMES)


def connection_url(section: Mapping[str, Any], text: Callable[..., str | None]) -> tuple[str, str | None]:
    """``url``, or ``hostname``/``port``/``username``/``password`` -> (``mysql://`` URL without password, password).
    ``text(section, key, where)`` reads one value (never quoting it: it may be a password)."""
    from flinkish_spark.connectors.mysql.connection import parse_url

    where = "source"
    url = text(section, "url", where)
    parts = [k for k in ("hostname", "port", "username") if k in section]
    if url is not None:
        if parts:
            raise ConfigError(f"pipeline file: {where} has 'url' and {', '.join(parts)}: give one of the two")
        info = parse_url(url, None, f"pipeline file: {where}.url")
        given = text(section, "password", where)
        if given is not None and info.url_password is not None:
            raise ConfigError(f"pipeline file: {where} has a password in 'url' and in 'password': give it once")
        return info.url, given if given is not None else info.url_password
    host = text(section, "hostname", where)
    user = text(section, "username", where)
    if host is None or user is None:
        raise ConfigError(f"pipeline file: {where} (type mysql) needs 'hostname' and 'username' (with port, "
                          "password) or 'url' (mysql://user@host:3306/)")
    port = text(section, "port", where) or DEFAULT_PORT
    if not port.isdigit():
        raise ConfigError(f"pipeline file: {where}.port must be a number, got {port!r}")
    info = parse_url(f"mysql://{urllib.parse.quote(user, safe='')}@{host}:{port}/", None, f"pipeline file: {where}")
    return info.url, text(section, "password", where)
