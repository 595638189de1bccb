"""``flinkish mirror``'s configuration: flags and pipeline files -> MirrorConfig, and one clear error per mistake.

Fast (no Spark, no server): what the options handed to the connectors are, that every
unknown key and bad value names the key and the fix, and that no password is ever in a
repr, an error, the JSON the pipeline process gets, or the options.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.cli import main
from flinkish_spark.errors import ConfigError
from flinkish_spark.mirror.config import (
    SINK_OPTIONS,
    SINK_PASSWORD_ENV,
    SOURCE_OPTIONS,
    SOURCE_PASSWORD_ENV,
    MirrorConfig,
    from_args,
    from_document,
    from_yaml,
    parse_trigger,
)

SECRET = "s3cr:et/pw"
URL = "postgresql://cdc:s3cr%3Aet%2Fpw@db.internal:5432/shop"


def flags(**over: Any) -> MirrorConfig:
    args: dict[str, Any] = {"source": URL, "tables": "public.*", "to": "/lake", "fmt": None, "checkpoint": "/meta"}
    return from_args(**{**args, **over})


def doc(**sections: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "source": {"type": "postgres", "hostname": "db.internal", "port": 5432, "username": "cdc",
                   "password": SECRET, "database-name": "shop", "tables": "public.m_*"},
        "sink": {"type": "delta", "path": "s3://lake/{schema}/{table}"},
        "pipeline": {"name": "Shop to the lake", "checkpoint": "s3://lake/_meta", "trigger": "5s"},
    }
    for key, value in sections.items():
        if value is None:
            base.pop(key)
        else:
            merged = {**base.get(key, {}), **value} if isinstance(value, dict) else value
            base[key] = {k: v for k, v in merged.items() if v is not None} if isinstance(merged, dict) else merged
    return base


def assert_no_secret(config: MirrorConfig) -> None:
    shown = repr(config) + config.to_json() + json.dumps(config.source_options()) + json.dumps(config.sink_options())
    assert SECRET not in shown and "s3cr" not in shown


# ------------------------------------------------------------------ flags


def test_flags_give_the_options_a_python_user_passes() -> None:
    c = flags(trigger="2s", source_option=["splitSize=5000"], sink_option=["rowsPerFile=1000"])
    assert c.source_options() == {"uid": "mirror", "checkpoint": "/meta", "url": "postgresql://cdc@db.internal:5432/shop",
                                  "tables": "public.*", "splitSize": "5000", "passwordEnv": SOURCE_PASSWORD_ENV}
    assert c.sink_format == "flinkish.delta"
    assert c.sink_options() == {"uid": "mirror_sink", "checkpoint": "/meta", "path": "/lake/{schema}/{table}",
                                "rowsPerFile": "1000"}
    assert c.password_env() == {SOURCE_PASSWORD_ENV: SECRET}
    assert c.trigger_s == 2.0 and c.spark_checkpoint == "/meta/spark"
    assert_no_secret(c)


def test_a_template_is_kept_and_a_remote_checkpoint_gets_a_local_spark_checkpoint(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    c = flags(to="s3://lake/raw_{schema}/{table}", checkpoint="s3://lake/meta")
    assert c.target == "s3://lake/raw_{schema}/{table}"
    assert c.spark_checkpoint.startswith(str(tmp_path / "flinkish_spark" / "mirror" / "mirror-"))
    assert flags(to="s3://lake/x", checkpoint="s3://lake/meta").spark_checkpoint == c.spark_checkpoint  # same root, same


def test_postgres_target_from_the_url_and_iceberg_from_the_format() -> None:
    pg = flags(to="postgresql://writer:pw2@replica/shop")
    assert pg.format == "postgres" and pg.target == "{schema}.{table}"
    assert pg.sink_options() == {"uid": "mirror_sink", "checkpoint": "/meta", "table": "{schema}.{table}",
                                 "url": "postgresql://writer@replica/shop", "passwordEnv": SINK_PASSWORD_ENV}
    assert pg.password_env() == {SOURCE_PASSWORD_ENV: SECRET, SINK_PASSWORD_ENV: "pw2"}
    assert "pw2" not in repr(pg) + pg.to_json()
    ice = flags(to="mirror.{schema}_{table}", fmt="iceberg", sink_option=["catalogUri=sqlite:////c.db", "warehouse=/w"])
    assert ice.sink_options()["table"] == "mirror.{schema}_{table}" and ice.sink_options()["warehouse"] == "/w"


def test_stop_after_snapshot_is_the_sources_bounded_startup() -> None:
    assert flags(stop_after_snapshot=True).source_options()["startup"] == "snapshot"
    assert "startup" not in flags().source_options()
    assert flags(source_option=["startup=snapshot"]).stop_after_snapshot
    with pytest.raises(ConfigError, match="contradicts --stop-after-snapshot"):
        flags(source_option=["startup=changes"], stop_after_snapshot=True)


def test_the_json_for_the_pipeline_process_round_trips_without_passwords() -> None:
    c = flags(source_option=["splitSize=5"])
    back = MirrorConfig.from_json(c.to_json(), SECRET, None)
    assert back == c
    assert MirrorConfig.from_json(c.to_json()).source_password is None


@pytest.mark.parametrize("over, message", [
    ({"source": None}, "--from missing"),
    ({"source": "mysql://u@h/db"}, "libpq URI"),
    ({"tables": "orders"}, "not 'schema.table'"),
    ({"tables": r"public.\.*"}, r"write public.\* for public"),
    ({"fmt": "hudi"}, "--format: 'hudi' is not one of delta, iceberg, postgres"),
    ({"fmt": "iceberg", "to": "mirror.orders"}, r"needs the placeholder \{table\}"),
    ({"fmt": "iceberg", "to": "mirror.{table}.x.{tabel}"}, "placeholder other than"),
    ({"trigger": "fast"}, "--trigger: 'fast' is not a trigger interval; write e.g. 10s"),
    ({"uid": "My Mirror"}, "--uid: 'My Mirror' must be 1-40 lower-case letters"),
    ({"spark_checkpoint": "s3://b/cp"}, "must be a local folder"),
    ({"source_option": ["splitsize=5"]}, "unknown key 'splitsize'. Did you mean 'splitSize'"),
    ({"sink_option": ["mode=append"]}, r"unknown key 'mode'"),
    ({"sink_option": ["rowsPerFile"]}, "is not KEY=VALUE"),
])
def test_bad_flags_are_refused_naming_the_flag(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        flags(**over)
    assert "s3cr" not in str(err.value)


def test_trigger_units() -> None:
    assert [parse_trigger(v, "t") for v in ("10s", "500ms", "1m", "10 seconds", 3, "0.5")] == [10, 0.5, 60, 10, 3, 0.5]
    with pytest.raises(ConfigError):
        parse_trigger("0s", "t")


# ------------------------------------------------------------------ pipeline files


def test_a_flink_cdc_pipeline_file(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"""
source:
  type: postgres
  name: Shop database
  hostname: db.internal
  port: 5433
  username: cdc
  password: "{SECRET}"
  database-name: shop
  tables: public.m_*, sales.order_*
  tables.exclude: public.m_audit
  slot.name: ignored_by_test
  scan.incremental.snapshot.chunk.size: 50000
  discoveryInterval: 5
