"""Pipeline files in Flink CDC's YAML shape -> MirrorConfig, and one clear error per mistake (fast: no Spark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.errors import ConfigError
from flinkish_spark.mirror.config import SOURCE_PASSWORD_ENV
from flinkish_spark.mirror.pipeline_file import from_document, from_yaml
from flinkish_spark.mirror.shapes import check_modes

SECRET = "s3cr:et/pw"
URL = "postgresql://cdc:s3cr%3Aet%2Fpw@db.internal:5432/shop"

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



def assert_no_secret(config: Any) -> None:
    shown = repr(config) + config.to_json() + str(config.source_options()) + str(config.sink_options())
    assert SECRET not in shown and "s3cr" not in shown


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
  compactEvery: 50
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
        "discoveryInterval": "5", "passwordEnv": SOURCE_PASSWORD_ENV, "maxRowsPerTrigger": "200000",
        "snapshotRowsPerTrigger": "1000000",  # 30 s of 100,000 rows, at most 1,000,000
        "rowFormat": "arrow", "decodeIn": "sink",  # packed rows for a lakehouse target, typed by the sink tasks
        "spreadChanges": "4", "snapshotPartitions": "4"}  # handed to the 4 tasks by the source itself
    assert c.sink_options() == {"uid": "shop_sink", "checkpoint": "s3://lake/_meta", "path": "s3://lake/raw/{table}",
                                "targetFileSize": "64MiB", "compactEvery": "50"}
    assert (c.name, c.trigger_s, c.master, c.spark_checkpoint) == ("Shop to the lake", 30.0, "local[4]", "/var/lib/shop")
    assert c.parallelism == 4  # the sink tasks an epoch's per-table work is spread over
    assert c.password_env() == {SOURCE_PASSWORD_ENV: SECRET}
    assert_no_secret(c)


def test_a_flink_cdc_transform_block_is_the_sinks_transforms() -> None:
    c = from_document(doc(transform=[{"source-table": "public.users", "projection": "* EXCEPT (password_hash), "
                                      "__table_name__ AS source", "filter": "active", "description": "no secrets"}]))
    assert json.loads(c.sink_options()["transforms"]) == [
        {"tables": "public.users", "projection": "* EXCEPT (password_hash), __table_name__ AS source",
         "filter": "active", "description": "no secrets"}]
    # Written once: the source reads none of the columns left out (connectors/postgres/source/columns.py).
    assert c.source_options()["transforms"] == c.sink_options()["transforms"]


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
    ({"transform": [{"source-table": "a.b", "primary-keys": "id"}]}, r"transform\[0\].primary-keys is not supported"),
    ({"transform": [{"source-table": "a.b", "filtr": "id > 1"}]}, r"transform\[0\]: unknown key 'filtr'"),
    ({"transform": [{"source-table": "a.b", "filter": "rand() > 0.5"}]}, "is not deterministic"),
    ({"transform": {"source-table": "a.b"}}, "'transform' must be a list of rules"),
    ({"sourse": {}}, "pipeline file: unknown key 'sourse'. Did you mean 'source'"),
    ({"pipeline": None}, "section 'pipeline' missing"),
    ({"source": {"type": "oracle"}}, "source.type 'oracle' is not supported; use 'postgres' or 'mysql'"),
    ({"source": {"hostnme": "x"}}, "source: unknown key 'hostnme'. Did you mean 'hostname'"),
    ({"source": {"port": "fivefour"}}, "source.port must be a number"),
    ({"source": {"url": URL}}, "has 'url' and hostname"),
    ({"source": {"tables": None}}, "source.tables missing"),
    ({"source": {"tables": r"public.\.*"}}, "shell-style"),
    ({"source": {"scan.startup.mode": "earliest-offset"}}, "'earliest-offset' is not a startup mode"),
    ({"source": {"slot.name": "a", "slotName": "b"}}, "sets 'slotName' twice"),
    ({"source": {"password": {"from": "vault"}}}, "source.password must be a single value"),
    ({"sink": {"type": "doris"}}, "sink.type 'doris' is not one of delta, iceberg, postgres"),
    ({"sink": {"mode": "append"}}, r"pipeline file: sink: options mode='append': mode 'append' is not one of upsert, history"),
    ({"sink": {"table-modes": {"tables": "public.x"}}}, "sink.table-modes must be a list of rules"),
    ({"sink": {"table-modes": [{"tables": "public.x", "deletes": "hard"}]}},
     r"tableModes rule 1 \('public.x'\): deletes 'hard' is not one of true, soft, false"),
    ({"sink": {"tablemodes": []}}, r"sink \(type delta\): unknown key 'tablemodes'. Did you mean 'table-modes'"),
    ({"sink": {"uid": "x"}}, "uid and checkpoint are the pipeline's"),
    ({"sink": {"path": None}}, "sink.path missing"),
    ({"sink": {"path": "s3://lake/{schema}/{tbl}"}}, "placeholder"),
    ({"route": {"source-table": "x"}}, "'route' must be a list of rules"),
    ({"route": [{"source-table": "public.m_*", "sink-table": "a/{table}"}] * 2},
     r"route rule 2 has the source-table of rule 1 \('public.m_\*'\) and would never match"),
    ({"route": [{"source-table": "public.x_*", "sink-table": "s3://other/{table}"}]}, "is not below 's3://lake'"),
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


def test_metrics_port_in_a_pipeline_file() -> None:
    assert from_document(doc(pipeline={"metrics-port": 9187})).metrics_port == 9187
    assert from_document(doc()).metrics_port is None
    with pytest.raises(ConfigError, match="pipeline.metrics-port must be a port number"):
        from_document(doc(pipeline={"metrics-port": "http"}))


def test_table_shapes_for_all_tables_and_per_pattern_first_match_wins() -> None:
    config = from_document(doc(sink={"deletes": True, "table-modes": [
        {"tables": "public.m_orders", "mode": "history", "deletes": False},
        {"tables": "public.m_*", "deletes": "soft"}]}))
    options = config.sink_options()
    assert options["deletes"] == "true"
    assert json.loads(options["tableModes"]) == [{"tables": "public.m_orders", "mode": "history", "deletes": "false"},
                                                 {"tables": "public.m_*", "deletes": "soft"}]
    modes = check_modes(options, "sink")
    assert (modes.of("public.m_orders").mode, modes.of("public.m_orders").deletes) == ("history", "false")
    assert modes.of("public.m_items").deletes == "soft" and modes.of("sales.x").deletes == "true"
    assert "tableModes" not in from_document(doc()).sink_options()


def test_tracked_history_columns_and_a_rules_partitions_from_the_pipeline_file() -> None:
    """trackHistoryColumns(.except) sink-wide as a YAML list and per rule; a rule's partitionBy for Delta and Iceberg
    targets, refused for PostgreSQL before anything starts."""
    config = from_document(doc(sink={"mode": "history", "trackHistoryColumns.except": ["updated_at"], "table-modes": [
        {"tables": "public.m_orders", "trackHistoryColumns": ["status", "total"]}]}))
    options = config.sink_options()
    assert options["trackHistoryColumns.except"] == "updated_at"
    modes = check_modes(options, "sink")
    assert modes.of("public.m_orders").track == ("status", "total")
    assert modes.of("public.m_items").track_except == ("updated_at",)
    rule = [{"tables": "public.m_events", "partitionBy": ["day"]}]
    iceberg = from_document(doc(sink={"type": "iceberg", "path": None, "table": "lake.{schema}_{table}",
                                      "warehouse": "s3://lake/wh", "table-modes": rule}))
    assert check_modes(iceberg.sink_options(), "sink", "iceberg").of("public.m_events").partition_by == ("day",)
    assert check_modes(from_document(doc(sink={"table-modes": rule})).sink_options(), "sink",
                       "delta").of("public.m_events").partition_by == ("day",)
    with pytest.raises(ConfigError, match=r"pipeline file: sink: the tableModes rule\(s\) for 'public.m_events' give "
                                          r"partitionBy, which this sink's routed targets do not take \(a partitioned "
                                          r"PostgreSQL table needs"):
        from_document(doc(sink={"type": "postgres", "path": None, "table": "mirror.{table}",
                                "url": "postgresql://u@h/db", "table-modes": rule}))
