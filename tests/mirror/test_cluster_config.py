"""Where ``flinkish mirror`` runs: ``--master`` / ``--remote`` and the pipeline file's ``master`` / ``remote``.

Fast (no Spark, no server): the accepted forms, one clear error per mistake with nothing created, paths made
absolute (an executor or a Connect server has another working folder), and a Connect URL's token never shown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.cli import main
from flinkish_spark.errors import ConfigError
from flinkish_spark.mirror.cluster import EXIT_RETRY, lost_server_line
from flinkish_spark.mirror.config import MirrorConfig, from_args
from flinkish_spark.mirror.pipeline_file import from_document

URL = "postgresql://cdc@db.internal:5432/shop"


def flags(**over: Any) -> MirrorConfig:
    args: dict[str, Any] = {"source": URL, "tables": "public.*", "to": "/lake", "fmt": None, "checkpoint": "/meta"}
    return from_args(**{**args, **over})


def doc(**pipeline: Any) -> dict[str, Any]:
    return {"source": {"type": "postgres", "url": URL, "tables": "public.*"}, "sink": {"type": "delta", "path": "/lake"},
            "pipeline": {"checkpoint": "/meta", **pipeline}}


@pytest.mark.parametrize("master", ["local", "local[4]", "local[*]", "local[2,3]", "local-cluster[2,1,1024]",
                                    "spark://m1:7077", "spark://m1:7077,m2:7077", "yarn", "k8s://https://k8s.io:443",
                                    "k8s://10.0.0.1:6443"])
def test_the_masters_spark_knows_are_taken(master: str) -> None:
    assert flags(master=master).master == master
    assert from_document(doc(master=master)).master == master
    assert flags(master=master).remote is None


def test_a_connect_server_and_its_timeout() -> None:
    c = flags(remote="sc://spark:15002", server_timeout="15s")
    assert (c.remote, c.server_timeout_s, c.master) == ("sc://spark:15002", 15.0, "local[2]")
    f = from_document(doc(remote="sc://spark:15002/;token=abc", **{"server-timeout": 30}))
    assert (f.remote, f.server_timeout_s) == ("sc://spark:15002/;token=abc", 30.0)
    assert flags().remote is None and from_document(doc(parallelism=3)).master == "local[3]"


def test_parallelism_on_a_master_is_the_number_of_sink_tasks() -> None:
    f = from_document(doc(parallelism=4, master="yarn"))
    assert (f.master, f.parallelism) == ("yarn", 4)
    c = flags(master="spark://m:7077", parallelism=8)
    assert (c.master, c.parallelism) == ("spark://m:7077", 8)
    assert (flags(parallelism=3).master, flags().parallelism) == ("local[3]", 2)


def test_relative_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    c = flags(to="lake", checkpoint="meta", spark_checkpoint="spark", remote="sc://h:1")
    assert c.checkpoint == str(tmp_path / "meta") and c.spark_checkpoint == str(tmp_path / "spark")
    assert c.target == str(tmp_path / "lake") + "/{schema}/{table}"
    assert c.source_options()["checkpoint"] == c.sink_options()["checkpoint"] == str(tmp_path / "meta")
    f = from_document({**doc(), "sink": {"type": "delta", "path": "lake"}, "pipeline": {"checkpoint": "meta"}})
    assert (f.checkpoint, f.spark_checkpoint) == (str(tmp_path / "meta"), str(tmp_path / "meta" / "spark"))
    assert f.target == str(tmp_path / "lake") + "/{schema}/{table}"
    assert flags(checkpoint="s3://b/meta", to="s3://b/lake").checkpoint == "s3://b/meta"  # URLs as they are


@pytest.mark.parametrize("over, message", [
    ({"master": "local", "remote": "sc://h:1"}, "--master and --remote together"),
    ({"master": "lokal[2]"}, "--master: 'lokal\\[2\\]' is not a Spark master URL; use local\\[N\\]"),
    ({"master": "local-cluster[2,1]"}, "is not a Spark master URL"),
    ({"master": "spark//m:7077"}, "is not a Spark master URL"),
    ({"remote": "http://h:15002"}, "--remote: 'http://h:15002' is not a Spark Connect URL; use sc://host:port"),
    ({"remote": "sc://h:port;token=SECRET"}, "--remote: 'sc://h:port' is not a Spark Connect URL"),
    ({"server_timeout": "30s"}, "--server-timeout is for a Spark Connect server"),
    ({"remote": "sc://h:1", "server_timeout": "soon"}, "--server-timeout: 'soon' is not a duration"),
    ({"remote": "sc://h:1", "checkpoint": "s3://b/meta"}, "give --spark-checkpoint, a folder on the Spark Connect"),
    ({"remote": "sc://h:1", "source": "postgresql://u:pw@h/db"}, "the password in --from cannot reach the connectors"),
])
def test_bad_placements_are_refused_naming_the_flag(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        flags(**over)
    assert "SECRET" not in str(err.value) and "pw@" not in str(err.value)


def test_a_password_for_the_server_is_named_by_passwordenv() -> None:
    c = flags(remote="sc://h:1", source="postgresql://u:pw@h/db", source_option=["passwordEnv=PG_PW"])
    assert c.source_options()["passwordEnv"] == "PG_PW" and c.password_env() == {"PG_PW": "pw"}


@pytest.mark.parametrize("pipeline, message", [
    ({"master": "local", "remote": "sc://h:1"}, "pipeline.master and pipeline.remote together"),
    ({"master": "cluster"}, "pipeline.master: 'cluster' is not a Spark master URL"),
    ({"remote": "grpc://h:1"}, "pipeline.remote: 'grpc://h:1' is not a Spark Connect URL"),
    ({"server-timeout": 5}, "pipeline.server-timeout is for a Spark Connect server"),
])
def test_bad_pipeline_file_placements_are_refused(pipeline: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_document(doc(**pipeline))


def test_the_command_refuses_before_anything_is_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake, meta = tmp_path / "lake", tmp_path / "meta"
    base = ["mirror", "--from", URL, "--tables", "public.*", "--to", str(lake), "--checkpoint", str(meta)]
    assert main([*base, "--master", "local[2]", "--remote", "sc://h:1"]) == 2
    assert "--master and --remote together" in capsys.readouterr().err
    assert main([*base, "--remote", "sc:/h"]) == 2
    assert "--remote: 'sc:/h' is not a Spark Connect URL" in capsys.readouterr().err
    path = tmp_path / "p.yaml"
    path.write_text(f"source: {{type: postgres, url: '{URL}', tables: 'public.*'}}\n"
                    f"sink: {{type: delta, path: {lake}}}\npipeline: {{checkpoint: {meta}}}\n")
    assert main(["mirror", str(path), "--master", "yarn"]) == 2
    assert "--master cannot be combined with a pipeline file" in capsys.readouterr().err
    assert not lake.exists() and not meta.exists() and os.listdir(tmp_path) == ["p.yaml"]


def test_a_lost_server_says_how_to_continue_without_the_token() -> None:
    from flinkish_spark.errors import ConnectServerUnavailableError

    c = flags(remote="sc://spark:15002/;token=SECRET", server_timeout="20s")
    exc = ConnectServerUnavailableError("the Spark Connect server sc://spark:15002 did not answer for 20s "
                                        "(server_timeout): the query no longer runs there. Once ...")
    line = lost_server_line(c, exc)
    assert line.startswith("the Spark Connect server sc://spark:15002 did not answer for 20s (--server-timeout): the "
                           "mirror's query no longer runs there") and f"(exit {EXIT_RETRY})" in line
    assert "SECRET" not in lost_server_line(c, RuntimeError("UNAVAILABLE"))


def test_the_session_of_each_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    import flinkish_spark
    from flinkish_spark.mirror.cluster import session
    from flinkish_spark.mirror.config import SOURCE_PASSWORD_ENV

    calls: list[dict[str, Any]] = []

    class Driver:
        sparkContext = type("SC", (), {"setLogLevel": lambda self, level: None})()

    def fake_session(**kw: Any) -> Driver:
        calls.append(kw)
        return Driver()

    monkeypatch.setattr(flinkish_spark, "session", fake_session)
    secret = "postgresql://u:pw@h/db"
    session(flags(source=secret, master="spark://m:7077"))
    session(flags(source=secret))
    session(flags(remote="sc://h:15002", server_timeout="5s"))
    # executors of other machines get the password's variable (Spark redacts names with PASSWORD); local ones inherit it
    assert calls[0]["master"] == "spark://m:7077" and calls[0]["conf"] == {f"spark.executorEnv.{SOURCE_PASSWORD_ENV}": "pw"}
    assert calls[1]["master"] == "local[2]" and calls[1]["conf"] == {}
    assert calls[2] == {"remote": "sc://h:15002", "app_name": "flinkish-mirror-mirror", "server_timeout": 5.0}


def test_under_remote_the_log_is_on_this_machine_not_beside_the_servers_spark_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    c = flags(checkpoint="s3://b/meta", spark_checkpoint="/local_disk0/mirror", remote="sc://h:1")
    assert c.log_file.startswith(str(tmp_path / "state" / "flinkish_spark" / "mirror" / "mirror-"))
    assert c.log_file.endswith(".log")
    assert flags(checkpoint="/meta", spark_checkpoint="/srv/spark", remote="sc://h:1").log_file == "/meta/spark.log"
    assert flags(checkpoint="/meta", spark_checkpoint="/srv/spark").log_file == "/srv/spark.log"  # the driver is here
