"""``flinkish mirror --from mysql://``'s preflight: every mistake on the MySQL/MariaDB side found before Spark starts.

Guarantee, as :mod:`flinkish_spark.mirror.preflight` for PostgreSQL: nothing is created on the server, the
target or the checkpoint path (the checkpoint is only read), and every problem is one line naming the thing
and the fix, all of them at once; a password is never in a line (:meth:`ConnectionInfo.mask`). Checked:

* the server: reachable with these credentials (a refused login is the connector's
  :class:`~flinkish_spark.errors.DatabaseAccessError`), its binary log on, and -- when changes are read
  (``startup`` other than ``snapshot``) -- ``binlog_format = ROW``, ``binlog_row_image = FULL``,
  ``binlog_row_metadata = FULL``, each its own line (:func:`..connectors.mysql.server.setting_problems`);
* the tables: at least one base table matches ``--tables``; each matching table is InnoDB (its snapshot is
  consistent with the log); a table without a primary key is a *warning*, not a problem: it is not followed
  until it has one (:mod:`..connectors.mysql.catalog`, the PostgreSQL mirror's rule);
* a restart: the position the mirror's checkpoint continues from (the change split's start in the newest
  ``flinkish.mysql`` checkpoint, ``file sequence << 32 | offset`` as the CDC core holds MySQL positions) is
  still in the server's binary logs -- a purged one is the connector's :class:`BinlogPurgedError`, naming the
  expiry setting and the fix -- unless ``onSlotLost=resnapshot`` asks for a new snapshot of every table then:
  a warning saying so; a checkpoint written by another kind of source under this uid is refused too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flinkish_spark.errors import FlinkishError
from flinkish_spark.mirror.config import MirrorConfig

WHAT = "--from"


def connection_info(config: MirrorConfig) -> Any:
    """The source's :class:`~flinkish_spark.connectors.mysql.connection.ConnectionInfo`, with the password the
    configuration holds apart (in this process it is not in the ``passwordEnv`` variable yet)."""
    from flinkish_spark.connectors.mysql.connection import parse_url

    info = parse_url(config.source_url, dict(config.source_extra).get("passwordEnv"), WHAT)
    if config.source_password is not None:
        info = dataclasses.replace(info, password_env=None, url_password=config.source_password)
    return info


def problems(config: MirrorConfig, warnings: list[str]) -> list[str]:
    """The MySQL source's problems, one line each; tables left out for want of a key are added to ``warnings``."""
    from flinkish_spark.connectors.mysql.connection import connect, require_pymysql

    try:
        info = connection_info(config)
        conn = connect(info)
    except FlinkishError as e:
        return [str(e)]
    pymysql = require_pymysql()
    try:
        with conn:
            return _server_problems(config, info, conn, warnings)
    except pymysql.MySQLError as e:  # a catalog query refused (a privilege) or the server gone: say so, start nothing
        return [info.mask(f"{WHAT}: checking the MySQL server at {info.masked} failed: {type(e).__name__}: {e}")]


def _server_problems(config: MirrorConfig, info: Any, conn: Any, warnings: list[str]) -> list[str]:
    from flinkish_spark.connectors.mysql.server import read_settings, setting_problems

    changes = config.source_options().get("startup") != "snapshot"
    version, settings = read_settings(conn)
    out = [str(e) for e in setting_problems(info, version, settings, changes)]
    out += _table_problems(config, info, conn, warnings)
    if changes and not any("log_bin is OFF" in line for line in out):
        out += _restart_problems(config, info, conn, warnings)
    return out


def _table_problems(config: MirrorConfig, info: Any, conn: Any, warnings: list[str]) -> list[str]:
    from flinkish_spark.connectors.mysql.catalog import find_tables
    from flinkish_spark.connectors.cdc.patterns import TablePatterns

    found = find_tables(conn, TablePatterns.parse(config.tables, "--tables"))
    if not found:
        return [f"--tables: no table matches 'tables' = {config.tables!r} on the MySQL server at {info.masked} (base "
                "tables this user can see, as database.table: shop.*, crm.customers). Check the names, or create "
                "the tables first"]
    warnings += [w for w in (t.not_followed() for t in found) if w is not None]
    return [p for p in (t.engine_problem("--tables") for t in found) if p is not None]


def _restart_problems(config: MirrorConfig, info: Any, conn: Any, warnings: list[str]) -> list[str]:
    """The checkpoint's start position still in the server's logs (nothing to check on a first start); a purged one
    only a warning with ``onSlotLost=resnapshot``, which the source answers with a new generation."""
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.connectors.mysql.changes import BinlogPurgedError, check_start, position_of_key
    from flinkish_spark.connectors.mysql.server import binary_logs
    from flinkish_spark.io.fileio import FileIO, storage_options_from

    root = config.checkpoint.rstrip("/")
    try:
        io = FileIO.for_url(root, storage_options_from(dict(config.source_extra), root), what="--checkpoint")
        latest = SourceCheckpointStore(io, root, config.uid, kind=config.source_format).latest()
    except FileNotFoundError:
        return []
    except FlinkishError as e:
        return [str(e)]
    if latest is None:
        return []
    from flinkish_spark.connectors.cdc.change_split import change_start
    from flinkish_spark.source.split import Split

    # 0: the split has read nothing yet; it starts where its payload says (the log's position at the start).
    starts = [change_start(Split(s.split_id, s.payload), s.start) for s in latest.live_splits
              if s.split_id.startswith("changes-")]
    starts = [s for s in starts if s > 0]
    if not starts:
        return []
    start = position_of_key(min(starts), binary_logs(conn))
    try:
        check_start(conn, info, start)
    except BinlogPurgedError as e:
        if config.source_options().get("onSlotLost") == "resnapshot":
            warnings.append(f"--checkpoint: the binary log position {start} the mirror stopped at was purged: "
                            "onSlotLost=resnapshot: every table is snapshotted again; the targets keep their rows "
                            "until each table's new snapshot replaces them")
            return []
        return [f"--checkpoint: the mirror continues from the binary log position {start}, but {e}"]
    return []
