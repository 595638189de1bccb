"""``flinkish mirror --from mysql://``'s preflight against the session's MariaDB: one clear line per mistake (wrong
credentials, binary log off, not ROW, not FULL, no matching table, a MyISAM table, a purged restart position),
a table without a primary key only a warning, never a password in a line, nothing written on the target or
checkpoint path. Cheap: no Spark."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from flinkish_spark.mirror.config import MirrorConfig, from_args
from flinkish_spark.mirror.preflight import problems

SECRET = "pw-Secret-9"
USER = "mirror_app"


@pytest.fixture
def shop(mariadb: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database with a keyed table, and a user with a password that may read everything."""
    name = "m_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    mariadb.sql(f"DROP DATABASE IF EXISTS `{name}`; CREATE DATABASE `{name}`; "
                f"CREATE TABLE `{name}`.orders (id int PRIMARY KEY, v text) ENGINE = InnoDB; "
                f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{SECRET}'; "
                f"GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'%'")
    yield name
    mariadb.sql(f"DROP DATABASE IF EXISTS `{name}`")


def config(mariadb: Any, tmp_path: Path, tables: str, password: str = SECRET, **given: Any) -> MirrorConfig:
    return from_args(source=f"mysql://{USER}:{password}@127.0.0.1:{mariadb.port}/", tables=tables,
                     to=str(tmp_path / "lake"), fmt=None, checkpoint=str(tmp_path / "meta"), **given)


def check(cfg: MirrorConfig, tmp_path: Path) -> tuple[list[str], list[str]]:
    """The preflight's problems and warnings; nothing of the mirror's written, no password in a line."""
    warnings: list[str] = []
    found = problems(cfg, warnings)
    for line in found + warnings:
        assert SECRET not in line and "wrong-one" not in line, line
    assert not (tmp_path / "lake").exists()
    return found, warnings


def test_a_good_source_passes_and_a_table_without_a_key_is_a_warning(mariadb: Any, shop: str, tmp_path: Path) -> None:
    mariadb.sql(f"CREATE TABLE `{shop}`.Notes (body text) ENGINE = InnoDB")  # no key; mixed case: shop.* finds it
    found, warnings = check(config(mariadb, tmp_path, f"{shop}.*"), tmp_path)
    assert found == []
    assert warnings == [f"{shop}.Notes is not followed: it has no primary key. ALTER TABLE {shop}.Notes ADD PRIMARY "
                        "KEY (...), and it is picked up (snapshot, then its changes) at the next catalog poll, "
                        "without a restart"]
    assert not (tmp_path / "meta").exists()
    found, _ = check(config(mariadb, tmp_path, f"{shop}.*, !{shop}.notes"), tmp_path)  # excluded in lower case too
    assert found == []


def test_wrong_credentials_are_one_line_without_the_password(mariadb: Any, shop: str, tmp_path: Path) -> None:
    found, _ = check(config(mariadb, tmp_path, f"{shop}.*", password="wrong-one"), tmp_path)
    assert len(found) == 1 and "refused the connection (1045)" in found[0]
    assert f"mysql://{USER}:***@127.0.0.1:{mariadb.port}/" in found[0] and "Check the user, the password" in found[0]
    assert not (tmp_path / "meta").exists()


def test_each_wrong_binlog_setting_is_its_own_line(mariadb: Any, shop: str, tmp_path: Path) -> None:
    try:
        mariadb.sql("SET GLOBAL binlog_format = 'STATEMENT'; SET GLOBAL binlog_row_image = 'MINIMAL'")
        found, _ = check(config(mariadb, tmp_path, f"{shop}.*"), tmp_path)
        bounded, _ = check(config(mariadb, tmp_path, f"{shop}.*", stop_after_snapshot=True), tmp_path)
    finally:
        mariadb.sql("SET GLOBAL binlog_format = 'ROW'; SET GLOBAL binlog_row_image = 'FULL'")
    assert len(found) == 2
    assert "logs binlog_format = STATEMENT; the flinkish.mysql source needs binlog_format = ROW: set it on the " \
           "server at" in found[0] and "SET GLOBAL binlog_format = 'ROW'" in found[0]
    assert "binlog_row_image = MINIMAL" in found[1] and "binlog-row-image = FULL in its option file" in found[1]
    assert bounded == []  # a snapshot only reads no row events
    assert not (tmp_path / "meta").exists()


