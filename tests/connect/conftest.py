"""One Spark Connect server per test session, in a process of its own, and clients in child processes.

The clients are child processes (the runner, or a short script) so that each one is a real
Connect client: no JVM, listeners fed over gRPC, and an exit that this suite can watch. The
test process itself stays a Classic driver for the rest of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Callable, Iterator

import pytest

from flinkish_spark.embedded.connect import ConnectServer


@pytest.fixture(scope="session")
def connect_server_process() -> Iterator[ConnectServer]:
    server = ConnectServer("local[2]")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def connect_server(connect_server_process: ConnectServer) -> ConnectServer:
    """The session's Connect server, running (started again if a test killed it)."""
    if not connect_server_process.running():
        connect_server_process.start()
    return connect_server_process


@pytest.fixture
def run_client(connect_server: ConnectServer, run_pipeline: Callable[..., Any]) -> Callable[..., Any]:
    """``run_pipeline`` with the pipeline's driver replaced by a Connect client of the session's server."""

    def run(spec: dict[str, Any], **kwargs: Any) -> Any:
        return run_pipeline({**spec, "remote": connect_server.url}, **kwargs)

    return run


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess]:
    """Run a client script in a child Python; a client that does not exit in time fails the test."""
    return _run_script


def _run_script(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLINKISH_CRASH")}
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                              env=env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise AssertionError(f"the client did not exit within {timeout}s; its output:\n{out[-3000:]}") from None
