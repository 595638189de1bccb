"""Committer processes of the routed Delta sink (option ``commitProcesses`` = P > 0): an epoch's table commits
spread over P long-lived processes beside the driver's commit worker (issue 26).

* **Who commits what**: a target is always committed by the same process -- crc32 of its path mod P
  (:func:`owner`) -- so each process keeps its tables' caches warm from epoch to epoch (the live state, key
  indexes and deletion vectors of :mod:`~flinkish_spark.connectors.delta.live`, the re-snapshots under way).
  The processes are started at the first commit that needs them and kept for the life of the parent (an
  in-process commit of the same uid, ``commitProcesses`` = 0 in a later query, stops them: their caches
  would miss its versions and re-snapshots).
* **Order, exactly once** (docs/benchmarks.md, "Taking the table commits off the driver"): the sink's commit is
  called after the epoch's decision is recorded; then (1) every process checks its tables -- which already hold
  the epoch (txn of the uid >= epoch) and, for the others, the evolution: a
  :class:`~flinkish_spark.errors.SchemaChangeError` (or any error) of any table ends the epoch before any table
  is written; (2) the first pending table (by name) alone, in its process, then the parent's crash point
  ``sink.between_tables``; (3) the other tables, every process at once (each as
  :meth:`~flinkish_spark.connectors.delta.routed.RoutedDeltaSink._commit_tables` does: on a local disk their
  versions staged behind one sync of the file system). The parent returns only when every table's outcome is in:
  the decision's ``.done`` marker follows every table, and epoch e + 1's commit starts only after e is in every
  table. The epoch's cleanup (files no version names) runs in the same processes, after ``.done``: it reads each
  table's head and live files, which those processes keep warm. Each table's version carries
  ``txn(appId = uid, version = epoch)``: a restart's commit of the decided epoch skips the tables that have it,
  whichever process committed them.
* **A committer that dies** (killed, out of memory) while the parent waits on it: every process of the pool is
  killed and waited for -- nothing of the epoch is still being written once the error is raised -- and
  :class:`CommitterCrashedError` is raised, a :class:`~flinkish_spark.errors.RetryableError`: the epoch stays
  decided and not done, the query fails (Spark does not retry a sink's commit) and its restart recommits the
  epoch with new processes, skipping the tables in. Not retried here: a crash that repeats (memory) would loop
  inside the commit, invisible to the user. An idle committer found dead at an epoch's start is replaced
  silently (nothing of an epoch was in it).
* **Parent death**: a committer exits as soon as its parent is gone -- the EOF of its pipe (its loop's read) and a
  watchdog thread (its parent pid changes: it was adopted). Not ``PR_SET_PDEATHSIG``: it fires when the *thread*
  that started the child ends, and a commit may run in a short-lived thread.
* **Started as new interpreters** (``python -c``, the parent's ``sys.path``, its pipe passed as a file descriptor),
  never with fork -- the parent has threads (delta-rs's runtime, pools) -- nor with multiprocessing's 'spawn', which
  runs the parent's main script again in the child: a ``foreachBatch`` driver script without a ``__main__`` guard
  (its commits run in the script's process) would start a second pipeline there.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from flinkish_spark.errors import ConfigError, RetryableError
from flinkish_spark.options import Options
from flinkish_spark.sink.protocol import CommitOutcome

if TYPE_CHECKING:
    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink, RoutedPart
    from flinkish_spark.connectors.lakehouse.routing import TableEpoch

log = logging.getLogger(__name__)

#: Most committer processes a sink may ask for (option ``commitProcesses``).
MAX_PROCESSES = 64


class CommitterCrashedError(RetryableError):
    """A committer process of the routed Delta sink died during an epoch's commit; the epoch stays decided, a restart
    commits it again."""


@dataclass(frozen=True)
class Checked:
    """A committer's tables of the epoch that do not hold it yet (their evolution computed and kept in the process)."""

    pending: tuple[str, ...]


