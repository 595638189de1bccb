"""``flinkish mirror``'s supervisor when the pipeline process ends by a signal (fast: no Spark, no database).

The pipeline process is replaced by a script that kills itself with SIGKILL -- what a crash point
(``FLINKISH_CRASH_AT``), ``kill -9`` or the out-of-memory killer does to the driver.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

import pytest

from flinkish_spark import cli
from flinkish_spark.mirror import pipeline


def fake_driver(tmp_path: Path, body: str) -> str:
    """An executable that stands in for ``python -m flinkish_spark.mirror.pipeline`` (it reads the config first)."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\ncat >/dev/null\n{body}\n")
    script.chmod(0o755)
    return str(script)


def mirror(tmp_path: Path) -> list[str]:
    return ["mirror", "--from", "postgresql://u@127.0.0.1:1/db", "--tables", "public.*",
            "--to", str(tmp_path / "lake"), "--checkpoint", str(tmp_path / "meta")]


@pytest.fixture
def no_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "preflight", lambda config: None)


def test_a_driver_killed_by_sigkill_exits_137_and_says_the_same_command_continues(
        no_preflight: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", fake_driver(tmp_path, "kill -9 $$"))
    rc = cli.main(mirror(tmp_path))
    err = capsys.readouterr().err
    assert rc == 128 + signal.SIGKILL == 137, err
    assert "driver was killed (SIGKILL" in err, err
    assert "run the same command again: it continues from the checkpoint" in err, err


def test_a_driver_ending_normally_passes_its_exit_code_on_without_a_kill_message(
        no_preflight: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", fake_driver(tmp_path, "exit 1"))
    assert cli.main(mirror(tmp_path)) == 1
    assert "killed" not in capsys.readouterr().err


def test_the_pipeline_process_arms_crash_points_for_its_own_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash point kills the whole driver (this process, the JVM, the workers: the group the supervisor
    started it in), never a group named by an inherited variable."""
    from flinkish_spark.faults import ENV_PGID

    monkeypatch.setenv(ENV_PGID, "1")
    seen: list[str | None] = []
    monkeypatch.setattr(sys, "stdin", io.StringIO("{}"))
    monkeypatch.setattr(pipeline.MirrorConfig, "from_json", staticmethod(lambda *args: None))
    monkeypatch.setattr(pipeline, "run", lambda config: seen.append(os.environ.get(ENV_PGID)) or 0)
    assert pipeline.main() == 0
    assert seen == [str(os.getpgrp())]  # armed before the pipeline (and Spark) starts
