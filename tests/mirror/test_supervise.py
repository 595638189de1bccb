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


def test_a_signal_while_the_pipeline_process_starts_is_its_drain_request_not_its_death(
        no_preflight: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Ctrl-C / SIGTERM before the pipeline process has its handler (Python still importing, ~1 s on a loaded
    machine) killed it: exit 143 and "the driver was killed (SIGTERM: kill -9, a crash ...)". It waits for the
    handler instead: the stand-in pipeline (the real signal handling, late) counts it once and ends well."""
    import threading
    import time

    import flinkish_spark

    started = tmp_path / "started"
    script = tmp_path / "fake-python"  # run directly by the kernel (a shell in between may reset the signal mask)
    script.write_text(f"""#!{sys.executable}
import sys, time
sys.stdin.read()
open({str(started)!r}, "w").close()
time.sleep(1.0)  # still starting: no handler yet
sys.path.insert(0, {os.path.dirname(os.path.dirname(flinkish_spark.__file__))!r})
from flinkish_spark.mirror.pipeline import _Signals
signals = _Signals()
time.sleep(0.3)
sys.exit(0 if signals.count == 1 else 3)
""")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    main = threading.main_thread().ident
    assert main is not None

    def ctrl_c_while_it_starts() -> None:
        deadline = time.time() + 30
        while not started.exists() and time.time() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGTERM)  # to the command, as `kill` or the terminal sends it

    threading.Thread(target=ctrl_c_while_it_starts, daemon=True).start()
    rc = cli.main(mirror(tmp_path))
    err = capsys.readouterr().err
    assert rc == 0 and "killed" not in err, (rc, err)
