"""Benchmark-only timers for the mirror path, loaded by every Python process (driver and Spark's Python
workers) whose ``PYTHONPATH`` holds this folder -- and active only when ``FLINKISH_BENCH_TIMERS`` names a
file. Each wrapped call appends one JSON line (pid, name, start, seconds) to that file. Production code is
not changed: the functions are wrapped here, at interpreter start, by name.

Wrapped (generators: the time spent inside ``next()``, i.e. the producer's own time, not the consumer's):

* ``TablesReaderCore.read`` -- the Python worker's read of the epoch's change split (peek + decode + Arrow);
* ``peek`` (as ``tables_reader`` calls it) -- the server decode and fetch of the range's messages;
* ``routing.task_tables`` -- the sink task's split of the rows per table (+ figures), its input included: the
  batches are handed on as they come (``sink.input_wait`` ends when the last came: waiting for the JVM and the
  source's worker behind it, and for a one-table task the decode of each batch on arrival);
* ``RoutedDeltaSink.prepare`` -- the sink task's whole write (split, key lookup, Parquet files);
* ``RoutedDeltaSink.commit`` -- the driver's commit of every changed table's Delta version;
* ``Committers.ask`` (``commitProcesses``): each round of the committer processes by kind (``committers.check``,
  ``.commit_first`` -- the table committed alone --, ``.commit``, ``.cleanup``), the parent's wall time;
* ``SplitStreamReader.latestOffset`` and ``.partitions`` (the driver's source process: the range bounded; with
  ``spreadChanges`` the range read and cut by table);
* ``TwoPhaseCommitStreamWriter.write`` (the sink task) and ``.commit`` (Spark's call on the driver), and
  ``commit_epoch`` in it (the decision record, the sink's commit, the ``.done`` marker).
"""

from __future__ import annotations

import os
from typing import Any

_OUT = os.environ.get("FLINKISH_BENCH_TIMERS")
#: timer names whose calls are also profiled (cProfile, one ``<timers file>.<name>.<pid>.<start>.prof`` each)
_PROFILED = set(filter(None, os.environ.get("FLINKISH_BENCH_PROFILE", "").split(",")))


def _install(out: str) -> None:
    import functools
    import inspect
    import json
    import time

    def record(name: str, t0: float, dt: float) -> None:
        # start and end: wall clock (for the epoch's timeline); s: the time spent in the call (a generator's own)
        with open(out, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "name": name, "start": t0, "end": time.time(), "s": dt}) + "\n")

    def timed(name: str, fn):
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*a, **k):
                t0, spent = time.time(), 0.0
                it = fn(*a, **k)
                try:
                    while True:
                        t = time.perf_counter()
                        try:
                            item = next(it)
                        except StopIteration:
                            spent += time.perf_counter() - t
                            return
                        spent += time.perf_counter() - t
                        yield item
                finally:
                    record(name, t0, spent)
            return gen

        @functools.wraps(fn)
        def call(*a, **k):
            t0, t = time.time(), time.perf_counter()
            prof = None
            if name in _PROFILED:
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            try:
                return fn(*a, **k)
            finally:
                record(name, t0, time.perf_counter() - t)
                if prof is not None:
                    prof.disable()
                    prof.dump_stats(f"{out}.{name}.{os.getpid()}.{t0:.3f}.prof")
        return call

    from flinkish_spark.connectors.delta import routed
    from flinkish_spark.connectors.lakehouse import routing
    from flinkish_spark.connectors.postgres.source import tables_reader

    from flinkish_spark.connectors.cdc.tables_reader import TablesReaderCore

    TablesReaderCore.read = timed("source.read", TablesReaderCore.read)  # type: ignore[method-assign]
    if hasattr(tables_reader, "peek"):  # before the range was read in pieces (changes.peek_pieces)
        tables_reader.peek = timed("source.peek", tables_reader.peek)
    else:
        tables_reader.peek_pieces = timed("source.peek", tables_reader.peek_pieces)
    split = timed("sink.task_tables", routing.task_tables)

    def task_tables(batches):
        # Pulling the input waits for the JVM (and the source's worker behind it). The batches are handed on as they
        # come (task_tables decodes them as they arrive, in bounded groups): sink.input_wait ends when the last one
        # came, sink.task_tables spans the whole call (the input included); what it takes after the input is the
        # difference of their ends.
        t0, t = time.time(), time.perf_counter()

        def feed() -> Any:
            first = True
            for b in batches:
                if first:
                    record("sink.first_batch_wait", t0, time.perf_counter() - t)
                    first = False
                yield b
            record("sink.input_wait", t0, time.perf_counter() - t)

        return split(feed())

    routed.task_tables = task_tables
    routed.RoutedDeltaSink.prepare = timed("sink.prepare", routed.RoutedDeltaSink.prepare)  # type: ignore[method-assign]
    routed.RoutedDeltaSink.commit = timed("sink.commit", routed.RoutedDeltaSink.commit)  # type: ignore[method-assign]
    from flinkish_spark.source.adapter import SplitStreamReader

    # the driver's planning of an epoch: latestOffset (bounding the range) and partitions (with spreadChanges: the read)
    SplitStreamReader.latestOffset = timed("driver.latest_offset", SplitStreamReader.latestOffset)  # type: ignore[method-assign]
    SplitStreamReader.partitions = timed("driver.partitions", SplitStreamReader.partitions)  # type: ignore[method-assign]
    from flinkish_spark.connectors.delta import committers

    ask = committers.Committers.ask

    def timed_ask(self: Any, requests: dict) -> Any:
        # one round of the committer processes, by its kind: check, commit (commit_first: the one table committed
        # alone before the others), cleanup -- the parent's wall time, sending (pickling) included
        kinds = {r[0] for r in requests.values()}
        kind = kinds.pop() if len(kinds) == 1 else "mixed"
        if kind == "commit" and sum(len(r[2]) for r in requests.values()) == 1:
            kind = "commit_first"
        t0, t = time.time(), time.perf_counter()
        try:
            return ask(self, requests)
        finally:
            record(f"committers.{kind}", t0, time.perf_counter() - t)

    committers.Committers.ask = timed_ask  # type: ignore[method-assign]
    from flinkish_spark.sink import datasource

    datasource.TwoPhaseCommitStreamWriter.write = timed(  # type: ignore[method-assign]
        "sink.write", datasource.TwoPhaseCommitStreamWriter.write)
    datasource.TwoPhaseCommitStreamWriter.commit = timed(  # type: ignore[method-assign]
        "driver.writer_commit", datasource.TwoPhaseCommitStreamWriter.commit)
    datasource.commit_epoch = timed("driver.commit_epoch", datasource.commit_epoch)


if _OUT:
    try:
        _install(_OUT)
    except Exception as e:  # a benchmark aid: never stop a process
        import sys

        print(f"benchmarks/timers: not installed: {e!r}", file=sys.stderr)
