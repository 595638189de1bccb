"""``flinkish mirror``'s command-line flags -> MirrorConfig, and one clear error per mistake.

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
    parse_trigger,
)

SECRET = "s3cr:et/pw"
URL = "postgresql://cdc:s3cr%3Aet%2Fpw@db.internal:5432/shop"


def flags(**over: Any) -> MirrorConfig:
    args: dict[str, Any] = {"source": URL, "tables": "public.*", "to": "/lake", "fmt": None, "checkpoint": "/meta"}
    return from_args(**{**args, **over})




def assert_no_secret(config: MirrorConfig) -> None:
    shown = repr(config) + config.to_json() + json.dumps(config.source_options()) + json.dumps(config.sink_options())
    assert SECRET not in shown and "s3cr" not in shown


# ------------------------------------------------------------------ flags


def test_flags_give_the_options_a_python_user_passes() -> None:
    c = flags(trigger="2s", source_option=["splitSize=5000"], sink_option=["rowsPerFile=1000"])
    assert c.source_options() == {"uid": "mirror", "checkpoint": "/meta", "url": "postgresql://cdc@db.internal:5432/shop",
                                  "tables": "public.*", "splitSize": "5000", "passwordEnv": SOURCE_PASSWORD_ENV,
                                  "maxRowsPerTrigger": "200000",  # the mirror's default bound of an epoch
                                  "snapshotRowsPerTrigger": "200000",  # 100,000 per second of the trigger, >= 200,000
                                  "rowFormat": "arrow",  # packed rows for a lakehouse target
                                  "decodeIn": "sink",  # typed by the sink tasks, not the one reading the slot
                                  # the changes handed to the 2 tasks by the source (no shuffle), the chunks in 2 too
                                  "spreadChanges": "2", "snapshotPartitions": "2"}
    assert c.spread_in_source()
    assert "spreadChanges" not in flags(parallelism=1).source_options() and not flags(parallelism=1).spread_in_source()
    assert not flags(source_option=["decodeIn=source"]).spread_in_source()  # the driver would type them: a shuffle
    assert not flags(source_option=["spreadChanges=1"]).spread_in_source()  # the user's choice holds
    assert flags(parallelism=4, source_option=["snapshotPartitions=8"]).source_options()["snapshotPartitions"] == "8"
    assert flags(source_option=["rowFormat=json"]).source_options()["rowFormat"] == "json"  # the user's choice holds
    assert "decodeIn" not in flags(source_option=["rowFormat=json"]).source_options()  # JSON rows: the sink types them
    assert flags(parallelism=1).source_options()["decodeIn"] == "sink"  # one task too: read and typing in 2 processes
    assert flags(source_option=["decodeIn=source"]).source_options()["decodeIn"] == "source"
    assert flags(source_option=["maxRowsPerTrigger=5000"]).source_options()["maxRowsPerTrigger"] == "5000"
    assert flags(sink_option=["compactEvery=50"]).sink_options()["compactEvery"] == "50"  # routed targets compact
    assert flags(sink_option=["commitProcesses=2"]).sink_options()["commitProcesses"] == "2"  # the Delta commit's processes
    ice = flags(to="m.{schema}_{table}", fmt="iceberg", sink_option=["compactEvery=5"])
    assert ice.sink_options()["compactEvery"] == "5"
    # A snapshot epoch fills the default 10 s trigger; a bound the user gives holds for the snapshot too.
    assert flags().source_options()["snapshotRowsPerTrigger"] == "1000000"
    assert "snapshotRowsPerTrigger" not in flags(source_option=["maxRowsPerTrigger=5000"]).source_options()
    assert c.sink_format == "flinkish.delta"
    assert c.sink_options() == {"uid": "mirror_sink", "checkpoint": "/meta", "path": "/lake/{schema}/{table}",
                                "rowsPerFile": "1000"}
    assert c.password_env() == {SOURCE_PASSWORD_ENV: SECRET}
    assert c.trigger_s == 2.0 and c.spark_checkpoint == "/meta/spark"
    assert (c.parallelism, c.master) == (2, "local[2]")  # an epoch's per-table work in 2 tasks by default
    assert (flags(parallelism=4).parallelism, flags(parallelism=4).master) == (4, "local[4]")
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
    ({"source": "jdbc:mysql://u@h/db"}, "a database URL such as postgresql://user@host:5432/db or mysql://"),
    ({"tables": "orders"}, "not 'schema.table'"),
    ({"tables": r"public.\.*"}, r"write public.\* for public"),
    ({"fmt": "hudi"}, "--format: 'hudi' is not one of delta, iceberg, postgres"),
    ({"fmt": "iceberg", "to": "mirror.orders"}, r"needs the placeholder \{table\}"),
    ({"fmt": "iceberg", "to": "mirror.{table}.x.{tabel}"}, "placeholder other than"),
    ({"trigger": "fast"}, "--trigger: 'fast' is not a trigger interval; write e.g. 10s"),
    ({"uid": "My Mirror"}, "--uid: 'My Mirror' must be 1-40 lower-case letters"),
    ({"spark_checkpoint": "s3://b/cp"}, "must be a local folder"),
    ({"source_option": ["splitsize=5"]}, "unknown key 'splitsize'. Did you mean 'splitSize'"),
    ({"sink_option": ["mode=append"]}, r"--sink-option: options mode='append': mode 'append' is not one of upsert, history"),
    ({"sink_option": ["rowsPerFile"]}, "is not KEY=VALUE"),
    ({"parallelism": 0}, "--parallelism must be a whole number >= 1"),
])
def test_bad_flags_are_refused_naming_the_flag(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        flags(**over)
    assert "s3cr" not in str(err.value)


def test_trigger_units() -> None:
    assert [parse_trigger(v, "t") for v in ("10s", "500ms", "1m", "10 seconds", 3, "0.5")] == [10, 0.5, 60, 10, 3, 0.5]
    with pytest.raises(ConfigError):
        parse_trigger("0s", "t")


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


def test_sink_options_set_each_tables_shape_and_a_bad_rule_is_refused_before_anything_starts() -> None:
    rules = '[{"tables": "public.orders", "mode": "history"}]'
    config = flags(sink_option=["deletes=soft", f"tableModes={rules}"])
    assert config.sink_options()["deletes"] == "soft" and config.sink_options()["tableModes"] == rules
    with pytest.raises(ConfigError, match="--sink-option: tableModes rule 1 has no 'tables'"):
        flags(sink_option=['tableModes=[{"mode": "history"}]'])
    with pytest.raises(ConfigError, match="--sink-option: options mode='history', deletes='soft': deletes 'soft' is for mode 'upsert'"):
        flags(sink_option=["mode=history", "deletes=soft"])


def test_sink_options_track_history_columns_and_a_rules_partitions() -> None:
    config = flags(sink_option=["mode=history", "trackHistoryColumns.except=updated_at"])
    assert config.sink_options()["trackHistoryColumns.except"] == "updated_at"
    with pytest.raises(ConfigError, match=r"--sink-option: option trackHistoryColumns is for mode 'history'"):
        flags(sink_option=["trackHistoryColumns=price"])
    rule = 'tableModes=[{"tables": "public.events", "partitionBy": ["day"]}]'
    assert flags(sink_option=[rule]).sink_options()["tableModes"]  # Delta targets take it
    with pytest.raises(ConfigError, match=r"--sink-option: the tableModes rule\(s\) for 'public.events' give partitionBy"):
        flags(to="postgresql://writer@replica/shop", sink_option=[rule])
