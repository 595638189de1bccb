"""The session helper refuses a machine that cannot run the package, with the fix in the message."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import flinkish_spark
from flinkish_spark.errors import EnvironmentSetupError


def test_missing_java_names_the_fix(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java anywhere
    with pytest.raises(EnvironmentSetupError, match=r"Java was not found: Spark needs Java 17 or newer.*JAVA_HOME"):
        flinkish_spark.session()


def test_bad_java_home_is_named(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojdk"))
    with pytest.raises(EnvironmentSetupError, match=r"JAVA_HOME is .*nojdk.*is not an executable"):
        flinkish_spark.session()


def test_old_java_is_refused(monkeypatch, tmp_path: Path) -> None:
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(EnvironmentSetupError, match=r"is Java 11; Spark 4 needs Java 17 or newer"):
        flinkish_spark.session()


def test_worker_python_without_the_package_is_refused(monkeypatch, tmp_path: Path) -> None:
    # An interpreter that exists but cannot import flinkish_spark (isolated mode, no site-packages).
    wrapper = tmp_path / "python-without-package"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(wrapper))
    with pytest.raises(EnvironmentSetupError) as err:
        flinkish_spark.session()
    msg = str(err.value)
    assert "cannot import flinkish_spark" in msg and f"set it to {sys.executable}" in msg


def test_worker_python_that_does_not_exist_is_refused(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", str(tmp_path / "python9"))
    with pytest.raises(EnvironmentSetupError, match=r"PYSPARK_PYTHON is .*python9.*cannot be run"):
        flinkish_spark.session()


def test_register_on_a_session_whose_workers_lack_the_package_is_refused(spark, monkeypatch, tmp_path: Path) -> None:
    wrapper = tmp_path / "python-without-package"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv("PYSPARK_PYTHON")
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(wrapper))  # as if Spark started without it
    with pytest.raises(EnvironmentSetupError) as err:
        flinkish_spark.register(spark)
    msg = str(err.value)
    assert "the Spark workers' interpreter (PYSPARK_PYTHON unset) is" in msg and "cannot import flinkish_spark" in msg


def test_workers_import_the_installed_pyspark_not_the_zip(spark) -> None:
    # Spark puts $SPARK_HOME/python/lib/pyspark.zip first on the workers' path; the session's
    # SPARK_HOME has no zip, so workers start from the installed, compiled package.
    def where(_: object) -> str:
        import pyspark

        return pyspark.__file__

    seen = set(spark.sparkContext.parallelize(range(4), 2).map(where).collect())
    assert seen and all(".zip" not in p for p in seen), seen


def test_fast_worker_home_only_for_the_drivers_own_interpreter(monkeypatch, tmp_path: Path) -> None:
    from flinkish_spark.worker_home import fast_worker_spark_home

    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = fast_worker_spark_home(sys.executable)
    assert home is not None and home.startswith(str(tmp_path / "cache"))
    assert (Path(home) / "bin" / "spark-submit").is_file() and (Path(home) / "jars").is_dir()
    assert not (Path(home) / "python").exists()
    assert fast_worker_spark_home(sys.executable) == home  # built once, then reused
    assert fast_worker_spark_home(str(tmp_path / "other-python")) is None
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "users-spark"))
    assert fast_worker_spark_home(sys.executable) is None


def test_a_remote_that_is_no_spark_connect_url_is_refused() -> None:
    from flinkish_spark.errors import ConfigError

    with pytest.raises(ConfigError, match=r"session\(remote='http://host:15002'\): expected a Spark Connect URL 'sc://host:port' or 'local\[N\]'"):
        flinkish_spark.session(remote="http://host:15002")


def test_sessions_cap_arrow_batches_by_bytes_and_the_callers_conf_wins(spark) -> None:
    # A packed CDC stream's rows are megabytes each: under the cap each pack reaches the sink task as the source
    # yields it, not all of an epoch's packs in one batch after the whole read.
    from flinkish_spark.environment import driver_conf

    assert spark.conf.get("spark.sql.execution.arrow.maxBytesPerBatch") == str(4 << 20)
    mine = driver_conf("local[2]", sys.executable, {"spark.sql.execution.arrow.maxBytesPerBatch": "1000"})
    assert mine["spark.sql.execution.arrow.maxBytesPerBatch"] == "1000"