@dataclass(frozen=True)
class Committed:
    """Each table's outcome, and the files its version named (the cleanup spares them; it runs in the committer,
    which keeps them too -- the parent's copy is the sink's record, as after an in-process commit)."""

    outcomes: dict[str, CommitOutcome]
    committed_here: dict[str, dict[int, frozenset[str]]]


@dataclass(frozen=True)
class Failed:
    error: BaseException
    trace: str


def commit_processes(opts: Options, routed: bool) -> int:
    """Option ``commitProcesses``: 0 (default: the tables' commits in the commit worker's threads) to
    :data:`MAX_PROCESSES`; only for a routing sink (one table is one commit)."""
    raw = opts.get("commitProcesses")
    if raw is None or raw.strip() == "":
        return 0
    if not routed:
        raise ConfigError(f"{opts.component}: option 'commitProcesses' spreads the commits of a routing sink's tables "
                          "('{schema}'/'{table}' in 'path') over processes; one table's sink commits one table. Drop it.")
    number = int(raw.strip()) if raw.strip().isdigit() else -1
    if not 0 <= number <= MAX_PROCESSES:
        raise ConfigError(f"{opts.component}: option 'commitProcesses' must be a whole number from 0 (the tables' commits "
                          f"in the driver's commit process) to {MAX_PROCESSES}, got {raw!r}")
    return number


def owner(path: str, processes: int) -> int:
    """The process that commits the target at ``path``: a stable hash (the same in every process and run)."""
    return zlib.crc32(path.encode()) % processes


# -- the child -------------------------------------------------------------------------------------------------------

