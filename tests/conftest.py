"""Shared fixtures: one local[2] Spark per session, moto's S3 server, a child-process pipeline runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from flinkish_spark.testing import s3 as s3_helpers
from flinkish_spark.testing.crash import ENV_DIR, ENV_POINT
from flinkish_spark.testing.pipeline import child_spec

# Before any JVM starts: Spark's Python workers inherit the environment.
s3_helpers.set_dummy_credentials()
os.environ.pop("AWS_ENDPOINT_URL", None)  # tests pass the endpoint explicitly
os.environ["PYSPARK_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import flinkish_spark
    from flinkish_spark.testing.sources import register_test_sources

    session = flinkish_spark.session(app_name="flinkish-tests")
    session.sparkContext.setLogLevel("ERROR")
    register_test_sources(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with s3_helpers.local_s3() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint: str) -> str:
    """A clean S3 server with an empty bucket named 'test'; returns the endpoint URL."""
    s3_helpers.reset(s3_endpoint)
    s3_helpers.make_bucket(s3_endpoint, "test")
    return s3_endpoint


class PipelineRun:
    def __init__(self, returncode: int, output: str) -> None:
        self.returncode = returncode
        self.output = output

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


@pytest.fixture
def run_pipeline(tmp_path: Path) -> Callable[..., PipelineRun]:
    """Run a pipeline spec in a child driver process; optionally kill -9 it at a crash point."""
    counter = 0

    def run(spec: dict[str, Any], crash_at: str | None = None, timeout: float = 300, env: dict[str, str] | None = None) -> PipelineRun:
        nonlocal counter
        counter += 1
        spec_path = tmp_path / f"spec-{counter}.json"
        spec_path.write_text(json.dumps(child_spec(spec)))
        extra = env or {}
        env = dict(os.environ)
        env.pop(ENV_POINT, None)
        env.update(extra)
        if crash_at:
            crash_dir = tmp_path / f"crash-{counter}"
            crash_dir.mkdir()
            env[ENV_POINT] = crash_at
            env[ENV_DIR] = str(crash_dir)
        proc = subprocess.Popen(
            [sys.executable, "-m", "flinkish_spark.testing.pipeline", str(spec_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"pipeline did not finish in {timeout}s:\n{out[-4000:]}")
        # Make sure nothing of the driver (JVM, workers) outlives the run.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return PipelineRun(proc.returncode, out)

    return run
