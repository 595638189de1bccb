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
    elif [ "$2" = pip ]; then
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
