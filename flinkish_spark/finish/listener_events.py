"""Progress events for the finish controller, built from one JSON string per event.

PySpark hands a Python ``StreamingQueryListener`` each progress event as a
``StreamingQueryProgress`` copied from the JVM object field by field (``fromJObject``).
Copying its Java maps (``durationMs``, ``eventTime``, each source's ``metrics``) ends every
iteration with a Java ``NoSuchElementException``, and PySpark's exception conversion then asks
py4j about ~14 exception classes -- each lookup a ``Class.forName`` miss that scans every jar on
the driver's classpath. Profiled with JFR on a short pipeline of the test suite, that was 17 % of
the driver JVM's CPU samples, all on Spark's listener thread, which also delays the
controller's reaction to a query's final epoch.

:func:`java_listener` registers the same listener with events built from ``progress.json()``
(one py4j call) by ``StreamingQueryProgress.fromJson`` -- the way PySpark itself builds
``query.lastProgress`` and Spark Connect's listener events.

Guarantee: the listener receives the same events with the same fields, with two differences of
representation (tests/finish/test_listener_events.py): the rates (``inputRowsPerSecond``,
``processedRowsPerSecond``) are rounded to one decimal as Spark's JSON has them, and an absent
source offset is ``"null"`` rather than ``"None"``; nothing in flinkish reads either.

Measured (``benchmarks/listener_cost.py``, 60 progress events, alternating, 3 runs each): the
driver JVM spent 23.1 / 25.0 / 25.9 s of CPU with PySpark's copy, 15.5 / 18.3 / 18.9 s with this.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent, StreamingQueryProgress


class JsonProgressEvents(JStreamingQueryListener):
    """PySpark's py4j callback object for ``listener``, with progress events read from JSON."""

    def onQueryProgress(self, jevent: Any) -> None:
        progress = StreamingQueryProgress.fromJson(json.loads(jevent.progress().json()))
        self.pylistener.onQueryProgress(QueryProgressEvent(progress))


def java_listener(listener: StreamingQueryListener) -> Any:
    """The JVM listener object PySpark's ``streams.addListener`` registers for ``listener``."""
    from pyspark import SparkContext

    jvm: Any = SparkContext._jvm
    return jvm.PythonStreamingQueryListenerWrapper(JsonProgressEvents(listener))
