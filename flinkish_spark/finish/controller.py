"""The finish controller: ends queries whose inputs have ended, and stops them gracefully.

Spark ends a query by itself only under ``Trigger.AvailableNow``/``Once``; under
processing-time triggers nothing ends a query whose inputs are exhausted, and
``query.stop()`` interrupts whatever batch is running. This module supplies the
missing part of FLIP-147 from the driver's Python process, where the
``StreamingQuery`` handle lives:

* a ``StreamingQueryListener`` (installed by :func:`flinkish_spark.register`) reads
  each batch's progress. The end offsets of flinkish sources carry their status
  and stop state (see :mod:`flinkish_spark.source.offset`). Progress is posted
  after Spark wrote the batch to its commit log, so when every source of the
  query is FINISHED (or has stopped for a live stop request) in a progress event,
  that batch -- the final epoch -- is committed by the sink;
* it then delivers the final "checkpoint complete" notification to every source
  (which Spark never sends for the last batch), waits until the query is between
  triggers, and calls ``query.stop()``: the query ends at an epoch boundary,
  without waiting for the next trigger, whatever the trigger interval;
* when the end-of-input watermark marker was emitted and the query has stateful
  operators, it waits for the one more batch that Spark runs to fire the windows.

Queries with a source that is not a flinkish source are never ended by it (such a
source may be unbounded). Under AvailableNow, Spark ends the query itself.

Under Spark Connect the listener runs in the client, fed with the server's events over
gRPC; everything above works the same from there (the final notification runs on the
server, see :mod:`flinkish_spark.finish.notify`). Spark may drop a client listener's events
(after one failed send), so :func:`await_finished` also polls the query itself and never
waits for an event.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql.streaming import StreamingQueryListener

from flinkish_spark.connect_client import server_calls, server_lost
from flinkish_spark.errors import ConfigError
from flinkish_spark.finish.listener_events import java_listener
from flinkish_spark.finish.notify import metadata_io, notify_all
from flinkish_spark.finish.stop_request import lease_run_id, mark_done, read_request, release_lease, request_stop
from flinkish_spark.finish.watermark import MARKER_THRESHOLD
from flinkish_spark.session import is_connect
from flinkish_spark.source.offset import SourceOffset

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

QueryEnd = Literal["finished", "drained", "stopped", "terminated", "failed", "timeout"]
"""How a query ended: ``finished`` (all inputs ended, final epoch committed), ``drained``
(stop with drain), ``stopped`` (stop without drain: resumable), ``terminated`` (ended
otherwise, e.g. AvailableNow with unbounded inputs, or ``query.stop()``), ``failed``,
``timeout`` (still running when the wait timed out)."""

_POLL_S = 0.01


@dataclass(frozen=True)
class Verdict:
    end: QueryEnd
    offsets: tuple[SourceOffset, ...]
    request_id: str | None = None


def flinkish_offsets(progress: Any) -> tuple[SourceOffset, ...] | None:
    """The end offsets of a progress event if every source of the query is a flinkish one."""
    sources = getattr(progress, "sources", None) or []
    offs = tuple(SourceOffset.from_json(s.endOffset) for s in sources)
    if not offs or any(o is None or o.root is None for o in offs):
        return None
    return offs  # type: ignore[return-value]


def _watermark_flushed(progress: Any) -> bool:
    raw = (getattr(progress, "eventTime", None) or {}).get("watermark")
    if not raw:
        return False
    try:
        wm = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return False
    if wm.tzinfo is None:
        wm = wm.replace(tzinfo=timezone.utc)
    return wm >= MARKER_THRESHOLD


def verdict(progress: Any) -> Verdict | None:
    """Whether the batch of ``progress`` is the last one the query needs, and why."""
    offs = flinkish_offsets(progress)
    if offs is None:
        return None
    live_stops = {o.stop for o in offs if o.stop and not o.finished}
    if not all(o.finished and o.eoi != "pending" or (o.stop and not o.finished) for o in offs):
        return None
    if any(o.eoi == "emitted" for o in offs) and getattr(progress, "stateOperators", None):
        # The marker moved the watermark at the end of the marker's batch; Spark fires the
        # windows in the batch after it. Wait for that one.
        if not _watermark_flushed(progress):
            return None
    if live_stops:
        request_id = sorted(live_stops)[0]
        # Stop markers of a killed earlier run may come back in a replayed batch: only a
        # request meant for the live run of every source counts.
        for o in offs:
            if not o.finished and not _request_is_live(o, request_id):
                return None
        return Verdict("stopped", offs, request_id)
    # A drain marker stays in the offsets of a FINISHED source for good; a restart of a
    # drained query simply finds it finished.
    drained = sorted({o.stop for o in offs if o.stop and _request_is_live(o, o.stop)})
    if drained:
        return Verdict("drained", offs, drained[0])
    return Verdict("finished", offs)


def _request_is_live(off: SourceOffset, request_id: str) -> bool:
    assert off.root is not None
    try:
        io = metadata_io(off)
        req = read_request(io, off.root, off.uid)
        return req is not None and req.id == request_id and req.state == "requested" and req.run_id == lease_run_id(io, off.root, off.uid)
    except Exception as exc:  # noqa: BLE001 - unreadable: not a stop we can vouch for; never stop on a guess
        log.warning("flinkish: cannot read the stop request of source uid %r: %s", off.uid, exc)
        return False


def _lease_holder(off: SourceOffset) -> str | None:
    """The run holding source ``off.uid``'s lease; None when there is none or it cannot be read
    (a client without access to the metadata root ends the query all the same)."""
    assert off.root is not None
    try:
        return lease_run_id(metadata_io(off), off.root, off.uid)
    except Exception as exc:  # noqa: BLE001
        log.warning("flinkish: cannot read the lease of source uid %r: %s", off.uid, exc)
        return None


def _trigger_name(query: "StreamingQuery") -> str:
    try:
        # Scala case objects (AvailableNowTrigger, OneTimeTrigger) have a trailing '$'.
        return str(query._jsq.streamingQuery().trigger().getClass().getSimpleName()).rstrip("$")
    except Exception:  # noqa: BLE001 - a Spark Connect or future handle: assume a timed trigger
        return ""


class FinishController(StreamingQueryListener):
    """One per SparkSession; see the module docstring."""

    _ATTR = "_flinkish_finish_controller"

    def __init__(self, spark: "SparkSession") -> None:
        self._spark = spark
        self._lock = threading.Lock()
        self._finishing: dict[str, threading.Thread] = {}
        self.ended: dict[str, QueryEnd] = {}
        self.finished_at: dict[str, float] = {}
        self._terminated: set[str] = set()
        self._seen_live: set[str] = set()  # runs this listener got events of: their end event will come
        self._terminated_cv = threading.Condition()

    @property
    def _jlistener(self) -> Any:
        """What PySpark's ``streams.addListener`` registers: events built from JSON (see
        :mod:`flinkish_spark.finish.listener_events`), not copied field by field."""
        jlistener = getattr(self, "_flinkish_jlistener", None)
        if jlistener is None:
            jlistener = self._flinkish_jlistener = java_listener(self)
        return jlistener

    @classmethod
    def install(cls, spark: "SparkSession") -> "FinishController":
        existing = getattr(spark, cls._ATTR, None)
        if isinstance(existing, FinishController):
            return existing
        controller = cls(spark)
        if is_connect(spark):
            # The Connect client receives listener events in a thread that it starts when the
            # first listener is added; a thread inherits "daemon" from the one that starts it.
            # Started from a non-daemon thread, it would keep the client process alive after
            # the script's end (forever: it waits on the server's event stream).
            adder = threading.Thread(target=spark.streams.addListener, args=(controller,), daemon=True,
                                     name="flinkish-add-listener")
            adder.start()
            adder.join()
        else:
            spark.streams.addListener(controller)
        setattr(spark, cls._ATTR, controller)
        return controller

    # -- listener callbacks (Spark's listener bus thread: never block it) -----------------

    def onQueryStarted(self, event: Any) -> None:
        self._seen_live.add(str(event.runId))

    def onQueryProgress(self, event: Any) -> None:
        self._seen_live.add(str(event.progress.runId))
        try:
            self.consider(event.progress)
        except Exception:  # noqa: BLE001 - a listener must never throw into Spark
            log.exception("flinkish: finish controller failed on a progress event")

    def onQueryIdle(self, event: Any) -> None:
        # A restarted query whose sources were already finished runs no batch; its idle
        # event is the first chance to end it.
        self._seen_live.add(str(event.runId))
        try:
            query = self._spark.streams.get(str(event.id))
            if query is not None:
                self.consider(query.lastProgress)
        except Exception:  # noqa: BLE001 - a listener must never throw into Spark
            log.exception("flinkish: finish controller failed on an idle event")

    def onQueryTerminated(self, event: Any) -> None:
        with self._terminated_cv:
            self._terminated.add(str(event.runId))
            self._terminated_cv.notify_all()

    def wait_terminated_event(self, run_id: str, timeout: float = 10.0) -> bool:
        """Wait until Spark delivered ``run_id``'s termination event to this listener.

        Spark posts listener events asynchronously. A script that exits right after the
        query ended would leave events in flight to a Python process that is gone, and
        Spark logs each one as an error with a stack trace: waiting here keeps the end quiet.
        """
        with self._terminated_cv:
            return self._terminated_cv.wait_for(lambda: run_id in self._terminated, timeout)

    # -- the decision -----------------------------------------------------------------------

    def consider(self, progress: Any) -> None:
        if progress is None:
            return
        # A query keeps its id across restarts; each run has its own runId.
        qid, run = str(progress.id), str(progress.runId)
        with self._lock:
            if run in self._finishing:
                return
        v = verdict(progress)
        if v is None:
            return
        with self._lock:
            if run in self._finishing:
                return
            thread = threading.Thread(target=self._finish, args=(qid, run, v), name=f"flinkish-finish-{run[:8]}", daemon=True)
            self.finished_at[run] = time.time()
            # Registered only once started, under the lock: a waiter that finds it can join it.
            thread.start()
            self._finishing[run] = thread

    def _finish(self, qid: str, run: str, v: Verdict) -> None:
        query = self._spark.streams.get(qid)
        notify_all(self._spark, v.offsets)
        if query is None or str(query.runId) != run:
            return
        leases = {off: _lease_holder(off) for off in v.offsets if off.root}
        self.ended[run] = v.end
        if _trigger_name(query) not in ("AvailableNowTrigger", "OneTimeTrigger"):
            # Between triggers there is no batch to interrupt; a trigger that starts now finds
            # every source finished or stopped and constructs no batch.
            while query.isActive and query.status.get("isTriggerActive"):
                time.sleep(_POLL_S)
            query.stop()
            # The run is over: free the sources' leases so that a restart need not wait for
            # them to expire (only leases still held by this run, never a newer one's).
            for off, holder in leases.items():
                if holder is not None and off.root is not None:
                    try:
                        release_lease(metadata_io(off), off.root, off.uid, holder)
                    except Exception as exc:  # noqa: BLE001 - a lease left behind only delays a restart
                        log.warning("flinkish: could not release the lease of source uid %r: %s", off.uid, exc)
        else:
            query.awaitTermination()
        if v.request_id:
            for off in v.offsets:
                try:
                    assert off.root is not None
                    mark_done(metadata_io(off), off.root, off.uid, v.request_id, v.end)
                except Exception as exc:  # noqa: BLE001
                    log.warning("flinkish: could not mark stop request %s done: %s", v.request_id, exc)

    def wait(self, query: "StreamingQuery", timeout: float | None, progress: bool = False) -> QueryEnd:
        qid = str(query.runId)
        deadline = None if timeout is None else time.time() + timeout
        bar = _ProgressBar() if progress else None
        try:
            while query.isActive:
                # Belt and braces: also look at the last progress ourselves, in case the
                # listener was installed after the final batch.
                self.consider(query.lastProgress)
                if bar is not None:
                    bar.update(query.lastProgress)
                if deadline is not None and time.time() >= deadline:
                    return "timeout"
                try:
                    query.awaitTermination(1)
                except Exception as exc:  # noqa: BLE001 - the query failed: reported below as "failed"
                    if server_lost(exc) is not None:
                        raise  # no query to report on: server_calls names the server
                    break
            # The final batch's event may still be on its way to the listener (or being decided
            # in its thread right now): decide here too, so that the final notification is
            # delivered before this returns.
            self.consider(query.lastProgress)
            with self._lock:
                thread = self._finishing.get(qid)
            if thread is not None:
                thread.join()
            # Only a Classic driver logs errors for events in flight to a Python process that is
            # gone. A Connect client need not wait: and Spark may never send it the event (a
            # client listener's events are dropped after one failed send), so it must not.
            if not query.isActive and qid in self._seen_live and not is_connect(self._spark):
                self.wait_terminated_event(qid)
            if bar is not None:
                bar.update(query.lastProgress)
        finally:
            if bar is not None:
                bar.close()
        if query.exception() is not None:
            return "failed"
        if qid in self.ended:
            return self.ended[qid]
        offs = flinkish_offsets(query.lastProgress)
        if offs is not None and all(o.finished for o in offs):
            return "finished"
        return "terminated"


def _session(query: "StreamingQuery") -> "SparkSession":
    """The session ``query`` runs in: a Connect query knows its own (a process may hold a Classic
    session and Connect sessions side by side); a Classic one runs in the active session."""
    own = getattr(query, "_session", None)
    if own is not None:
        return own
    from pyspark.sql import SparkSession

    return SparkSession.active()


class _ProgressBar:
    """Finished splits / rows of a query's bounded inputs, read from their checkpoints."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("splits"),
            TextColumn("{task.fields[rows]} rows"), TimeElapsedColumn(),
        )
        self._task = self._progress.add_task("finishing", total=None, rows=0)
        self._progress.start()
        self._last: tuple[tuple[str, int], ...] = ()

    def update(self, progress: Any) -> None:
        offs = flinkish_offsets(progress)
        if not offs:
            return
        key = tuple((o.uid, o.ckpt) for o in offs)
        if key == self._last:
            return
        self._last = key
        done = total = rows = 0
        from flinkish_spark.checkpoint.store import SourceCheckpointStore

        for off in offs:
            if off.ckpt < 0 or off.root is None:
                continue
            try:
                ckpt = SourceCheckpointStore(metadata_io(off), off.root, off.uid, kind="").read(off.ckpt)
            except Exception:  # noqa: BLE001 - progress display is best effort
                continue
            done += sum(1 for s in ckpt.splits if s.finished)
            total += len(ckpt.splits)
            rows += sum(s.position for s in ckpt.splits)
        self._progress.update(self._task, completed=done, total=total or None, rows=rows)

    def close(self) -> None:
        self._progress.stop()


