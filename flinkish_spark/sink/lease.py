"""Leases that fence a second live run of the same query (one lease per source or sink uid).

A lease is a small JSON object ``{"run_id", "renewed_ms", "host", "pid"}`` stored next
to the uid's metadata. The run that holds it renews it (sources from a heartbeat
thread in Spark's long-lived driver worker, sinks on every commit). A new run that
finds a lease of another run watches it for up to ``timeout`` seconds: if it is
renewed in that time, its holder is alive and the new run fails with
:class:`~flinkish_spark.errors.FencedError`; if not, the holder is dead (killed,
crashed) and the new run takes the lease over. A run that finds its lease taken
over fails at its next step instead of writing.

The lease gives the clear error; safety does not depend on it: checkpoint ids and
sink decisions are written with put-if-absent, so two runs can never both record
the same epoch.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

from flinkish_spark.errors import FencedError
from flinkish_spark.io.fileio import FileIO

DEFAULT_TIMEOUT_S = 5.0
HEARTBEATS_PER_TIMEOUT = 5


def _pid_namespace() -> str | None:
    """This process's PID namespace (Linux), so pids are only compared where they mean the same."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


@dataclass(frozen=True)
class LeaseRecord:
    run_id: str
    renewed_ms: int
    host: str
    pid: int
    pidns: str | None = None

    def holder_is_gone(self) -> bool:
        """The holder ran on this host, in this PID namespace, and its process no longer exists."""
        if self.pid <= 0 or self.host != socket.gethostname():
            return False
        ns = _pid_namespace()
        return ns is not None and self.pidns == ns and not _process_exists(self.pid)

    def describe(self) -> str:
        age = max(0.0, time.time() - self.renewed_ms / 1000)
        return f"run {self.run_id} on host {self.host} pid {self.pid}, renewed {age:.1f}s ago"


class Lease:
    def __init__(self, io: FileIO, path: str, run_id: str, what: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 pid_is_liveness: bool = False) -> None:
        """``pid_is_liveness``: the holding process lives exactly as long as the run (a source's
        heartbeat process), so a holder on this host whose process is gone is dead at once."""
        self.pid_is_liveness = pid_is_liveness
        self.io = io
        self.path = path
        self.run_id = run_id
        self.what = what
        self.timeout_s = timeout_s
        self.held = False
        self.lost_to: LeaseRecord | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def read(self) -> LeaseRecord | None:
        try:
            d = json.loads(self.io.read_bytes(self.path))
            pidns = d.get("pidns")
            return LeaseRecord(str(d["run_id"]), int(d["renewed_ms"]), str(d.get("host", "?")), int(d.get("pid", 0)),
                               str(pidns) if pidns else None)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # a damaged lease protects nothing; it is rewritten

    def _write(self) -> None:
        record = {"run_id": self.run_id, "renewed_ms": int(time.time() * 1000), "host": socket.gethostname(),
                  "pid": os.getpid(), "pidns": _pid_namespace()}
        self.io.write_bytes(self.path, json.dumps(record).encode())

    def _fence(self, holder: LeaseRecord) -> FencedError:
        return FencedError(
            f"{self.what} is in use by another live run of this query ({holder.describe()}). "
            "Stop that run first; a run that died releases the lease after "
            f"{self.timeout_s:g}s (option 'leaseTimeout')."
        )

    def acquire(self) -> None:
        """Take the lease, waiting up to ``timeout`` to tell a dead holder from a live one."""
        current = self.read()
        if current is not None and current.run_id == self.run_id:
            # Ours already (a sink renews from a fresh writer each commit): just renew.
            self._write()
            self.held = True
            return
        if current is not None:  # another run's
            age_s = time.time() - current.renewed_ms / 1000
            # A holder that missed two timeouts of heartbeats is dead, and so is one whose process
            # on this host is gone (a restart after kill -9 need not wait). Otherwise do not trust
            # clocks across hosts: watch for one timeout whether it is renewed.
            gone = self.pid_is_liveness and current.holder_is_gone()
            if age_s < 2 * self.timeout_s and not gone:
                deadline = time.monotonic() + self.timeout_s + 0.5
                while time.monotonic() < deadline:
                    time.sleep(self.timeout_s / (2 * HEARTBEATS_PER_TIMEOUT))
                    seen = self.read()
                    if seen is None:
                        break
                    if seen != current:
                        raise self._fence(seen)
        self._write()
        # Two runs that took over a dead lease at once: the later write wins, the other backs off.
        time.sleep(0.05)
        now = self.read()
        if now is not None and now.run_id != self.run_id:
            raise self._fence(now)
        self.held = True

    def renew(self) -> None:
        """Renew a held lease, or acquire it; raise FencedError if another run took it."""
        if not self.held:
            self.acquire()
            return
        current = self.read()
        if current is not None and current.run_id != self.run_id:
            self.held = False
            self.lost_to = current
            raise self._fence(current)
        self._write()

    def check(self) -> None:
        if self.lost_to is not None:
            raise self._fence(self.lost_to)

    def start_heartbeat(self) -> None:
        """Renew ``HEARTBEATS_PER_TIMEOUT`` times per timeout from a daemon thread (long-lived processes)."""
        if self._thread is not None:
            return

        def beat() -> None:
            while not self._stop.wait(self.timeout_s / HEARTBEATS_PER_TIMEOUT):
                try:
                    self.renew()
                except FencedError:
                    return
                except Exception:  # noqa: BLE001 - a failed renewal is retried next beat
                    continue

        self._thread = threading.Thread(target=beat, name=f"flinkish-lease-{self.what}", daemon=True)
        self._thread.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
