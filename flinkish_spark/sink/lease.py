"""Leases that fence a second live run of the same query (one lease per source or sink uid).

A lease is a small JSON object ``{"run_id", "renewed_ms", "host", "pid", "gaps_ms",
"superseded", ...}`` stored next to the uid's metadata. The run that holds it renews it
(sources from a heartbeat thread in Spark's long-lived driver worker, sinks before each
batch and at each commit, from short-lived workers). A new run that finds a lease of
another run watches it: if it is renewed in that time, its holder is alive and the new
run fails with :class:`~flinkish_spark.errors.FencedError`; if not, the holder is dead
(killed, crashed) and the new run takes the lease over.

* **The holder's own pace.** Each renewal records the gap since the previous one (the
  last few, ``gaps_ms``). A sink renews once per batch, so a run with batches longer than
  ``timeout`` is not dead: the watch lasts ``max(timeout, 1.5 x its longest recent gap)``
  (at most :data:`MAX_PATIENCE_TIMEOUTS` timeouts), and only a lease older than twice that
  is taken over at once.
* **A run that lost its lease never takes it back.** The taker records whom it took the
  lease from (``superseded``); a run that finds its own id there fails with FencedError at
  its next renewal, even from a fresh Lease object (a sink's next commit worker), so two
  live runs cannot take turns.
* **A dead holder on this host is seen at once** when its record carries the pid of a
  process that lives at least as long as the run (``live``: a source's heartbeat process,
  a sink's driver JVM, the Python driver of ``foreachBatch``): gone means dead.

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
GAPS_KEPT = 8  # renewals a holder's pace is judged by (a sink renews ~3 times per batch)
SUPERSEDED_KEPT = 16
PACE_FACTOR = 1.5
# A holder renewing slower than this many timeouts is taken for dead after the watch: its
# run, if alive after all, fails at its next renewal (safe). Bounds the wait of a restart.
MAX_PATIENCE_TIMEOUTS = 12


def _pid_namespace() -> str | None:
    """This process's PID namespace (Linux), so pids are only compared where they mean the same."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


@dataclass(frozen=True)
class DriverJvm:
    """The JVM above this Python worker: Spark's driver when the worker runs on the driver."""

    pid: int
    started: int  # clock ticks after boot (/proc/<pid>/stat field 22): tells a reused pid apart

    @property
    def run_id(self) -> str:
        return f"driver-{socket.gethostname()}-{self.pid}-{self.started}"


