"""The driver JVM's class archive: used when it matches, never when it is damaged or switched off."""

from __future__ import annotations

import json
import os
import re
import subprocess
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
    # Given is not used: a JVM that refuses the archive only warns and maps the JDK's base archive alone.
    # Mapped, the archive (Spark's classes) adds its size to what the JVM says it mapped.
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    jcmd = os.path.join(os.path.dirname(os.path.realpath(java_executable())), "jcmd")
    if not os.path.isfile(jcmd):
        pytest.skip(f"no {jcmd}: a Java runtime without the JDK's tools cannot say what its JVM mapped")
    info = subprocess.run([jcmd, str(pid), "VM.info"], capture_output=True, text=True, timeout=60).stdout
    sizes = [int(m) for m in re.findall(r"CDS archive\(s\) mapped at: .*?size (\d+)", info)]
    assert sizes and sizes[0] > path.stat().st_size / 2, [line for line in info.splitlines() if "CDS" in line]
    assert spark.range(1000).selectExpr("sum(id)").first()[0] == 499500


def test_an_archive_made_before_the_jars_were_installed_again_is_not_used(cache: Path, tmp_path: Path) -> None:
    """The JVM checks each jar's size and time against the archive and refuses a mismatch ("The top archive
    failed to load") -- then every driver starts without it. A venv installed again at the same path (a CI
    checkout) has the same jar names but new times: its drivers must get an archive of their own."""
    home = tmp_path / "spark-home"
    (home / "jars").mkdir(parents=True)
    for name in ("a.jar", "b.jar"):
        (home / "jars" / name).write_bytes(b"PK")
    java = java_executable()
    archive, record = jvm_archive._paths(java, str(home))
    Path(archive).parent.mkdir(parents=True, exist_ok=True)
    Path(archive).write_bytes(b"\0" * 100)
    Path(record).write_text(json.dumps({"size": 100}))
    assert jvm_archive.driver_java_options(java, str(home)) == f"-XX:SharedArchiveFile={archive} -Xshare:auto"
    os.utime(home / "jars" / "b.jar", ns=(1_000_000_000, 1_000_000_000))  # reinstalled: same name, another time
    assert jvm_archive.driver_java_options(java, str(home)) is None


def test_a_new_archive_removes_the_ones_no_driver_can_use(cache: Path, tmp_path: Path, monkeypatch) -> None:
    """Each archive is ~180 MB: one made for this SPARK_HOME's older jars, or for a SPARK_HOME since deleted, goes
    when a new one is built; another live SPARK_HOME's stays."""
    live_home = tmp_path / "live-home"
    (live_home / "bin").mkdir(parents=True)
    (live_home / "bin" / "spark-submit").write_text("")
    cache.mkdir(parents=True, exist_ok=True)
    homes = {"older": os.environ["SPARK_HOME"], "deleted": str(tmp_path / "gone"), "live": str(live_home)}
    for name, home in homes.items():
        (cache / f"jvm-0-{name}.jsa").write_bytes(b"\0")
        (cache / f"jvm-0-{name}.json").write_text(json.dumps({"size": 1, "sparkHome": home}))
    monkeypatch.setattr(jvm_archive.subprocess, "run", fake_dump_and_probe)
    archive = jvm_archive.build(java_executable())
    assert archive is not None and Path(archive).is_file()
    assert sorted(p.name for p in cache.glob("jvm-0-*")) == ["jvm-0-live.jsa", "jvm-0-live.json"]


def fake_dump_and_probe(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    """``java -version`` (the key), the dump (writes the archive file it is given) and the probe, without a JVM."""
    if cmd[0] == sys.executable:
        Path(cmd[-1]).write_bytes(b"\0" * 64)
    return subprocess.CompletedProcess(cmd, 0, "", "openjdk version")