sink:
  type: delta
  path: s3://lake
  targetFileSize: 64MiB
route:
  - source-table: public.m_*, sales.order_*
    sink-table: raw/<>
    replace-symbol: <>
    description: every table under raw/
pipeline:
  name: Shop to the lake
  uid: shop
  checkpoint: s3://lake/_meta
  spark-checkpoint: /var/lib/shop
  trigger: 30s
  parallelism: 4
  schema.change.behavior: lenient
""")
    c = from_yaml(str(path))
    assert c.source_options() == {
        "uid": "shop", "checkpoint": "s3://lake/_meta", "url": "postgresql://cdc@db.internal:5433/shop",
        "tables": "public.m_*, sales.order_*, !public.m_audit", "slotName": "ignored_by_test", "splitSize": "50000",
        "discoveryInterval": "5", "passwordEnv": SOURCE_PASSWORD_ENV}
    assert c.sink_options() == {"uid": "shop_sink", "checkpoint": "s3://lake/_meta", "path": "s3://lake/raw/{table}",
                                "targetFileSize": "64MiB"}
    assert (c.name, c.trigger_s, c.master, c.spark_checkpoint) == ("Shop to the lake", 30.0, "local[4]", "/var/lib/shop")
    assert c.password_env() == {SOURCE_PASSWORD_ENV: SECRET}
    assert_no_secret(c)


def test_pipeline_file_defaults_and_other_sinks() -> None:
    c = from_document(doc(sink={"type": "delta", "path": "/lake"}, pipeline={"trigger": None}))
    assert c.target == "/lake/{schema}/{table}" and c.trigger_s == 10.0
    pg = from_document(doc(sink={"type": "postgres", "url": "postgresql://w@replica/shop", "password": "pw2",
                                 "createTable": True, "path": None}))
    assert pg.sink_options()["table"] == "{schema}.{table}" and pg.sink_password == "pw2"
    assert pg.sink_options()["createTable"] == "True"
    ice = from_document(doc(sink={"type": "iceberg", "catalogUri": "sqlite:////c.db", "warehouse": "/w", "path": None},
                            route=[{"source-table": "public.m_*", "sink-table": "mirror.{schema}_{table}"}]))
    assert ice.sink_options()["table"] == "mirror.{schema}_{table}"
    bounded = from_document(doc(source={"scan.startup.mode": "snapshot"}))
    assert bounded.stop_after_snapshot and bounded.source_options()["startup"] == "snapshot"
    assert from_document(doc(source={"scan.startup.mode": "latest-offset"})).source_options()["startup"] == "changes"
    url = from_document(doc(source={"hostname": None, "port": None, "username": None, "database-name": None,
                                    "password": None, "url": URL}))
    assert url.source_password == SECRET and url.source_url == "postgresql://cdc@db.internal:5432/shop"
    no_pw = from_document(doc(source={"password": None}))
    assert no_pw.source_password is None and "passwordEnv" not in no_pw.source_options()  # PGPASSWORD, ~/.pgpass


@pytest.mark.parametrize("change, message", [
    ({"transform": [{"source-table": "a.b"}]}, "'transform' is not supported"),
    ({"sourse": {}}, "pipeline file: unknown key 'sourse'. Did you mean 'source'"),
    ({"pipeline": None}, "section 'pipeline' missing"),
    ({"source": {"type": "mysql"}}, "source.type 'mysql' is not supported; use 'postgres'"),
    ({"source": {"hostnme": "x"}}, "source: unknown key 'hostnme'. Did you mean 'hostname'"),
    ({"source": {"port": "fivefour"}}, "source.port must be a number"),
    ({"source": {"url": URL}}, "has 'url' and hostname"),
    ({"source": {"tables": None}}, "source.tables missing"),
    ({"source": {"tables": r"public.\.*"}}, "shell-style"),
    ({"source": {"scan.startup.mode": "earliest-offset"}}, "'earliest-offset' is not a startup mode"),
    ({"source": {"slot.name": "a", "slotName": "b"}}, "sets 'slotName' twice"),
    ({"source": {"password": {"from": "vault"}}}, "source.password must be a single value"),
    ({"sink": {"type": "doris"}}, "sink.type 'doris' is not one of delta, iceberg, postgres"),
    ({"sink": {"mode": "append"}}, r"sink \(type delta\): unknown key 'mode'"),
    ({"sink": {"uid": "x"}}, "uid and checkpoint are the pipeline's"),
    ({"sink": {"path": None}}, "sink.path missing"),
    ({"sink": {"path": "s3://lake/{schema}/{tbl}"}}, "placeholder"),
    ({"route": {"source-table": "x"}}, "'route' must be a list of rules"),
    ({"route": [{"source-table": "public.m_*", "sink-table": "a/{table}"}] * 2}, "route has 2 rules"),
    ({"route": [{"source-table": "public.x_*", "sink-table": "a/{table}"}]}, "differs from source.tables"),
    ({"route": [{"source-table": "public.m_*", "sink-table": "a/{table}", "priority": 1}]}, "route\\[0\\]: unknown key 'priority'"),
    ({"route": [{"source-table": "public.m_*", "sink-table": "{table}"}]}, "give the template once"),
    ({"pipeline": {"checkpoint": None}}, "pipeline.checkpoint missing"),
    ({"pipeline": {"schema.change.behavior": "evolve"}}, "'evolve' is not available"),
    ({"pipeline": {"parallelism": 0}}, "parallelism must be a whole number"),
    ({"pipeline": {"trigger": "soon"}}, "pipeline.trigger: 'soon' is not a trigger interval"),
    ({"pipeline": {"stop-after-snapshot": "yes"}}, "must be true or false"),
    ({"pipeline": {"execution.runtime-mode": "BATCH"}}, "pipeline: unknown key 'execution.runtime-mode'"),
])
def test_bad_pipeline_files_are_refused_naming_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        from_document(doc(**change))
    assert "s3cr" not in str(err.value)


def test_yaml_syntax_error_names_the_line_not_its_text(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"source:\n  password: {SECRET}\n  tables: [public.*\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML at line \d+, column \d+") as err:
        from_yaml(str(path))
    assert "s3cr" not in str(err.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        from_yaml(str(tmp_path / "missing.yaml"))


def test_the_command_refuses_before_starting_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake, meta = tmp_path / "lake", tmp_path / "meta"
    rc = main(["mirror", "--from", URL, "--tables", "public.*", "--to", str(lake), "--checkpoint", str(meta),
               "--trigger", "often"])
    err = capsys.readouterr().err
    assert rc == 2 and "ConfigError: --trigger: 'often' is not a trigger interval" in err and "s3cr" not in err
    path = tmp_path / "p.yaml"
    path.write_text("source: {type: postgres, url: 'postgresql://u@h/db', tables: 'public.*'}\n"
                    "sink: {type: delta, path: /lake}\npipeline: {checkpoint: /meta}\n")
    assert main(["mirror", str(path), "--trigger", "5s"]) == 2
    assert "cannot be combined with a pipeline file" in capsys.readouterr().err
    assert not lake.exists() and not meta.exists()


def test_the_allowed_options_are_the_connectors_own() -> None:
    """The mirror's option lists stay within what the source and the sinks accept."""
    from flinkish_spark.connectors.postgres.source.datasource import PostgresSourceDataSource
    from flinkish_spark.sink.datasource import COMMON_SINK_OPTIONS

    assert set(SOURCE_OPTIONS) <= set(PostgresSourceDataSource.EXTRA_OPTIONS)
    sinks = {"delta": ("flinkish_spark.connectors.delta.sink", "DeltaSinkDataSource"),
             "iceberg": ("flinkish_spark.connectors.iceberg.sink", "IcebergSinkDataSource"),
             "postgres": ("flinkish_spark.connectors.postgres.sink", "PostgresSinkDataSource")}
    import importlib

    for fmt, (module, cls) in sinks.items():
        known = set(getattr(importlib.import_module(module), cls).EXTRA_OPTIONS) | set(COMMON_SINK_OPTIONS)
        assert set(SINK_OPTIONS[fmt]) <= known, fmt  # type: ignore[index]
