"""Running ``flinkish mirror`` as a user does, in a process of its own, for tests: start it, wait for a
condition while it runs, drain it or wait for its end -- with the end of its output in every failure message;
and the writer that changes the source tables meanwhile (:func:`writer_running`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


def flinkish() -> list[str]:
    """The ``flinkish`` console script users run (``python -m flinkish_spark.cli`` where it is not installed)."""
    script = os.path.join(os.path.dirname(sys.executable), "flinkish")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "flinkish_spark.cli"]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``env``: variables added to this process's environment (e.g. a crash point, :mod:`flinkish_spark.faults`)."""
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env=None if env is None else {**os.environ, **env})


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


@contextmanager
def logs_on_failure(*logs: Path, chars: int = 3000) -> Iterator[None]:
    """A failure inside the block also shows the end of each of ``logs`` that exists (the runs of a chain of
    restarts, Spark's log): a failure that comes once in many runs explains itself."""
    try:
        yield
    except AssertionError as exc:
        tails = [f"----- {log} (its last {chars} characters) -----\n{log.read_text(errors='replace')[-chars:]}"
                 for log in logs if log.exists()]
        raise AssertionError("\n".join([str(exc), *tails])) from exc


def drain(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> str:
    """SIGTERM, as a supervisor or Ctrl-C sends it: the command drains; its output, after asserting it did."""
    proc.send_signal(signal.SIGTERM)
    rc, out = ended(proc, log, timeout)
    assert rc == 0 and "flinkish mirror: drained" in out, out[-4000:]
    return out


@contextmanager
def writer_running(url: str, work: Path, ddl_after: str | None = None) -> Iterator[Callable[[], None]]:
    """:data:`flinkish_spark.testing.mirror.SETUP`, then its ``WRITER`` changing the tables in a process of its own
    until the function this yields is called (or the block ends). The writer's schema changes, new and dropped
    table start once the folder ``ddl_after`` holds two numbered files (Spark's commits folder: after two epochs;
    a gate folder the test fills); without ``ddl_after``, never."""
    import psycopg

    from flinkish_spark.testing.mirror import SETUP, WRITER

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP)
    stop_file = work / "stop-writer"
    if ddl_after is None:
        gate = work / "ddl-gate"  # never opened
        gate.mkdir(exist_ok=True)
        ddl_after = str(gate)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, url, str(stop_file), ddl_after])

    def stop() -> None:
        stop_file.touch()
        writer.wait(timeout=60)

    try:
        yield stop
    finally:
        stop()
