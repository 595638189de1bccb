"""Shared fixtures: one local[2] Spark per session, moto's S3 server, one PostgreSQL server, a child-process pipeline runner.

The suite runs in parallel (pytest-xdist, ``-n`` in setup.cfg; see docs/testing.md). Every
fixture here is safe for that *by construction*, so a new test inherits it without care:

* a session fixture is one per worker process: each worker has its own Spark session, its own
  moto servers, its own PostgreSQL 18 and 15 servers (``postgres``, ``postgres15``), its own
  MariaDB server (``mariadb``, started by the first test that asks for it) and its own
  Spark Connect server (tests/connect/conftest.py), each on a free port and in a folder of its own;
* what a test writes lives under its own ``tmp_path``, in a database named after the test
  (``pg_url``) or in a bucket of its worker's S3 server (``s3`` / ``s3_proc`` empty it first);
  a second PostgreSQL server (other settings) starts on a free port in a ``tempfile.mkdtemp``
  folder, not under pytest's basetemp;
* child drivers (``run_pipeline``) run in a process group of their own and count crash-point
  hits in a folder of their own: a kill -9 never reaches another test's processes.

Never use a fixed port, a fixed path outside ``tmp_path`` or a name shared between tests.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from flinkish_spark.embedded import s3 as s3_helpers
from flinkish_spark.faults import ENV_DIR, ENV_POINT
from flinkish_spark.runner import SHORT_LIVED_JVM, child_spec

POSTGRES_URL_ENV = "FLINKISH_TEST_POSTGRES_URL"  # run the PostgreSQL tests against this server instead
#: Debian's PostgreSQL 15 on this machine image (and CI's): tests marked ``both_postgres`` also run on it.
POSTGRES_15_BIN = "/usr/lib/postgresql/15/bin"

# Before any JVM starts: Spark's Python workers inherit the environment.
s3_helpers.set_dummy_credentials()
os.environ.pop("AWS_ENDPOINT_URL", None)  # tests pass the endpoint explicitly
os.environ["PYSPARK_PYTHON"] = sys.executable
# Every driver JVM the suite starts through spark-submit -- this worker's session, each `flinkish mirror`
# child process, each Connect server -- with the short-lived JVM settings `run_pipeline`'s children already get
# (runner.SHORT_LIVED_JVM: C1 only, the serial collector). Spark's launcher puts SPARK_SUBMIT_OPTS on the driver's
# command line. Measured on four mirror test files (-n 2, three alternated pairs): 10-16 % less CPU, the same wall
# time within the noise (docs/testing.md). A test run only: a long-running pipeline wants the default JIT.
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_LIVED_JVM)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before any JVM: the class archive that starts each driver JVM (the session's, every child
    pipeline's) ~4 s faster; built once per machine (~1 min), kept in ~/.cache/flinkish_spark.

    Under xdist this runs in the controller before it starts the workers, so the workers find
    the archive built; ``build`` also holds a file lock, so concurrent suites build it once."""
    if _is_xdist_worker(session.config):
        return
    from flinkish_spark.errors import EnvironmentSetupError
    from flinkish_spark.jvm_archive import build
    from flinkish_spark.session import java_executable

    try:
        build(java_executable())
    except EnvironmentSetupError:
        pass  # no Java: the Spark tests fail with the session's own clear error


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the slow tests first: a worker takes the next test whenever it is free, so
    longest-first leaves no long test to start last on one worker while the other idles."""
    if _is_xdist_worker(config):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order otherwise


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (setup.cfg): one worker per CPU, at least 2 -- a Spark test spends much of its
    time waiting (for a trigger, a child driver, a server), so even one CPU keeps two busy.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS=N`` overrides it (read here: xdist reads it only in its own hook, which
    this one replaces)."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(2, os.cpu_count() or 1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_postgres: run against the embedded PostgreSQL 18 and an installed "
                            f"PostgreSQL 15 ({POSTGRES_15_BIN}); the test takes the fixture pg_url or pg_server")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("both_postgres") and "pg_server" in metafunc.fixturenames:
        metafunc.parametrize("pg_server", ["pg18", "pg15"], indirect=True)


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


@pytest.fixture(scope="session")
def s3_process_endpoint() -> Iterator[str]:
    """moto's S3 server in a process of its own. delta-rs holds the GIL while it waits for S3,
    which starves the in-process server of the ``s3`` fixture (the call times out after minutes)."""
    with s3_helpers.local_s3_process() as endpoint:
        yield endpoint


@pytest.fixture
def s3_proc(s3_process_endpoint: str) -> str:
    """Like ``s3`` (a clean server with the bucket 'test'), the server in its own process."""
    s3_helpers.reset(s3_process_endpoint)
    s3_helpers.make_bucket(s3_process_endpoint, "test")
    return s3_process_endpoint


@dataclass
class PostgresForTests:
    """The session's PostgreSQL: the embedded server, or the one ``FLINKISH_TEST_POSTGRES_URL`` names."""

    url: str
    embedded: Any  # flinkish_spark.embedded.postgres.EmbeddedPostgres, or None for an external server

    def url_for(self, database: str) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresForTests]:
    """One PostgreSQL server per test session (two-phase commit and logical WAL enabled)."""
    external = os.environ.get(POSTGRES_URL_ENV)
    if external:
        yield PostgresForTests(external, None)
        return
    from flinkish_spark.embedded.postgres import temporary_postgres

    # Not under pytest's basetemp (see temporary_postgres): a second suite beside this one reset
    # /tmp/pytest-of-<user> to 0700 and made the server PANIC.
    with temporary_postgres("flinkish-test-postgres-") as server:
        yield PostgresForTests(server.uri, server)