def driver_jvm() -> DriverJvm | None:
    """The JVM this Python worker hangs from (via Spark's worker daemon), None if not found (not Linux).

    A sink's lease is renewed from short-lived Python workers, made afresh for every batch on
    the planning side: their pids and their DataSource objects mean nothing. Spark runs one
    run of a query (one checkpointLocation) per JVM at a time, so the driver JVM *is* the run
    for the lease, and it lives at least as long as the run.
    """
    pid = os.getppid()
    for _ in range(4):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        if comm == "java":
            return DriverJvm(pid, int(fields[19]))
        pid = int(fields[1])
        if pid <= 1:
            return None
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
    live: bool = False  # ``pid`` lives exactly as long as the run could
    gaps_ms: tuple[int, ...] = ()  # the holder's recent gaps between renewals
    superseded: tuple[str, ...] = ()  # runs this lease was taken from

    def patience_s(self, timeout_s: float) -> float:
        """How long a holder may go without renewing and still be alive: its own pace, bounded."""
        pace = PACE_FACTOR * max(self.gaps_ms, default=0) / 1000
        return max(timeout_s, min(pace, MAX_PATIENCE_TIMEOUTS * timeout_s))

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
                 pid_is_liveness: bool = False, live_pid: int | None = None) -> None:
        """``pid_is_liveness``: the holding process lives exactly as long as the run (a source's
        heartbeat process), so a holder on this host whose process is gone is dead at once.
        ``live_pid``: such a process other than this one (a sink's driver JVM)."""
        self.pid_is_liveness = pid_is_liveness or live_pid is not None
        self.live_pid = live_pid
        self.io = io
        self.path = path
        self.run_id = run_id
        self.what = what
        self.timeout_s = timeout_s
        self.held = False
        self._written_at = float("-inf")
        self.lost_to: LeaseRecord | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def read(self) -> LeaseRecord | None:
        try:
            d = json.loads(self.io.read_bytes(self.path))
            pidns = d.get("pidns")
            return LeaseRecord(str(d["run_id"]), int(d["renewed_ms"]), str(d.get("host", "?")), int(d.get("pid", 0)),
                               str(pidns) if pidns else None, bool(d.get("live", False)),
                               tuple(int(g) for g in d.get("gaps_ms", ()))[-GAPS_KEPT:],
                               tuple(str(r) for r in d.get("superseded", ()))[-SUPERSEDED_KEPT:])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # a damaged lease protects nothing; it is rewritten

    def _write(self, previous: LeaseRecord | None) -> None:
        now = int(time.time() * 1000)
        gaps: tuple[int, ...] = ()
        superseded: tuple[str, ...] = ()
        if previous is not None and previous.run_id == self.run_id:
            gaps, superseded = (*previous.gaps_ms, max(0, now - previous.renewed_ms))[-GAPS_KEPT:], previous.superseded
        elif previous is not None:
            superseded = (*previous.superseded, previous.run_id)[-SUPERSEDED_KEPT:]
        record = {"run_id": self.run_id, "renewed_ms": now, "host": socket.gethostname(),
                  "pid": self.live_pid or os.getpid(), "pidns": _pid_namespace(), "live": self.pid_is_liveness,
                  "gaps_ms": list(gaps), "superseded": list(superseded)}
        self.io.write_bytes(self.path, json.dumps(record).encode())
        self._written_at = time.monotonic()

    def _fence(self, holder: LeaseRecord, taken_from_us: bool = False) -> FencedError:
        if taken_from_us:
            return FencedError(
                f"{self.what} is in use by another live run of this query ({holder.describe()}), which took the "
                "lease over while this run did not renew it (a batch far longer than the ones before, or no batch "
                "for a long time). This run stops here; the other one goes on."
            )
        return FencedError(
            f"{self.what} is in use by another live run of this query ({holder.describe()}). "
            "Stop that run first; a run that died releases the lease after "
            f"{holder.patience_s(self.timeout_s):.3g}s (option 'leaseTimeout', or 1.5 times its usual gap between batches)."
        )

    def acquire(self) -> None:
        """Take the lease, watching a holder for its patience to tell a dead one from a live one."""
        current = self.read()
        if current is not None and current.run_id == self.run_id:
            # Ours already (a sink renews from a fresh writer each commit): just renew.
            self._write(current)
            self.held = True
            return
        if current is not None and self.run_id in current.superseded:
            # Another run took this run's lease over: this run is the one to stop.
            self.lost_to = current
            raise self._fence(current, taken_from_us=True)
        if current is not None:  # another run's
            age_s = time.time() - current.renewed_ms / 1000
            patience = current.patience_s(self.timeout_s)
            # A holder that missed two patiences of renewals is dead, and so is one whose process
            # on this host is gone (a restart after kill -9 need not wait). Otherwise do not trust
            # clocks across hosts: watch for one patience whether it is renewed.
            gone = (self.pid_is_liveness or current.live) and current.holder_is_gone()
            if age_s < 2 * patience and not gone:
                deadline = time.monotonic() + patience + 0.5
                while time.monotonic() < deadline:
                    time.sleep(self.timeout_s / (2 * HEARTBEATS_PER_TIMEOUT))
                    seen = self.read()
                    if seen is None:
                        break
                    if seen != current:
                        raise self._fence(seen)
        self._write(current)
        # Two runs that took over a dead lease at once: the later write wins, the other backs off.
        time.sleep(0.05)
        now = self.read()
        if now is not None and now.run_id != self.run_id:
            raise self._fence(now)
        self.held = True

    def renew(self, unless_renewed_within_s: float = 0.0) -> None:
        """Renew a held lease, or acquire it; raise FencedError if another run took it.

        ``unless_renewed_within_s``: a lease this object renewed that recently is left as it
        is (no other run can have taken it over since: a taker waits at least a timeout)."""
        if self.held and time.monotonic() - self._written_at < unless_renewed_within_s:
            return
        if not self.held:
            self.acquire()
            return
        current = self.read()
        if current is not None and current.run_id != self.run_id:
            self.held = False
            self.lost_to = current
            raise self._fence(current)
        self._write(current)

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