def _watch_parent(parent_pid: int) -> None:
    """Exit this process as soon as its parent is gone (even in the middle of a table: a kill -9 the protocol allows).
    A process whose parent died is adopted by another (init or a subreaper): its parent pid changes."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(70)

    threading.Thread(target=watch, name="flinkish-committer-watchdog", daemon=True).start()


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an error the parent could not rebuild: its text still reaches the user
        return RuntimeError(f"{type(exc).__name__}: {exc}")


#: What a committer runs (``python -c``: no main script of the parent's is run again in it).
_ENTRY = "import sys; from flinkish_spark.connectors.delta.committers import main; main(int(sys.argv[1]), int(sys.argv[2]))"


def main(fd: int, parent_pid: int) -> None:
    """A committer process: its pipe is file descriptor ``fd``; the first message is the sink."""
    _watch_parent(parent_pid)
    conn = multiprocessing.connection.Connection(fd)
    try:
        sink = conn.recv()
    except (EOFError, OSError):
        os._exit(0)
    serve(conn, sink)


def serve(conn: Any, sink: RoutedDeltaSink) -> None:
    """The committer's loop: ``("check", epoch, tables)`` -> :class:`Checked`, ``("commit", epoch, names)`` ->
    :class:`Committed`, ``("cleanup", epoch, tables)`` -> an empty :class:`Committed` (or each :class:`Failed`),
    ``None`` -> exit. A cleanup of the epoch last checked names its tables (the check sent them); any other cleanup
    sends them."""
    pending: dict[str, Any] = {}
    checked: dict[str, Any] = {}  # the tables of the last check, by name (the parent names them only for its epoch)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone
        if message is None:
            return
        kind, epoch, payload = message
        reply: Any
        try:
            if kind == "cleanup":
                sink._cleanup_tables([checked[t] if isinstance(t, str) else t for t in payload], epoch)
                reply = Committed({}, {})
            elif kind == "check":
                checked = {t.table: t for t in payload}
                pending = {t.table: p for t in payload if (p := sink._pending(t, epoch)) is not None}
                reply = Checked(tuple(pending))
            else:
                reply = _commit(sink, [pending[name] for name in payload], epoch)
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the parent, which raises it
            reply = Failed(_picklable(exc), traceback.format_exc())
        conn.send(reply)


def _commit(sink: RoutedDeltaSink, items: list[Any], epoch: int) -> Committed:
    outcomes = dict(zip((item[0].table for item in items), sink._commit_tables(items, epoch)))
    here = {n: sink._committed_here[n] for n, o in outcomes.items() if o == "COMMITTED" and n in sink._committed_here}
    return Committed(outcomes, here)


# -- the parent ------------------------------------------------------------------------------------------------------

class Committers:
    """P committer processes of one sink (its uid and options), started lazily, one pipe each."""

    def __init__(self, sink: RoutedDeltaSink, processes: int, digest: str) -> None:
        self.sink, self.processes, self.digest = sink, processes, digest
        self.parent_pid = os.getpid()
        self._procs: list[Any] = [None] * processes
        self._conns: list[Any] = [None] * processes
        self.checked = -1  # the epoch whose tables every process got in a check (a cleanup may name them then)

    def _ready(self, k: int) -> None:
        proc = self._procs[k]
        if proc is not None and proc.poll() is None:
            return
        if proc is not None:  # died while idle (nothing of an epoch was in it): replaced
            self._conns[k].close()
        self.checked = -1
        mine, theirs = multiprocessing.Pipe()  # not inheritable: only the child gets its end (pass_fds)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # what the parent imports from
        proc = subprocess.Popen([sys.executable, "-c", _ENTRY, str(theirs.fileno()), str(os.getpid())],
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
        theirs.close()  # only the child holds its end: its death is this end's EOF
        mine.send(self.sink)
        self._procs[k], self._conns[k] = proc, mine

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    def ask(self, requests: dict[int, Any]) -> dict[int, Any]:
        """Send each process its request, then wait for every answer; a dead process fails the whole call."""
        for k in requests:
            self._ready(k)
        try:
            for k, request in requests.items():
                self._conns[k].send(request)
            answers: dict[int, Any] = {}
            while len(answers) < len(requests):
                waiting = {k: self._conns[k] for k in requests if k not in answers}
                ready = multiprocessing.connection.wait(list(waiting.values()))
                for k, conn in waiting.items():
                    if conn in ready:
                        answers[k] = conn.recv()  # EOFError: the child died (only it held the other end)
            return answers
        except (EOFError, OSError) as exc:
            dead = [p.pid for p in self._procs if p is not None and p.poll() is not None]
            self.close(kill=True)
            raise CommitterCrashedError(
                f"{type(self.sink).__name__} uid {self.sink.uid!r}: committer process {dead or '?'} died during the "
                f"commit of an epoch (killed, or out of memory); every committer is stopped. The epoch's decision is "
                f"recorded and not done: a restart commits it again, skipping the tables that have it.") from exc

    def close(self, kill: bool = False) -> None:
        for k, proc in enumerate(self._procs):
            if proc is None:
                continue
            if kill:
                proc.kill()
            else:
                try:
                    self._conns[k].send(None)
                except OSError:
                    proc.kill()
            try:
                proc.wait(timeout=None if kill else 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._conns[k].close()
        self._procs = [None] * self.processes
        self._conns = [None] * self.processes
        self.checked = -1


_POOLS: dict[str, Committers] = {}  # sink uid -> its committers in this process
_POOLS_LOCK = threading.Lock()


def pool_for(sink: RoutedDeltaSink) -> Committers:
    """The sink's committers: the same processes for every epoch of the same sink (uid and options) -- Spark
    unpickles the sink anew for each commit, in the same long-lived Python process."""
    sent = copy.copy(sink)
    sent._committed_here = {}
    sent.commit_processes = 0  # a committer commits in process
    digest = hashlib.sha256(pickle.dumps(sent)).hexdigest()
    with _POOLS_LOCK:
        pool = _POOLS.get(sink.uid)
        if pool is not None and (pool.digest != digest or pool.parent_pid != os.getpid()):
            if pool.parent_pid == os.getpid():  # other options: this uid's older committers go
                pool.close()
            pool = None
        if pool is None:
            pool = _POOLS[sink.uid] = Committers(sent, sink.commit_processes, digest)
        return pool


@atexit.register
def _close_all() -> None:
    """At the parent's exit: each committer ends after its current request (it would, on its pipe's EOF, anyway)."""
    for uid in list(_POOLS):
        close_pool(uid)


def close_pool(uid: str) -> None:
    """Stop the committers of ``uid`` in this process, if any (the sink commits in process now)."""
    if _POOLS:
        with _POOLS_LOCK:
            pool = _POOLS.pop(uid, None)
        if pool is not None and pool.parent_pid == os.getpid():
            pool.close()


def commit_tables(sink: RoutedDeltaSink, tables: list[TableEpoch[RoutedPart]], epoch: int,
                  between_tables: Callable[[], None]) -> CommitOutcome:
    """The decided epoch's tables committed by the sink's committer processes (order: the module docstring)."""
    pool = pool_for(sink)
    by_process: dict[int, list[TableEpoch[RoutedPart]]] = {}
    for t in tables:
        by_process.setdefault(owner(sink.route.target(t.table), pool.processes), []).append(t)
    pool.checked = -1  # until every process has answered this check
    checked = _answers(pool, {k: ("check", epoch, ts) for k, ts in by_process.items()})
    pool.checked = epoch
    pending = {name for c in checked.values() for name in c.pending}
    order = [(t.table, k) for k, ts in by_process.items() for t in ts if t.table in pending]
    if not order:
        return "COMMITTED"
    order.sort()  # the first table by name, as in process
    first, k0 = order[0]
    outcome = _collect(sink, _answers(pool, {k0: ("commit", epoch, [first])}))
    if outcome != "COMMITTED" or len(order) == 1:
        return outcome
    between_tables()  # the first table has the epoch, the others not yet
    rest: dict[int, list[str]] = {}
    for name, k in order[1:]:
        rest.setdefault(k, []).append(name)
    return _collect(sink, _answers(pool, {k: ("commit", epoch, names) for k, names in rest.items()}))


def cleanup_tables(sink: RoutedDeltaSink, tables: list[TableEpoch[RoutedPart]], epoch: int) -> None:
    """The done epoch's cleanup (:meth:`~flinkish_spark.connectors.delta.live.LiveTarget.cleanup_epoch` per table) in
    the processes that commit the tables: it reads each table's head and live files, which the parent does not keep."""
    pool = pool_for(sink)
    by_process: dict[int, list[TableEpoch[RoutedPart]]] = {}
    for t in tables:
        by_process.setdefault(owner(sink.route.target(t.table), pool.processes), []).append(t)
    for k in by_process:
        pool._ready(k)  # a process started now (its predecessor died idle) knows no check's tables
    # The epoch this pool last checked: each process has its tables from the check -- their names will do.
    sent: dict[int, list[Any]] = {k: [t.table for t in ts] if pool.checked == epoch else list(ts) for k, ts in by_process.items()}
    _answers(pool, {k: ("cleanup", epoch, ts) for k, ts in sent.items()})


def _answers(pool: Committers, requests: dict[int, Any]) -> dict[int, Any]:
    answers = pool.ask(requests)
    failed = [a for a in answers.values() if isinstance(a, Failed)]
    if failed:
        log.info("the routed Delta sink's committer process failed:\n%s", failed[0].trace)  # where, in the child
        raise failed[0].error
    return answers


def _collect(sink: RoutedDeltaSink, answers: dict[int, Any]) -> CommitOutcome:
    outcomes: list[CommitOutcome] = []
    for a in answers.values():
        sink._committed_here.update(a.committed_here)
        outcomes += a.outcomes.values()
    return next((o for o in outcomes if o != "COMMITTED"), "COMMITTED")
