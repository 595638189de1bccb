"""``./dev``: what it installs for the demo and for the tests (a stand-in Python records pip's calls: no real install)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAKE_PYTHON = """#!/bin/sh
case "$1" in
  -c) exit 0 ;;
  --version) echo "Python 3.12.0" ;;
  -m)
    if [ "$2" = venv ]; then
      mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
      printf '#!/bin/sh\\necho ran flinkish "$@"\\n' > "$3/bin/flinkish" && chmod +x "$3/bin/flinkish"
    elif [ "$2" = pip ] || [ "$2" = compileall ]; then
      echo "$*" >> "$PIP_LOG"
    fi ;;
esac
"""


def installs(tmp_path: Path, *args: str) -> list[str]:
    """Run ``./dev ARGS`` in a copy of the project; the extras pip was asked to install."""
    log = tmp_path / "pip.log"
    before = log.read_text().splitlines() if log.exists() else []
    env = {**os.environ, "PYTHON": str(tmp_path / "python3"), "PIP_LOG": str(log), "JAVA_HOME": "/nonexistent"}
    out = subprocess.run([str(tmp_path / "repo" / "dev"), *args], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = log.read_text().splitlines() if log.exists() else []
    return [ln.split("-e ", 1)[1] for ln in lines[len(before):] if "-e " in ln]


def test_the_demo_installs_only_what_it_needs_and_switching_to_the_tests_installs_their_extras(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    for name in ("dev", "setup.cfg"):
        shutil.copy2(REPO / name, tmp_path / "repo" / name)
    (tmp_path / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "python3").chmod(0o755)
    assert installs(tmp_path, "setup", "demo") == [".[demo]"]
    assert installs(tmp_path, "demo", "--workdir", "/tmp/x") == []  # installed already
    assert installs(tmp_path, "test", "-q") == [".[test]"]  # the tests need more
    assert installs(tmp_path, "demo") == []  # the test extras hold the demo's
    assert installs(tmp_path, "setup") == []
    (tmp_path / "repo" / ".venv" / ".installed").write_text("demo\n")
    assert installs(tmp_path, "demo", "--pipeline", "files") == [".[test]"]  # moto's S3 server: test extras
    later = (tmp_path / "repo" / ".venv" / ".installed").stat().st_mtime + 10
    os.utime(tmp_path / "repo" / "setup.cfg", (later, later))  # changed metadata: installed again
    assert installs(tmp_path, "demo") == [".[test]"]  # still the larger set it has


def test_every_command_leaves_the_package_compiled_for_the_workers(tmp_path: Path) -> None:
    """Where PYTHONDONTWRITEBYTECODE is set no process writes bytecode, and an editable install compiles none: each
    Python worker Spark starts would compile the package's modules from source again. ./dev compiles them once."""
    (tmp_path / "repo").mkdir()
    for name in ("dev", "setup.cfg"):
        shutil.copy2(REPO / name, tmp_path / "repo" / name)
    (tmp_path / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "python3").chmod(0o755)
    for args in (("setup", "demo"), ("demo",), ("setup",)):
        before = (tmp_path / "pip.log").read_text().count("compileall") if (tmp_path / "pip.log").exists() else 0
        installs(tmp_path, *args)
        log = (tmp_path / "pip.log").read_text()
        assert log.count("-m compileall -q -j 0 flinkish_spark") == before + 1, (args, log)


FAKE_APT = """#!/bin/sh
echo "RUNLEVEL=$RUNLEVEL apt-get $*" >> "$APT_LOG"
[ "$APT_FAILS" = 1 ] && exit 100
exit 0
"""


def test_the_tests_get_their_mariadb_server_from_apt_and_ci_stops_when_it_cannot(tmp_path: Path) -> None:
    """As root without ``mariadbd``: ./dev test installs Debian's packages (no system service started);
    a failed install stops the run under CI=true and is one line otherwise. A stand-in apt-get records the calls."""
    if os.geteuid() != 0:
        import pytest

        pytest.skip("the install path runs as root (a user without sudo gets one line naming the packages)")
    (tmp_path / "repo").mkdir()
    for name in ("dev", "setup.cfg"):
        shutil.copy2(REPO / name, tmp_path / "repo" / name)
    (tmp_path / "python3").write_text(FAKE_PYTHON)
    (tmp_path / "python3").chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "apt-get").write_text(FAKE_APT)
    (tmp_path / "bin" / "apt-get").chmod(0o755)
    log = tmp_path / "apt.log"

    def dev_test(**extra: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHON": str(tmp_path / "python3"), "PIP_LOG": str(tmp_path / "pip.log"),
               "JAVA_HOME": "/nonexistent", "APT_LOG": str(log), "FLINKISH_SBIN": str(tmp_path / "no-sbin"),
               "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", **extra}
        env.pop("CI", None)
        env.update(extra)
        return subprocess.run([str(tmp_path / "repo" / "dev"), "test", "-q"], capture_output=True, text=True,
                              env=env, timeout=60)

    out = dev_test()
    assert out.returncode == 0, out.stderr
    assert log.read_text().splitlines() == [
        "RUNLEVEL=1 apt-get -y -q install --no-install-recommends mariadb-server mariadb-client libmariadb-java"]
    log.unlink()
    out = dev_test(APT_FAILS="1", CI="true")
    assert out.returncode != 0 and "apt-get install mariadb-server mariadb-client libmariadb-java failed" in out.stderr
    assert [line.split(" apt-get ")[1].split()[2] for line in log.read_text().splitlines()] == [
        "install", "update"]  # the install failed, so did the update of the package lists: no second install
    out = dev_test(APT_FAILS="1")
    assert out.returncode == 0 and "failed" in out.stderr  # a developer's run goes on, the MySQL tests skip