@pytest.fixture(scope="session")
def postgres15() -> Iterator[PostgresForTests]:
    """Debian's PostgreSQL 15 of this machine image, started from the project's own code like the 18."""
    if not os.path.isfile(os.path.join(POSTGRES_15_BIN, "postgres")):
        pytest.skip(f"no PostgreSQL 15 installed in {POSTGRES_15_BIN} (apt-get install postgresql-15)")
    from flinkish_spark.embedded.postgres import temporary_postgres

    with temporary_postgres("flinkish-test-postgres15-", bin_dir=POSTGRES_15_BIN) as server:
        yield PostgresForTests(server.uri, server)


@pytest.fixture(scope="session")
def pymysql_installed() -> None:
    """PyMySQL comes with the extra ``flinkish_spark[mysql]`` (pulled by ``[test]``): without it the MySQL tests are
    skipped on a developer's machine and fail under CI, as a missing server does."""
    try:
        import pymysql  # noqa: F401
    except ImportError:
        message = "PyMySQL is not installed (pip install -e '.[mysql]')"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + ": CI must run the MySQL tests", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def mariadb(pymysql_installed: None) -> Iterator[Any]:
    """One MariaDB server per test session (per xdist worker): Debian's ``mariadb-server`` (10.11),
    started by flinkish_spark.embedded.mariadb with the row-based binary log the MySQL source needs.

    Missing server: skipped on a developer's machine (one line naming the package), a failure
    under CI (``CI=true``), so that CI never passes without running the MySQL tests."""
    from flinkish_spark.embedded import mariadb as embedded

    if not embedded.installed():
        message = f"no MariaDB server on this machine ({embedded.INSTALL_HINT}; ./dev test installs it as root)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + ": CI must run the MySQL tests", pytrace=False)
        pytest.skip(message)
    with embedded.temporary_mariadb("flinkish-test-mariadb-") as server:
        yield server


@pytest.fixture
def pg_server(request: pytest.FixtureRequest) -> PostgresForTests:
    """The session's PostgreSQL; under ``@pytest.mark.both_postgres`` the 18 and the 15 in turn."""
    which = getattr(request, "param", "pg18")
    return request.getfixturevalue("postgres15" if which == "pg15" else "postgres")


@pytest.fixture
def pg_url(pg_server: PostgresForTests, request: pytest.FixtureRequest) -> Iterator[str]:
    """A libpq URI of a fresh, empty database for this test. Replication slots the test left in
    it are dropped afterwards: they would hold WAL on the shared server for the rest of the session."""
    import psycopg

    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:50]
    yield pg_server.create_database(name)
    try:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE database = %s AND NOT active", (name,))
    except psycopg.Error:
        pass  # best effort: a slot still in use by a query the test left running



@pytest.fixture
def target_url(pg_url: str) -> Iterator[str]:
    """A second database on the same server as ``pg_url``: the target of a PostgreSQL mirror."""
    import psycopg

    name = pg_url.rsplit("/", 1)[1] + "_t"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")

def _exit_within(proc: subprocess.Popen, seconds: float) -> int | None:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


class PipelineRun:
    def __init__(self, returncode: int, output: str) -> None:
        self.returncode = returncode
        self.output = output

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


