"""A Spark Connect server in a process of its own, on a free loopback port.

For ``flinkish_spark.session(remote="local[N]")``, the demo (``flinkish demo --remote``), the
tests and the benchmarks. The pyspark wheel ships the server
(``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``); this module
starts it the way :func:`flinkish_spark.session` starts a local driver
(:mod:`flinkish_spark.environment`: Java check, the workers run this interpreter, the fast
``SPARK_HOME``, the class archive), so a pipeline behaves alike through either.

Usage::

    with local_connect_server("local[2]") as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()

The server runs in a new process group: :meth:`ConnectServer.kill` is ``kill -9`` of the
whole server (its JVM and its Python workers), as a crash test needs. A crash point armed in
the environment of a start (``FLINKISH_CRASH_AT``, :mod:`flinkish_spark.faults`) kills that
whole group too, from whichever of the server's Python workers reaches it. With ``tie_to_this_process`` the kernel kills the server when
the process that started it dies (Linux), and it is stopped when that process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from flinkish_spark.environment import check_java, check_worker_python, driver_conf, local_driver_environment
from flinkish_spark.errors import EnvironmentSetupError
from flinkish_spark.faults import ENV_PGID, ENV_POINT

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 240.0  # a cold JVM on a busy two-core machine takes 30-60 s

# Spark runs every streaming query in a clone of its session; under Spark Connect the clone has
# an artifact state of its own (its SPARK_JOB_ARTIFACT_UUID), and Spark keys the Python daemons
# of the driver-side calls by it. So each streaming query of a Python data source starts up to
# four new Python daemons on the server (create_data_source, plan_data_source_read,
# write_into_data_source, python_streaming_sink_runner: an interpreter, pyspark, pyarrow and
# flinkish imports each, 2-3 s in the query's first epoch on a two-core machine), and they stay
# until the server stops. With this session conf "false" (set on the *client* session: the server
# forces "true" for the sessions it makes), the queries' clones have no artifact state of their
# own and share the server's daemons, as on a Classic driver. The price: artifacts a client
# uploads (``spark.addArtifacts``: jars, pyfiles, archives) are not kept apart per session, which
# a single-user server does not need. ``flinkish_spark.session(remote="local[N]")`` sets it.
ARTIFACT_ISOLATION = "spark.sql.artifact.isolation.enabled"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when the thread that started it ends
    (Linux ``PR_SET_PDEATHSIG``), or None where there is no ``prctl``. The function is looked up
    here, in the parent: between fork and exec the child only calls it."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)


@dataclass
class ConnectServer:
    """One Spark Connect server process; :meth:`start` again after :meth:`kill` restarts it on the same port."""

    master: str = "local[2]"
    conf: Mapping[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    tie_to_this_process: bool = False
    log_path: str = ""  # default: a temporary file, removed by stop()
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _own_log: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, env: Mapping[str, str] | None = None, timeout: float = START_TIMEOUT_S) -> "ConnectServer":
        """Start the server (extra ``env`` for this start only) and wait until it accepts connections."""
        if self.running():
            raise RuntimeError(f"the Connect server on port {self.port} is already running")
        check_java()
        python = os.environ.get("PYSPARK_PYTHON") or sys.executable
        check_worker_python(python)
        child_env = {**os.environ, **local_driver_environment(self.master, python), **(env or {})}
        for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            child_env.pop(var, None)  # this process may be a Connect client itself
        import pyspark

        spark_home = child_env.get("SPARK_HOME") or os.path.dirname(os.path.abspath(pyspark.__file__))
        settings = {
            **driver_conf(self.master, python, {"spark.log.level": "WARN", **self.conf}, spark_home),
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
        }
        cmd = [os.path.join(spark_home, "bin", "spark-submit"), "--master", self.master, "--class", SERVER_CLASS]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd.append("spark-internal")
        if ENV_POINT in child_env:
            # The crash point must kill the server's process group (its pid: start_new_session), not
            # only the group of the Python worker that reaches it (pyspark's daemon has a group of its own).
            child_env.pop(ENV_PGID, None)
            cmd = ["/bin/sh", "-c", f'export {ENV_PGID}=$$; exec "$@"', "sh", *cmd]
        if not self.log_path:
            fd, self.log_path = tempfile.mkstemp(prefix="flinkish-connect-server-", suffix=".log")
            os.close(fd)
            self._own_log = True
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, env=child_env, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=_die_with_parent_hook() if self.tie_to_this_process else None)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                pass
            if self._proc is None or self._proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if self._proc is not None and self._proc.poll() is not None else f"did not answer within {timeout:g}s"
                self.kill()
                raise EnvironmentSetupError(
                    f"the Spark Connect server ({self.master}, port {self.port}) {why}; its log "
                    f"{self.log_path} ends with:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """``kill -9`` of the whole server: its JVM and every Python worker it started."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()

    def wait_exit(self, timeout: float) -> int | None:
        """The server's exit code once it has ended (e.g. killed at a crash point), None on timeout."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM: Spark's shutdown hooks run), ``kill -9`` if it does not end in time."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # also whatever of its process group outlived the JVM
        if self._own_log:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
            self.log_path, self._own_log = "", False


def start_connect_server(master: str = "local[2]", conf: Mapping[str, str] | None = None,
                         tie_to_this_process: bool = False, env: Mapping[str, str] | None = None) -> ConnectServer:
    """Start a Connect server and return it once it accepts connections (``.url``: ``sc://127.0.0.1:PORT``).

    ``tie_to_this_process``: the server dies with this process (SIGKILL from the kernel when the
    starting thread ends; a normal exit stops it first).
    """
    server = ConnectServer(master, dict(conf or {}), tie_to_this_process=tie_to_this_process).start(env)
    if tie_to_this_process:
        atexit.register(server.stop)
    return server


@contextlib.contextmanager
def local_connect_server(master: str = "local[2]", conf: Mapping[str, str] | None = None,
                         env: Mapping[str, str] | None = None) -> Iterator[ConnectServer]:
    """A Connect server for the duration of the block."""
    server = start_connect_server(master, conf, env=env)
    try:
        yield server
    finally:
        server.stop()
