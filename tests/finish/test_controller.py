"""The finish controller's own threads: a waiter and the listener deciding at the same time."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import flinkish_spark.finish.controller as controller
from flinkish_spark.finish.controller import FinishController, Verdict


_Thread = threading.Thread


class _SlowStart(_Thread):
    """A thread whose start() is slow to begin: what a busy machine does to any thread."""

    entered = threading.Event()

    def start(self) -> None:
        _SlowStart.entered.set()
        time.sleep(0.3)
        super().start()


def test_await_finished_racing_the_listeners_decision_joins_the_final_notification(monkeypatch) -> None:
    # Found by benchmarks/sink_end_to_end.py through Spark Connect: await_finished raised
    # "RuntimeError: cannot join thread before it is started" when the listener's thread had
    # registered its finishing thread but not yet started it.
    notified: list[Any] = []
    monkeypatch.setattr(controller, "verdict", lambda progress: Verdict("finished", ()))
    monkeypatch.setattr(controller, "notify_all", lambda spark, offsets: (time.sleep(0.2), notified.append(offsets)))
    monkeypatch.setattr(controller.threading, "Thread", _SlowStart)  # the threads the controller starts
    spark = SimpleNamespace(streams=SimpleNamespace(get=lambda qid: None))
    ctl = FinishController(spark)  # type: ignore[arg-type]
    progress = SimpleNamespace(id="q", runId="r", sources=[])
    query = SimpleNamespace(runId="r", isActive=False, lastProgress=progress, exception=lambda: None)

    event_thread = _Thread(target=ctl.consider, args=(progress,))  # Spark's listener bus delivering the event
    event_thread.start()
    assert _SlowStart.entered.wait(5)
    ctl.wait(query, timeout=10)  # type: ignore[arg-type]
    assert notified == [()]  # the final notification was delivered before await_finished returned
    event_thread.join()