@pytest.fixture
def run_pipeline(tmp_path: Path) -> Callable[..., PipelineRun]:
    """Run a pipeline spec in a child driver process; optionally kill -9 it at a crash point.
    ``{"queries": [spec, ...]}`` runs several specs one after the other in one driver (one Spark start)."""
    counter = 0

    def run(spec: dict[str, Any], crash_at: str | None = None, timeout: float = 300, env: dict[str, str] | None = None,
            kill_after: float | None = None, kill_when: Callable[[], bool] | None = None) -> PipelineRun:
        """``kill_after``: kill -9 the whole process group that many seconds after the query started
        (the runner prints ``QUERY_STARTED``) -- or, with ``kill_when``, after that also returned
        True (polled) -- wherever the run is then: a random moment when the delay is random."""
        nonlocal counter
        counter += 1
        spec_path = tmp_path / f"spec-{counter}.json"
        # The child driver knows the suite's own formats (flinkish.testing.counting) too.
        def child(one: dict[str, Any]) -> dict[str, Any]:
            return child_spec({**one, "register": ["flinkish_spark.testing.sources:register_test_sources",
                                                   *one.get("register", [])]})

        # {"queries": [spec, ...]}: the specs one after the other in one driver (flinkish_spark.testing.queries)
        chained = "queries" in spec
        spec_path.write_text(json.dumps({"queries": [child(q) for q in spec["queries"]]} if chained else child(spec)))
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
            [sys.executable, "-m", "flinkish_spark.testing.queries" if chained else "flinkish_spark.runner", str(spec_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        started = threading.Event()

        def collect() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("QUERY_STARTED"):
                    started.set()

        reader = threading.Thread(target=collect, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + timeout
            if kill_after is not None:
                while not started.wait(0.2) and proc.poll() is None and time.monotonic() < deadline:
                    pass
                while kill_when is not None and started.is_set() and not kill_when() and proc.poll() is None \
                        and time.monotonic() < deadline:
                    time.sleep(0.1)
                if started.is_set() and _exit_within(proc, kill_after) is None:
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join(timeout=10)
            raise AssertionError(f"pipeline did not finish in {timeout}s:\n{''.join(lines)[-4000:]}")
        reader.join(timeout=30)
        # Make sure nothing of the driver (JVM, workers) outlives the run.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return PipelineRun(proc.returncode, "".join(lines))

    return run


@pytest.fixture
def run_with_random_kills(tmp_path: Path) -> Callable[..., str]:
    """Run a pipeline spec under a processing-time trigger in child drivers; kill -9 the whole
    driver at a random moment after each of the first ``kills`` runs has made progress; restart
    until the bounded query ends by itself. Returns the last run's output.

    ``progress()`` is read from the target (e.g. the last committed epoch): a kill waits until
    it has grown in the run, then lands 0-1.5 s later -- somewhere in the next epoch, never in
    the driver's start-up (a kill at a fixed wall time lands there on a slow machine).
    """
    import random
    import time

    def run(spec: dict[str, Any], progress: Callable[[], int], kills: int, seed: int,
            env: dict[str, str] | None = None, trigger: str = "1 second") -> str:
        rng = random.Random(seed)
        path = tmp_path / "random-kill-spec.json"
        path.write_text(json.dumps(child_spec({**spec, "trigger": trigger, "end": "finish", "runSeconds": 300})))
        child_env = {k: v for k, v in os.environ.items() if k != ENV_POINT}
        child_env.update(env or {})
        killed = 0
        for attempt in range(kills + 3):
            log = tmp_path / f"random-kill-{attempt}.log"
            with open(log, "w") as out:  # a file, not a pipe: nobody reads while the driver runs
                proc = subprocess.Popen([sys.executable, "-m", "flinkish_spark.runner", str(path)], stdout=out,
                                        stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
                try:
                    if killed < kills:
                        start, deadline = progress(), time.time() + 300
                        while proc.poll() is None and progress() <= start and time.time() < deadline:
                            time.sleep(0.3)
                        time.sleep(rng.uniform(0, 1.5))
                        if proc.poll() is None:
                            os.killpg(proc.pid, signal.SIGKILL)
                            proc.wait()
                            killed += 1
                            continue
                    proc.wait(timeout=400)
                finally:
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            text = log.read_text()
            assert proc.returncode == 0, text[-3000:]
            assert "QUERY_END=finished" in text, text[-3000:]
            assert killed == kills, f"only {killed} of {kills} kills landed before the query ended"
            return text
        raise AssertionError(f"the query did not end after {kills} kills")

    return run