def await_finished(query: "StreamingQuery", timeout: float | None = None, progress: bool = False,
                   server_timeout: float | None = None) -> QueryEnd:
    """Wait until ``query`` ends and return how it ended (see :data:`QueryEnd`).

    With every source bounded, the query ends by itself once the epoch that read the
    last rows is committed (also under processing-time triggers); ``progress=True``
    shows finished splits and rows while waiting.

    Under Spark Connect, a server that stops answering makes it raise
    :class:`~flinkish_spark.errors.ConnectServerUnavailableError` (naming the server) within about
    ``server_timeout`` seconds (default: the session's bound, else 60; it stays on the session, see
    :mod:`flinkish_spark.connect_client`); the same script run again continues exactly once.
    """
    spark = _session(query)
    with server_calls(spark, server_timeout):
        return FinishController.install(spark).wait(query, timeout, progress)


def stop(query: "StreamingQuery", drain: bool = False, timeout: float | None = None,
         server_timeout: float | None = None) -> QueryEnd:
    """Stop ``query`` at an epoch boundary (Flink's stop-with-savepoint), and wait for it.

    ``drain=False``: no new epoch starts, everything started is committed, sources are
    not finished; a restart continues exactly where it stopped. ``drain=True``: every
    source ends its input now (it is FINISHED from then on), the end-of-input watermark
    flush runs, the final epoch commits and the query ends; a restart adds nothing.
    ``server_timeout``: as for :func:`await_finished`.
    """
    spark = _session(query)
    with server_calls(spark, server_timeout):
        return _stop(query, FinishController.install(spark), drain, timeout)


def _stop(query: "StreamingQuery", controller: FinishController, drain: bool, timeout: float | None) -> QueryEnd:
    deadline = None if timeout is None else time.time() + timeout
    while query.isActive and query.lastProgress is None:
        # Before the first batch there is no offset that tells where the sources are.
        if deadline is not None and time.time() >= deadline:
            return "timeout"
        query.awaitTermination(1)
    if not query.isActive:
        return controller.wait(query, 0)
    offs = flinkish_offsets(query.lastProgress)
    if offs is None:
        raise ConfigError(
            "flinkish_spark.stop needs every source of the query to be a flinkish source (an "
            "other source cannot be stopped at an epoch boundary); use query.stop() instead"
        )
    request_id = uuid.uuid4().hex[:12]
    for off in offs:
        if not off.finished:
            assert off.root is not None
            request_stop(metadata_io(off), off.root, off.uid, drain, request_id)
    remaining = None if deadline is None else max(0.0, deadline - time.time())
    return controller.wait(query, remaining)
