"""A MariaDB server for the tests and the benchmarks, from the distribution's ``mariadb-server``.

No wheel ships MariaDB, so this module starts the one installed on the machine (Debian 12:
MariaDB 10.11, ``apt-get install mariadb-server mariadb-client``; ``.ci/run`` and ``./dev test``
install it when ``mariadbd`` is missing). :func:`start_mariadb` initialises a data folder with
``mariadb-install-db --no-defaults`` (the machine's ``/etc/mysql`` never applies) and starts
``mariadbd`` with what the flinkish MySQL connectors need:

* the row-based binary log with full row images and full row metadata (column names, signedness,
  character sets in every table map event): ``--log-bin --binlog-format=ROW
  --binlog-row-image=FULL --binlog-row-metadata=FULL --server-id=1``;
* a TCP listener on 127.0.0.1 only (a free port unless given) and a Unix socket in the folder;
* ``root`` with password authentication and an empty password (``mysql://root@127.0.0.1:PORT/``);
* ``utf8mb4`` as the server's character set, as Debian's ``/etc/mysql`` sets it.

As root, ``mariadbd`` refuses to start unless told ``--user=root``: the server then runs as
root (its files live in a temporary folder of root's), which is what a throwaway test server
needs and no production setting.

Usage::

    with temporary_mariadb() as db:       # a fresh folder, removed on exit
        db.url                            # mysql://root@127.0.0.1:PORT/
        db.sql("CREATE DATABASE shop")    # the server's own client over its socket
        db.restart()                      # clean shutdown, start again on the same port

Nothing here is needed to use the connectors: they work against any reachable server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from flinkish_spark.errors import EnvironmentSetupError

#: What the binary log of a CDC source must look like (issue 29): checked by the connector too.
BINLOG_ARGS: tuple[str, ...] = (
    "--binlog-format=ROW",
    "--binlog-row-image=FULL",
    "--binlog-row-metadata=FULL",
    "--server-id=1",
)
INSTALL_HINT = "apt-get install mariadb-server mariadb-client"
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_program(name: str) -> str | None:
    """``name`` on PATH or in the sbin folders (``mariadbd`` is in /usr/sbin, often not on a user's PATH)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def installed() -> bool:
    """Whether this machine has the server and its tools (what :func:`start_mariadb` needs)."""
    return all(find_program(p) for p in ("mariadbd", "mariadb-install-db", "mariadb"))


def _program(name: str) -> str:
    path = find_program(name)
    if path is None:
        raise EnvironmentSetupError(f"MariaDB's {name} is not installed ({INSTALL_HINT})")
    return path


@dataclass
class EmbeddedMariaDB:
    """A running server: where it is and how to query, restart or stop it."""

    home: Path  # data/, the socket, the server's log
    port: int
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def socket_path(self) -> Path:
        return self.home / "mariadb.sock"

    @property
    def log_path(self) -> Path:
        return self.home / "mariadbd.log"

    @property
    def tmp_dir(self) -> Path:
        return self.home / "tmp"

    @property
    def url(self) -> str:
        """``mysql://root@127.0.0.1:PORT/``: TCP, user root, empty password, no default database."""
        return self.url_for("")

    def url_for(self, database: str, user: str = "root") -> str:
        return f"mysql://{user}@127.0.0.1:{self.port}/{database}"

    @property
    def jdbc_url(self) -> str:
        """For Spark's JDBC reader with Debian's ``libmariadb-java`` (/usr/share/java/mariadb-java-client.jar)."""
        return f"jdbc:mariadb://127.0.0.1:{self.port}/?user=root"

    def sql(self, statements: str, database: str = "") -> str:
        """Run ``statements`` with the ``mariadb`` client over the socket; return its tab-separated output
        (no column names). Raises RuntimeError with the client's message when a statement fails."""
        args = [_program("mariadb"), "--no-defaults", "-uroot", f"--socket={self.socket_path}", "-N", "-B"]
        if database:
            args.append(database)
        # Binary columns print as raw bytes: replaced, not a decode error (the output is for reading).
        out = subprocess.run(args, input=statements, capture_output=True, encoding="utf-8", errors="replace",
                             check=False)
        if out.returncode != 0:
            raise RuntimeError(f"mariadb failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def start(self) -> None:
        """Start ``mariadbd`` on this folder and wait until it accepts connections."""
        self.tmp_dir.mkdir(exist_ok=True)
        args = [
            _program("mariadbd"), "--no-defaults",
            f"--datadir={self.data_dir}", f"--socket={self.socket_path}", f"--pid-file={self.home / 'mariadbd.pid'}",
            f"--port={self.port}", "--bind-address=127.0.0.1", "--skip-name-resolve",
            f"--log-bin={self.data_dir / 'binlog'}", *BINLOG_ARGS,
            # What Debian's /etc/mysql sets (skipped by --no-defaults): utf8mb4, not the compiled-in latin1.
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            # Small throwaway servers: less memory than the 128 MB default.
            "--innodb-buffer-pool-size=64M",
            # A temporary folder of its own: servers of parallel test workers in one shared /tmp clashed on
            # the names of their temporary tables while initialising (mariadb-install-db failed once).
            f"--tmpdir={self.tmp_dir}",
            *self.extra_args,
        ]
        if os.geteuid() == 0:
            args.append("--user=root")  # mariadbd refuses root otherwise
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=self.home)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EnvironmentSetupError(
                    f"mariadbd exited ({self.process.returncode}) before it accepted connections: {self._log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                if self.socket_path.exists():
                    return
            time.sleep(0.05)
        self.stop()
        raise EnvironmentSetupError(f"mariadbd did not accept connections within {START_TIMEOUT_S:.0f} s: "
                                    f"{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace").strip()[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Clean shutdown (SIGTERM); kill -9 after a minute. The data folder is kept."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def crash(self) -> None:
        """``kill -9`` of ``mariadbd`` (no shutdown: InnoDB and the binary log recover at the next :meth:`start`,
        on the same folder and port). The data folder is kept."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def start_mariadb(home: str | os.PathLike[str], port: int | None = None,
                  extra_args: Sequence[str] = ()) -> EmbeddedMariaDB:
    """Initialise (on first use) and start a server whose folder is ``home``, on ``port`` (default: free).

    ``extra_args``: more ``mariadbd`` options, e.g. ``("--binlog-format=STATEMENT",)`` to test a
    connector's refusal (a later option wins over :data:`BINLOG_ARGS`)."""
    server = EmbeddedMariaDB(Path(home).expanduser().resolve(), port or free_port(), tuple(extra_args))
    server.home.mkdir(parents=True, exist_ok=True)
    if not (server.data_dir / "mysql").is_dir():
        server.tmp_dir.mkdir(exist_ok=True)
        args = [_program("mariadb-install-db"), "--no-defaults", f"--datadir={server.data_dir}",
                f"--tmpdir={server.tmp_dir}", "--auth-root-authentication-method=normal", "--skip-test-db"]
        if os.geteuid() == 0:
            args.append("--user=root")
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, text=True, check=False, cwd=server.home)
            if proc.returncode != 0:
                out.seek(0)
                raise EnvironmentSetupError(f"mariadb-install-db failed ({proc.returncode}): {out.read()[-2000:]}")
    server.start()
    return server


@contextlib.contextmanager
def temporary_mariadb(prefix: str = "flinkish-mariadb-", port: int | None = None,
                      extra_args: Sequence[str] = ()) -> Iterator[EmbeddedMariaDB]:
    """A server in a fresh temporary folder, stopped and removed on exit (tests, benchmarks)."""
    home = tempfile.mkdtemp(prefix=prefix)
    try:
        server = start_mariadb(home, port=port, extra_args=extra_args)
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)
