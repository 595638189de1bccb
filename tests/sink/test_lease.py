"""Leases: a live run fences a second one; a dead run's lease is taken over (at once when its process is gone)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from flinkish_spark.errors import FencedError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.lease import Lease, _pid_namespace

TIMEOUT = 0.6


def lease(tmp_path: Path, run_id: str, pid_is_liveness: bool = False) -> Lease:
    return Lease(FileIO.for_url(str(tmp_path)), str(tmp_path / "_lease.json"), run_id, "source uid 'u'", TIMEOUT,
                 pid_is_liveness=pid_is_liveness)


def write_holder(tmp_path: Path, pid: int, host: str | None = None) -> None:
    record = {"run_id": "old", "renewed_ms": int(time.time() * 1000), "host": host or socket.gethostname(),
              "pid": pid, "pidns": _pid_namespace()}
    (tmp_path / "_lease.json").write_text(json.dumps(record))


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_live_holder_fences_a_second_run(tmp_path: Path) -> None:
    first = lease(tmp_path, "first")
    first.acquire()
    first.start_heartbeat()
    try:
        with pytest.raises(FencedError, match=r"source uid 'u' is in use by another live run of this query \(run first"):
            lease(tmp_path, "second", pid_is_liveness=True).acquire()
        first.check()  # the first run keeps its lease
        assert json.loads((tmp_path / "_lease.json").read_text())["run_id"] == "first"
    finally:
        first.stop_heartbeat()


def test_a_holder_that_stopped_renewing_is_taken_over_after_the_timeout(tmp_path: Path) -> None:
    write_holder(tmp_path, pid=1, host="another-host")
    started = time.monotonic()
    second = lease(tmp_path, "second", pid_is_liveness=True)
    second.acquire()
    assert second.held and time.monotonic() - started >= TIMEOUT
    assert json.loads((tmp_path / "_lease.json").read_text())["run_id"] == "second"


def test_a_holder_whose_process_is_gone_is_taken_over_at_once(tmp_path: Path) -> None:
    write_holder(tmp_path, pid=dead_pid())  # this host, this pid namespace, freshly renewed
    started = time.monotonic()
    second = lease(tmp_path, "second", pid_is_liveness=True)
    second.acquire()
    assert second.held and time.monotonic() - started < TIMEOUT / 2


@pytest.mark.parametrize("pid_is_liveness, pid", [(False, "dead"), (True, "alive")])
def test_a_process_check_is_only_trusted_where_it_means_something(tmp_path: Path, pid_is_liveness: bool, pid: str) -> None:
    # A sink's lease is written by a commit worker that may come and go: its pid says nothing.
    # A live process is never taken for a dead one.
    write_holder(tmp_path, pid=dead_pid() if pid == "dead" else os.getpid())
    started = time.monotonic()
    lease(tmp_path, "second", pid_is_liveness=pid_is_liveness).acquire()
    assert time.monotonic() - started >= TIMEOUT


# -- sink leases: renewed per commit from a fresh Lease object (a new Python worker each time) ----------


def renew_as(tmp_path: Path, run_id: str) -> None:
    """One renewal the way a sink commit makes it: a new Lease object, nothing kept in memory."""
    lease(tmp_path, run_id).renew()


def test_a_run_whose_lease_was_taken_over_is_fenced_at_its_next_commit(tmp_path: Path) -> None:
    renew_as(tmp_path, "first")
    time.sleep(2 * TIMEOUT + 0.1)  # a long batch: the first run looks dead
    renew_as(tmp_path, "second")  # the second takes the lease over
    with pytest.raises(FencedError, match=r"is in use by another live run of this query \(run second"):
        renew_as(tmp_path, "first")  # the first must not take it back: it lost it
    assert json.loads((tmp_path / "_lease.json").read_text())["run_id"] == "second"


def test_a_holder_that_renews_at_its_own_slow_pace_is_alive(tmp_path: Path) -> None:
    """A sink renews once per batch: batches of 3 leaseTimeouts are its pace, not its death."""
    pace = 3 * TIMEOUT
    for _ in range(3):
        renew_as(tmp_path, "first")
        time.sleep(pace)
    stop = threading.Event()

    def keep_committing() -> None:
        while not stop.wait(pace):
            renew_as(tmp_path, "first")

    thread = threading.Thread(target=keep_committing, daemon=True)
    renew_as(tmp_path, "first")
    thread.start()
    try:
        time.sleep(2.2 * TIMEOUT)  # the second run comes when the lease is older than two timeouts
        with pytest.raises(FencedError, match=r"is in use by another live run of this query \(run first"):
            renew_as(tmp_path, "second")
    finally:
        stop.set()
        thread.join()
    assert json.loads((tmp_path / "_lease.json").read_text())["run_id"] == "first"
