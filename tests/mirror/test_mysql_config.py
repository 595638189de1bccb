"""A MySQL mirror's configuration: ``--from mysql://`` and a pipeline file with ``source: type: mysql`` in Flink
CDC's MySQL pipeline connector keys -> the same MirrorConfig, the ``flinkish.mysql`` options; one clear error per
mistake, PostgreSQL's settings refused by name (fast: no Spark, no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.errors import ConfigError
from flinkish_spark.mirror.config import SOURCE_PASSWORD_ENV, MirrorConfig, from_args
from flinkish_spark.mirror.pipeline_file import from_document, from_yaml

SECRET = "s3cr:et/pw"


def flags(tmp_path: Path, **given: Any) -> MirrorConfig:
    args: dict[str, Any] = {"source": "mysql://cdc:s3cr%3Aet%2Fpw@db.internal:3307/shop", "tables": "shop.*",
                            "to": str(tmp_path / "lake"), "fmt": None, "checkpoint": str(tmp_path / "meta")}
    return from_args(**{**args, **given})


def doc(**source: Any) -> dict[str, Any]:
    src = {"type": "mysql", "hostname": "db.internal", "port": 3306, "username": "cdc", "password": SECRET,
           "tables": "shop.*", **source}
    return {"source": {k: v for k, v in src.items() if v is not None},
            "sink": {"type": "delta", "path": "s3://lake/{schema}/{table}"},
            "pipeline": {"checkpoint": "s3://lake/_meta"}}


def assert_no_secret(config: MirrorConfig) -> None:
    shown = repr(config) + config.to_json() + str(config.source_options()) + str(config.sink_options())
    assert "s3cr" not in shown


def test_the_flags_give_the_mysql_source_its_options(tmp_path: Path) -> None:
    config = flags(tmp_path, source_option=["splitSize=5000", "serverId=5400-5404", "startup=latest-offset"])
    assert (config.source_kind, config.source_format, config.source_password) == ("mysql", "flinkish.mysql", SECRET)
    opts = config.source_options()
    assert opts["url"] == "mysql://cdc@db.internal:3307/shop" and opts["tables"] == "shop.*"
    assert (opts["splitSize"], opts["serverId"], opts["startup"]) == ("5000", "5400", "changes")
    assert opts["passwordEnv"] == SOURCE_PASSWORD_ENV and config.password_env() == {SOURCE_PASSWORD_ENV: SECRET}
    assert config.target == str(tmp_path / "lake") + "/{schema}/{table}"  # {schema}: the database
    assert_no_secret(config)
    again = MirrorConfig.from_json(config.to_json(), source_password=SECRET)
    assert again == config and again.source_kind == "mysql"
    assert flags(tmp_path, stop_after_snapshot=True).source_options()["startup"] == "snapshot"


def test_a_flink_cdc_mysql_pipeline_file(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"""
source:
  type: mysql
  name: Shop database
  hostname: db.internal
  port: 3307
  username: cdc
  password: "{SECRET}"
  tables: shop.*, crm.customers
  tables.exclude: shop.audit_log
  server-id: 5401
  scan.incremental.snapshot.chunk.size: 8096
  scan.startup.mode: initial
sink:
  type: postgres
  hostname: warehouse
  username: loader
  database-name: dw
route:
  - source-table: shop.*, crm.customers
    sink-table: mirror.{{schema}}_{{table}}
pipeline:
  checkpoint: {tmp_path / "meta"}
""")
    config = from_yaml(str(path))
    assert config.source_format == "flinkish.mysql" and config.source_password == SECRET
    assert config.source_url == "mysql://cdc@db.internal:3307/"
    assert config.tables == "shop.*, crm.customers, !shop.audit_log"
    opts = config.source_options()
    assert (opts["serverId"], opts["splitSize"], opts["startup"]) == ("5401", "8096", "snapshotThenChanges")
    assert config.target == "mirror.{schema}_{table}" and config.format == "postgres"
    assert_no_secret(config)
    assert from_document(doc(**{"scan.startup.mode": "snapshot"})).stop_after_snapshot
    assert from_document(doc(url="mysql://cdc@db:3306/", hostname=None, port=None, username=None)).source_url == \
        "mysql://cdc@db:3306/"


@pytest.mark.parametrize("source, words", [
    ({"slot.name": "s"}, r"source.slot.name: 'slot.name' has no meaning for a MySQL source: MySQL has no "
                         r"replication slot.*binlog_expire_logs_seconds"),
    ({"publication": "p"}, "has no meaning for a MySQL source: MySQL has no publications"),
    ({"heartbeatInterval": "30"}, "heartbeatInterval' has no meaning for a MySQL source"),
    ({"database-name": "shop"}, "names the databases in 'tables'"),
    ({"scan.startup.mode": "earliest-offset"}, "'earliest-offset' is not a startup mode; use one of initial, "
                                               "snapshot, latest-offset"),
    ({"server-id": "abc"}, r"source.server-id: 'abc' is not a server id"),
    ({"server-id": "5404-5400"}, "is not a server id"),
    ({"hostname": None}, r"needs 'hostname' and 'username'"),
    ({"tables": r"shop.\.*"}, r"write shop.\* for shop"),
    ({"tables": "orders"}, "'orders' is not 'schema.table'"),
    ({"scan.snapshot.fetch.size": "1024"}, "unknown key 'scan.snapshot.fetch.size'"),
    ({"type": "oracle"}, "use 'postgres' or 'mysql'"),
])
def test_each_mistake_in_a_mysql_source_section_is_one_clear_error(source: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        from_document(doc(**source))
    assert "s3cr" not in str(err.value)


@pytest.mark.parametrize("given, words", [
    ({"source_option": ["slotName=x"]}, "--source-option slotName: 'slotName' has no meaning for a MySQL source"),
    ({"source_option": ["publication=x"]}, "MySQL has no publications"),
    ({"source_option": ["sslmode=require"]}, "unknown key 'sslmode'"),
    ({"source": "mysql://cdc:s3cr%3Aet@db/shop?ssl=1"}, "unknown URL parameter 'ssl'"),
    ({"source": "cdc:s3cr@db/shop"}, r"--from must be a database URL such as postgresql://user@host:5432/db or "
                                     r"mysql://user@host:3306/db, got a value starting with 'cdc'"),
    ({"to": "mysql://root@other/db"}, "there is no MySQL target"),
])
def test_each_mistake_in_the_flags_is_one_clear_error(tmp_path: Path, given: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        flags(tmp_path, **given)
    assert "s3cr" not in str(err.value)


def test_a_drained_mysql_mirror_does_not_claim_to_have_dropped_a_slot(tmp_path: Path) -> None:
    from flinkish_spark.mirror.pipeline import ending

    code, text = ending("drained", flags(tmp_path))
    assert code == 0 and "every change up to the stop is committed" in text
    assert "slot" not in text and "nothing on the server to drop" in text
    postgres = flags(tmp_path, source="postgresql://cdc@db.internal:5432/shop", tables="public.*")
    assert "slot and publication dropped" in ending("drained", postgres)[1]
