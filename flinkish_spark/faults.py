"""Crash and failure injection at named protocol points.

A production facility: every protocol step of the sources and sinks calls it, and it
does nothing unless armed through the environment, which crash tests, the demo and the
benchmarks do to really kill the driver (or fail a task) at exactly that step.

Set ``FLINKISH_CRASH_AT=<point>[:<n>]`` in the environment of a process that
starts a Spark driver (the JVM and its Python workers inherit it), plus
``FLINKISH_CRASH_DIR`` (a directory for hit counters) and, to kill the whole
driver -- Python driver, JVM and workers -- ``FLINKISH_CRASH_PGID`` (the
process group the driver runs in; start it with ``start_new_session=True``).
The ``n``-th time (default 1) execution reaches ``<point>``, in whichever
process, the process group receives SIGKILL: the same as ``kill -9`` of the
driver at exactly that point. Without the variables a crash point costs one
dictionary lookup.

Points (see docs/guarantees.md):

* ``source.before_metadata_write`` / ``source.after_metadata_write`` -- in
  ``latestOffset``, around writing the checkpoint file, i.e. before Spark's offset log;
* ``source.partitions`` -- planning a batch, after Spark wrote its offset log;
* ``source.read`` -- on an executor, after the first batch of a split was produced (mid-batch);
* ``sink.after_prepare`` -- on an executor, a sink task's prepare is done (its files written), the
  epoch's other tasks' prepares not necessarily (with the mirror's ``parallelism``: between two tasks' prepares);
* ``sink.before_decision`` / ``sink.after_decision`` / ``sink.before_done`` -- the driver's commit
  (:mod:`flinkish_spark.sink.committer`); ``sink.mid_commit`` -- inside a sink's commit, some output
  visible; ``sink.after_commit`` -- committed, Spark's commit log not yet written;
  ``sink.between_tables`` -- a routing sink's commit (docs/mirror.md), after the first table
  has the epoch and before the next one; ``iceberg.routed.after_schema`` -- the routed Iceberg sink
  created a target or updated its schema, the epoch's data snapshot not yet written;
  ``mirror.before_status_record`` -- the ``flinkish mirror`` pipeline process, after committed epochs
  were folded into its counts and before the record is written (:mod:`flinkish_spark.mirror.counts`).
"""

from __future__ import annotations

import os
import signal

ENV_POINT = "FLINKISH_CRASH_AT"
ENV_DIR = "FLINKISH_CRASH_DIR"
ENV_PGID = "FLINKISH_CRASH_PGID"


def _armed(env: str, name: str) -> str | None:
    """The argument after ``<name>:`` in ``$env`` when the variable names this point, else None."""
    spec = os.environ.get(env)
    if not spec:
        return None
    point, _, arg = spec.partition(":")
    return arg if point == name else None


def crash_point(name: str) -> None:
    nth = _armed(ENV_POINT, name)
    if nth is None:
        return
    point = name
    wanted = int(nth) if nth else 1
    counter_dir = os.environ.get(ENV_DIR)
    if counter_dir:
        # One byte appended per hit: O_APPEND writes are atomic, so the file size
        # counts hits across every process (driver worker, executors).
        counter = os.path.join(counter_dir, f"{point}.hits")
        fd = os.open(counter, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
        hits = os.path.getsize(counter)
    else:
        hits = wanted
    if hits != wanted:
        return
    pgid = os.environ.get(ENV_PGID)
    if pgid:
        try:
            os.killpg(int(pgid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(137)


def arm_for_process_group() -> None:
    """Let a crash point kill the whole driver -- this process, the JVM and its Python workers (its
    process group) -- as ``kill -9`` of the driver would. Call it before Spark starts, so that the JVM and
    its workers inherit the variable. Inert without ``FLINKISH_CRASH_AT``."""
    os.environ[ENV_PGID] = str(os.getpgrp())


ENV_FAIL = "FLINKISH_FAIL_AT"


class InjectedFailure(RuntimeError):
    """An exception raised on purpose by :func:`fail_point` (a task failure, not a kill)."""


def fail_point(name: str, attempt: int = 0) -> None:
    """Raise :class:`InjectedFailure` at ``name`` when ``FLINKISH_FAIL_AT`` asks for it.

    ``FLINKISH_FAIL_AT=<point>:first`` fails only the first attempt of a Spark task
    (Spark retries it when ``spark.task.maxFailures`` > 1, e.g. master ``local[2,4]``);
    ``<point>:always`` fails every attempt (the job, and the query, fail).
    """
    mode = _armed(ENV_FAIL, name)
    if mode is None:
        return
    if mode == "always" or (mode in ("", "first") and attempt == 0):
        raise InjectedFailure(f"injected failure at {name} (attempt {attempt})")
