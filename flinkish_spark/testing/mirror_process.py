"""Running ``flinkish mirror`` as a user does, in a process of its own, for tests: start it, wait for a
condition while it runs, wait for its end -- with the end of its output in every failure message."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def flinkish() -> list[str]:
    """The ``flinkish`` console script users run (``python -m flinkish_spark.cli`` where it is not installed)."""
    script = os.path.join(os.path.dirname(sys.executable), "flinkish")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "flinkish_spark.cli"]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``cmd`` started with its output in ``log``; ``env``: its environment (default: this process's)."""
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)


def wait_for(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path,
             timeout: float = 300) -> None:
    """Until ``check()``; fails if the command ends first or ``timeout`` seconds pass."""
    deadline = time.time() + timeout
    while not check():
        assert proc.poll() is None, f"the mirror ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.time() < deadline, f"no {what} within {timeout}s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def ended(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> tuple[int, str]:
    """The command's exit code and output once it ends (killed, and a failure, after ``timeout`` seconds)."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the mirror did not end within {timeout}s:\n{log.read_text()[-4000:]}") from None
    return rc, log.read_text()