def test_no_binary_log_is_the_one_line(mariadb: Any, shop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """log_bin cannot change while the server runs: the server's answer is replaced by one with it OFF."""
    from flinkish_spark.connectors.mysql import server

    real = server.read_settings
    monkeypatch.setattr(server, "read_settings",
                        lambda conn: (real(conn)[0], {**real(conn)[1], "log_bin": "OFF", "binlog_format": "MIXED"}))
    found, _ = check(config(mariadb, tmp_path, f"{shop}.*"), tmp_path)
    assert len(found) == 1 and "has no binary log (log_bin is OFF)" in found[0] and "Start the server with log-bin" \
        in found[0]


def test_tables_that_cannot_be_mirrored(mariadb: Any, shop: str, tmp_path: Path) -> None:
    found, _ = check(config(mariadb, tmp_path, f"{shop}.nothing_*, {shop}_other.*"), tmp_path)
    assert found == [f"--tables: no table matches 'tables' = '{shop}.nothing_*, {shop}_other.*' on the MySQL server "
                     f"at mysql://{USER}:***@127.0.0.1:{mariadb.port}/ (base tables this user can see, as "
                     "database.table: shop.*, crm.customers). Check the names, or create the tables first"]
    mariadb.sql(f"CREATE TABLE `{shop}`.legacy (id int PRIMARY KEY) ENGINE = MyISAM")
    found, _ = check(config(mariadb, tmp_path, f"{shop}.*"), tmp_path)
    assert found == [f"--tables: table {shop}.legacy uses the MyISAM engine, which has no transactions: its rows "
                     "cannot be read in the consistent snapshot the binary log continues. ALTER TABLE "
                     f"{shop}.legacy ENGINE = InnoDB, or exclude it with !{shop}.legacy"]
    assert not (tmp_path / "meta").exists()


@pytest.mark.parametrize("read", [True, False], ids=["read", "not-read-yet"])
def test_a_restart_from_a_purged_position_is_refused(mariadb: Any, shop: str, tmp_path: Path, read: bool) -> None:
    """The newest flinkish.mysql checkpoint's change split starts in a log the server then purges: a split that
    read up to there, or one that has read nothing yet (position 0, its start in the payload, as the source
    writes it before its first epoch of changes)."""
    import json

    from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.connectors.mysql.changes import current_end, position_key
    from flinkish_spark.connectors.mysql.connection import connect, parse_url
    from flinkish_spark.connectors.mysql.server import binary_logs
    from flinkish_spark.io.fileio import FileIO

    cfg = config(mariadb, tmp_path, f"{shop}.*")
    with connect(parse_url(mariadb.url)) as conn:
        start = current_end(conn, mariadb=True).file
        store = SourceCheckpointStore(FileIO.for_url(cfg.checkpoint), cfg.checkpoint, cfg.uid, "flinkish.mysql")
        key = position_key(start)
        store.write(SourceCheckpoint(cfg.uid, "flinkish.mysql", 0, None, 0, json.dumps({"tables": cfg.tables}),
                                     b"{}", False, (SplitRecord("changes-0", key, key) if read else
                                                    SplitRecord("changes-0", 0, 0, payload=json.dumps({"start": key})),)))
        files = sorted(str(p) for p in (tmp_path / "meta").rglob("*"))
        assert check(cfg, tmp_path)[0] == []  # still there: a restart may continue

        mariadb.sql(f"INSERT INTO `{shop}`.orders VALUES (1, 'a'); FLUSH BINARY LOGS; "
                    f"INSERT INTO `{shop}`.orders VALUES (2, 'b'); FLUSH BINARY LOGS")
        mariadb.sql(f"PURGE BINARY LOGS TO '{binary_logs(conn)[-1]}'")
        assert start.file not in binary_logs(conn)
    found, _ = check(cfg, tmp_path)
    assert len(found) == 1, found
    assert found[0].startswith(f"--checkpoint: the mirror continues from the binary log position {start}, but the "
                               f"MySQL server at mysql://{USER}:***@127.0.0.1:{mariadb.port}/ no longer has the "
                               f"binary log that position {start} needs")
    assert "SET GLOBAL binlog_expire_logs_seconds" in found[0]
    assert sorted(str(p) for p in (tmp_path / "meta").rglob("*")) == files  # the checkpoint only read
    # With onSlotLost=resnapshot the source starts a new snapshot: no problem, a warning that says so.
    found, warnings = check(config(mariadb, tmp_path, f"{shop}.*", source_option=["onSlotLost=resnapshot"]), tmp_path)
    assert found == [] and any(w.startswith(f"--checkpoint: the binary log position {start} the mirror stopped at "
                                            "was purged: onSlotLost=resnapshot: every table is snapshotted again")
                               for w in warnings), warnings


@pytest.mark.slow
def test_a_clean_preflight_starts_the_mirror_and_a_bounded_copy_equals_the_tables(
        mariadb: Any, shop: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The flinkish.mysql Spark source is wired (SOURCE_READY): the command runs the mirror (a pipeline process);
    a --stop-after-snapshot copy ends by itself and each Delta target holds its table's rows."""
    import deltalake
    import pyarrow as pa

    from flinkish_spark.mirror.pipeline import EXIT_OK, supervise

    mariadb.sql(f"INSERT INTO `{shop}`.orders VALUES (1, 'a'), (2, NULL), (3, 'c')")
    assert supervise(config(mariadb, tmp_path, f"{shop}.*", stop_after_snapshot=True)) == EXIT_OK
    assert SECRET not in capsys.readouterr().err
    rows = pa.table(deltalake.DeltaTable(str(tmp_path / "lake" / shop / "orders")).scan()).to_pylist()
    assert sorted((r["id"], r["v"]) for r in rows) == [(1, "a"), (2, None), (3, "c")]


def test_the_command_with_a_mysql_pipeline_file_exits_2_naming_the_problem(mariadb: Any, shop: str,
                                                                           tmp_path: Path) -> None:
    """The user's way in, end to end: ``flinkish mirror pipeline.yaml`` with Flink CDC's MySQL keys, a wrong
    password -> exit 2, one line, no password anywhere in the output, nothing written."""
    import subprocess

    from flinkish_spark.testing.mirror_process import flinkish

    path = tmp_path / "pipeline.yaml"
    path.write_text(f"""
source:
  type: mysql
  hostname: 127.0.0.1
  port: {mariadb.port}
  username: {USER}
  password: wrong-one
  tables: {shop}.*
  server-id: 5400-5404
sink:
  type: delta
  path: {tmp_path / "lake"}
pipeline:
  checkpoint: {tmp_path / "meta"}
""")
    out = subprocess.run([*flinkish(), "mirror", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "flinkish mirror: not started, nothing was created; 1 problem to fix first:" in out.stderr
    assert "refused the connection (1045)" in out.stderr and "wrong-one" not in out.stdout + out.stderr
    assert not (tmp_path / "meta").exists() and not (tmp_path / "lake").exists()


def test_a_checkpoint_of_a_postgresql_mirror_under_the_uid_is_refused(mariadb: Any, shop: str, tmp_path: Path) -> None:
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.testing.checkpoints import postgres_source

    cfg = config(mariadb, tmp_path, f"{shop}.*")
    postgres_source(FileIO.for_url(cfg.checkpoint), cfg.checkpoint, cfg.uid, ["public.orders"])
    found, _ = check(cfg, tmp_path)
    assert len(found) == 1 and "source uid 'mirror' was checkpointed as a 'flinkish.postgres' source, but the " \
        "query now uses 'flinkish.mysql' under the same uid. Give the new source its own uid" in found[0], found
