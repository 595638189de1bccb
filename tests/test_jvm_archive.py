"""The driver JVM's class archive: used when it matches, never when it is damaged or switched off."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from flinkish_spark import jvm_archive
from flinkish_spark.session import java_executable, with_class_archive
from flinkish_spark.worker_home import fast_worker_spark_home


def fake_archive(cache: Path, size: int, recorded: int) -> Path:
    """An archive file of ``size`` bytes whose record says ``recorded`` (as if truncated when they differ)."""
    archive, record = jvm_archive._paths(java_executable(), os.environ["SPARK_HOME"])
    assert archive.startswith(str(cache))
    Path(archive).parent.mkdir(parents=True, exist_ok=True)
    Path(archive).write_bytes(b"\0" * size)
    Path(record).write_text(json.dumps({"size": recorded}))
    return Path(archive)


@pytest.fixture
def cache(monkeypatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.delenv(jvm_archive.ENV_SWITCH, raising=False)
    home = fast_worker_spark_home(sys.executable)
    assert home is not None
    monkeypatch.setenv("SPARK_HOME", home)  # as session() sets it for a local master
    return tmp_path / "cache" / "flinkish_spark"


def test_a_matching_archive_goes_first_in_the_drivers_options(cache: Path) -> None:
    archive = fake_archive(cache, 100, 100)
    conf = with_class_archive("local[2]", {"spark.driver.extraJavaOptions": "-Xss4m", "spark.x": "1"})
    assert conf == {"spark.driver.extraJavaOptions": f"-XX:SharedArchiveFile={archive} -Xshare:auto -Xss4m", "spark.x": "1"}
    # Executors of a local-cluster run other JVMs, with another classpath: never for them.
    assert with_class_archive("local-cluster[2,1,1024]", {}) == {}


def test_a_truncated_archive_is_never_used(cache: Path) -> None:
    # A JVM that maps a truncated archive crashes: the size recorded at build time must match.
    fake_archive(cache, 50, 100)
    assert with_class_archive("local[2]", {}) == {}


def test_switched_off(cache: Path, monkeypatch) -> None:
    fake_archive(cache, 100, 100)
    monkeypatch.setenv(jvm_archive.ENV_SWITCH, "0")
    assert with_class_archive("local[2]", {}) == {}
    assert jvm_archive.build(java_executable()) is None


def test_the_suites_drivers_map_the_archive_built_at_session_start(spark) -> None:
    # conftest builds the archive before any JVM starts (flinkish jvm-archive); the session's
    # driver JVM, like every child pipeline's, was started with it.
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    args = [str(a) for a in runtime.getInputArguments()]
    mapped = [a for a in args if a.startswith("-XX:SharedArchiveFile=")]
    assert mapped, args
    path = Path(mapped[0].split("=", 1)[1])
    assert path.is_file() and path.stat().st_size > 10_000_000
    assert spark.range(1000).selectExpr("sum(id)").first()[0] == 499500
