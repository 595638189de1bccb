"""Running ``flinkish mirror``: the streaming query, and stopping it with drain on Ctrl-C / SIGTERM.

Two processes:

* the **command** (:func:`supervise`, the ``flinkish`` process in the terminal) first runs the
  preflight (:mod:`flinkish_spark.mirror.preflight`: every problem in one line each, exit 2, nothing
  created), then starts the **pipeline process** (``python -m flinkish_spark.mirror.pipeline``) in a session of its own and
  forwards signals to it. Why: Ctrl-C in a terminal sends SIGINT to the whole foreground process
  group, and Spark's Python workers (forked by the JVM) turn SIGINT into ``KeyboardInterrupt``,
  failing the running tasks -- the batch would fail instead of draining. In its own session only
  the pipeline process gets the signal, from the command -- also while it starts: the command starts it with
  SIGINT/SIGTERM blocked, and it unblocks them once its handler is in place. The configuration travels on stdin
  (JSON without passwords); the passwords in environment variables named by the connectors'
  ``passwordEnv`` (never on a command line, which ``ps`` shows).
* the **pipeline process** (:func:`run`) starts a Spark session -- the driver of ``--master`` (default
  ``local[2]``), or a client of the Spark Connect server of ``--remote``, which then runs the query
  (:mod:`flinkish_spark.mirror.cluster`: what runs where; a server that stops answering ends the mirror
  with exit 75 within ``--server-timeout``) -- reads ``flinkish.postgres``
  with ``tables`` and writes the routing sink -- the options a Python user passes
  (:meth:`~flinkish_spark.mirror.config.MirrorConfig.source_options`) -- and shows the progress.
  Spark's output goes to the log file (:mod:`flinkish_spark.mirror.log`); a failure ends with its
  cause on the last line (:mod:`flinkish_spark.mirror.failure`), after dropping the slot and
  publication this run created when nothing references them yet (:mod:`flinkish_spark.mirror.leftovers`).

Stopping: the first SIGTERM/SIGINT calls ``flinkish_spark.stop(query, drain=True)``: the
source ends its input at the current WAL position (during the snapshot: after the remaining
chunks), the final epoch commits, the slot and publication are dropped, and the process exits 0.
A drained mirror is finished for good (as a Flink job stopped with ``--drain``): the same command
again reports that and ends. A second signal exits at once (``query.stop()``: the running batch
is abandoned, nothing of it is visible; exit 130); the next start of the same command recovers
exactly once -- and completes the drain if its final epoch was already planned. A stop *without*
drain that keeps the mirror resumable is ``flinkish stop CHECKPOINT`` from another shell (exit 0),
or killing the process. A pipeline process killed by a signal (``kill -9``, a crash point, the
out-of-memory killer) makes the command exit 128 + the signal (137) with a line saying that the same
command continues from the checkpoint. With ``--stop-after-snapshot`` the source reads the snapshot only
(``startup=snapshot``) and the query ends by itself once its last epoch is committed (exit 0).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any

from flinkish_spark.mirror.cluster import EXIT_RETRY, lost_server, lost_server_line, quiet, shown
from flinkish_spark.mirror.config import SINK_PASSWORD_ENV, SOURCE_PASSWORD_ENV, SOURCE_READY, MirrorConfig
from flinkish_spark.mirror.progress import OBSERVED

#: Exit codes: 0 drained, finished or stopped on request (all committed), 1 failed, 2 refused before the start,
#: 130 stopped at once; 75 (cluster.EXIT_RETRY) the Spark Connect server of --remote stopped answering;
#: 128 + N when the pipeline process was killed by signal N (137: SIGKILL -- kill -9, a crash, out of memory).
EXIT_OK, EXIT_FAILED, EXIT_STOPPED = 0, 1, 130
#: Refused before anything started: a flag, the pipeline file or the preflight (as every ConfigError of the CLI).
EXIT_REFUSED = 2
#: Ctrl-C and a supervisor's stop: the first asks for a drain, the second exits at once.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def preflight(config: MirrorConfig) -> list[str]:
    """Every problem found before Spark starts, one line each (:mod:`flinkish_spark.mirror.preflight`): a wrong
    password, a missing privilege, an unwritable target ... in a second, with nothing created. Its warnings (a table
    left out for want of a key) are printed here: they do not stop the mirror."""
    from flinkish_spark.mirror.preflight import problems

    warnings: list[str] = []
    found = problems(config, warnings)
    for line in warnings:
        print(f"flinkish mirror: warning: {' '.join(line.split())}", flush=True)
    return found


def supervise(config: MirrorConfig) -> int:
    """Run the pipeline process and forward Ctrl-C / SIGTERM to it; its exit code (2: refused by the preflight)."""
    from flinkish_spark.mirror.finished import ended_before

    ended = ended_before(config)  # a drained mirror: say so from its metadata, without starting Spark
    if ended is not None:
        print(f"flinkish mirror: {ended}", flush=True)
        return EXIT_OK
    found = preflight(config)
    if found:
        print(f"flinkish mirror: not started, nothing was created; {len(found)} problem{'s' * (len(found) > 1)} to fix "
              "first:", file=sys.stderr, flush=True)
        for line in found:
            print(f"flinkish mirror: {' '.join(line.split())}", file=sys.stderr, flush=True)  # one line each
        return EXIT_REFUSED
    if not SOURCE_READY[config.source_kind]:
        print(f"flinkish mirror: not started, nothing was created: the preflight found no problem, but this version "
              f"has no {config.source_format} Spark source yet (issue 29: it is being wired on the CDC core shared "
              f"with PostgreSQL; docs/mysql-source.md says what works today)", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    env = {**os.environ, **config.password_env()}
    signals = 0

    def forward(signum: int, frame: Any) -> None:
        nonlocal signals
        signals += 1
        try:
            if signals <= 2:
                os.kill(child.pid, signal.SIGTERM)  # 1: drain, 2: exit at once
            else:
                os.killpg(child.pid, signal.SIGKILL)  # 3: the pipeline does not end: kill it (a restart recovers)
        except ProcessLookupError:
            pass

    # A Ctrl-C / SIGTERM while the pipeline starts is held, not lost nor fatal: blocked here until `forward` is in
    # place, and in the pipeline (which inherits the mask) until its own handler is (_Signals unblocks them).
    # Otherwise it killed a pipeline still importing (exit 143, "the driver was killed") or this process.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        child = subprocess.Popen([sys.executable, "-m", "flinkish_spark.mirror.pipeline"], stdin=subprocess.PIPE,
                                 env=env, start_new_session=True)
        previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        assert child.stdin is not None
        try:
            child.stdin.write(config.to_json().encode())
            child.stdin.close()
        except BrokenPipeError:  # it died before reading its configuration: its exit says how
            pass
        while True:
            try:
                rc = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return _read_hint(config, rc) if rc >= 0 else _killed(child.pid, -rc, by_us=signals > 2)


def _read_hint(config: MirrorConfig, rc: int) -> int:
    """After a run that ended well: how to read the tables (:mod:`flinkish_spark.mirror.reading`); ``rc``."""
    if rc == EXIT_OK:
        from flinkish_spark.mirror.reading import read_hint

        try:
            print(read_hint(config), flush=True)
        except Exception:  # noqa: BLE001 - a hint never changes how the command ends
            pass
    return rc


def _killed(pgid: int, signum: int, by_us: bool) -> int:
    """The pipeline process ended by signal ``signum``: end what is left of its process group (the JVM and
    Python workers of a driver whose Python process alone was killed would hold the replication slot), say so,
    and return the shell's exit code for it (128 + signal: 137 for SIGKILL)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    what = ("the pipeline did not end after the third signal and was killed" if by_us else
            f"the pipeline's driver was killed ({name}: kill -9, a crash, or the out-of-memory killer)")
    print(f"flinkish mirror: {what}; nothing committed is lost (the running epoch is not visible); run the "
          "same command again: it continues from the checkpoint (the last committed epoch), exactly once",
          file=sys.stderr, flush=True)
    return 128 + signum


def _observe(df: Any) -> Any:
    """The stream with Spark observed metrics per batch, for the progress view: rows, snapshot rows, newest change's
    commit time. Rows are data rows (snapshot rows, inserts, updates, deletes), not the stream's internal rows (a
    table's schema row ``s``, re-snapshot markers), which no target holds. Per-table counts are the sink's
    (:mod:`flinkish_spark.mirror.counts`): recorded with each epoch's commit, where a kill cannot lose them."""
    from pyspark.sql import functions as F

    op = F.col("_op")
    if "batch" in df.columns:  # packed rows (rowFormat=arrow): each carries its counts
        return df.observe(
            OBSERVED,
            F.coalesce(F.sum("_count"), F.lit(0)).cast("long").alias("rows"),
            F.coalesce(F.sum(F.when(F.col("_lsn").isNull(), F.col("_count"))), F.lit(0)).cast("long").alias("snapshot_rows"),
            F.coalesce(F.sum("_changes"), F.lit(0)).cast("long").alias("changes"),
            F.max(F.unix_micros(F.col("_commit_ts"))).alias("last_commit_us"),
        )
    return df.observe(
        OBSERVED,
        F.count_if(op.isin("r", "c", "u", "d")).alias("rows"),
        F.count_if(op == "r").alias("snapshot_rows"),
        F.count_if(op.isin("c", "u", "d", "t")).alias("changes"),
        F.max(F.when(op.isin("c", "u", "d", "t"), F.unix_micros(F.col("_commit_ts")))).alias("last_commit_us"),
    )


def start_query(spark: Any, config: MirrorConfig) -> Any:
    """The mirror's streaming query, started: ``flinkish.postgres`` / ``flinkish.mysql`` (``tables``) -> spread over ``parallelism``
    tasks by table (:mod:`flinkish_spark.mirror.spread`) -> the routing sink."""
    from flinkish_spark.mirror.spread import spread_tables
    from flinkish_spark.sink.spark_checkpoint import restore_spark_checkpoint

    reader = spark.readStream.format(config.source_format)
    for key, value in config.source_options().items():
        reader = reader.option(key, value)
    # the per-table work of an epoch in `parallelism` tasks, not in the one that reads the slot: spread by the
    # source itself where it can (spreadChanges), else by a shuffle
    shuffle = 1 if config.spread_in_source() else config.parallelism
    writer = spread_tables(_observe(reader.load()), shuffle).writeStream.format(config.sink_format)
    for key, value in config.sink_options().items():
        writer = writer.option(key, value)
    writer = writer.option("checkpointLocation", config.spark_checkpoint)
    # A new machine (empty local folder) continues from the copy the sink keeps with the metadata. Under --remote
    # the folder is the Connect server's, which this process may not see: restored there.
    if config.remote is None:
        restore_spark_checkpoint(config.spark_checkpoint, config.checkpoint, config.sink_uid, config.sink_options())
    else:
        from flinkish_spark.sink.spark_checkpoint_restore import restore_on_server

        restore_on_server(spark, config.spark_checkpoint, config.checkpoint, config.sink_uid, config.sink_options())
    return writer.trigger(processingTime=f"{config.trigger_s:g} seconds").queryName(config.uid).start()


class _Signals:
    """SIGTERM/SIGINT counted; the main loop acts on them (a handler must not call into Spark)."""

    def __init__(self) -> None:
        self.count = 0
        for s in STOP_SIGNALS:
            signal.signal(s, self._on)
        # supervise() started this process with them blocked: one sent meanwhile is delivered now, to _on
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def _on(self, signum: int, frame: Any) -> None:
        self.count += 1


def run(config: MirrorConfig) -> int:
    """Run the mirror in this process until it is drained, finished, stopped or failed; the exit code."""
    from flinkish_spark.mirror.log import to_log_file
    from flinkish_spark.mirror.progress import Progress

    signals = _Signals()
    parent = os.getppid()
    terminal = to_log_file(config)
    claimed_before = _claimed(config)
    try:
        progress = Progress.for_stdout(config)
        where = (f"connecting to the Spark Connect server {shown(config.remote)}" if config.remote else
                 f"starting Spark ({config.master})")
        progress.note(f"{where}; Spark's checkpoint: {config.spark_checkpoint}"
                      + ("" if config.verbose else f"; log: {config.log_file}"))
        try:
            how, failure = _run_query(config, signals, parent, progress)
        finally:
            progress.close()
    except Exception as exc:  # noqa: BLE001 - a defect outside the query: its traceback to the log, its cause to the user
        traceback.print_exc()
        how, failure = "failed", exc
    if how == "failed":
        _stop_spark()  # first: the slot is in use until its reader has ended
        notes = _release(config, claimed_before)
        if config.remote is not None and lost_server(failure):
            print(f"flinkish mirror: failed: {failure}", file=sys.stderr, flush=True)  # the log
            for line in [*notes, lost_server_line(config, failure)]:
                print(f"flinkish mirror: {line}", file=terminal, flush=True)
            return EXIT_RETRY
        _report_failure(config, failure, notes, terminal)
        return EXIT_FAILED
    code, text = ending(how, config)
    print(f"flinkish mirror: {text}", flush=True)
    _stop_spark()
    return code


def _run_query(config: MirrorConfig, signals: _Signals, parent: int, progress: Any) -> tuple[str, Any]:
    """Start Spark (or connect to the Connect server) and the query, wait for its end: (how it ended, the failure
    if it failed). Under ``--remote`` every call waits at most ``--server-timeout`` for a server that does not
    answer; then the failure is a :class:`~flinkish_spark.errors.ConnectServerUnavailableError`."""
    from flinkish_spark.connect_client import server_calls
    from flinkish_spark.mirror.cluster import session
    from flinkish_spark.mirror.metrics import Recorder

    global _spark
    query = recorder = None
    failure: Any = None
    try:
        _spark = spark = session(config)
        with server_calls(spark, config.server_timeout_s):
            query = start_query(spark, config)
            recorder = Recorder(config, query, config.metrics_port)  # counts for `mirror status`, --metrics-port
            progress.note(f"mirroring {config.tables} -> {config.sink_format} {config.target}"
                          + (" (snapshot only)" if config.stop_after_snapshot else "")
                          + (f"; metrics on port {config.metrics_port}" if config.metrics_port else ""))
            how = _wait(spark, query, config, signals, parent, progress)
            failure = query.exception() if how == "failed" else None
            if query.isActive:
                query.stop()
        return how, failure
    except Exception as exc:  # noqa: BLE001 - reported as one line, the process exits 1 (75: the server is gone)
        failure = exc
        if query is not None and not lost_server(exc):
            with contextlib.suppress(Exception):
                if query.isActive:
                    query.stop()
        return "failed", exc
    finally:
        if recorder is not None:
            recorder.close(failure)


#: The session of this process's run (stopped at its end; under Connect: the client's session).
_spark: Any = None


def _stop_spark() -> None:
    spark = _spark
    if spark is not None:
        with contextlib.suppress(Exception):  # a Connect session whose server is gone is closed already
            spark.stop()


def _wait(spark: Any, query: Any, config: MirrorConfig, signals: _Signals, parent: int, progress: Any) -> str:
    """Poll until the query ends; act on signals. How it ended: a QueryEnd, or ``interrupted`` (stopped at once)."""
    import flinkish_spark

    drain: list[str] = []
    drainer: threading.Thread | None = None
    while query.isActive:
        progress.update(query)
        orphaned = os.getppid() != parent  # the command was killed: stop at once, without a drain request
        if signals.count >= 1 and drainer is None and not orphaned:
            progress.note("stopping with drain: reading the changes up to now and committing them; the mirror "
                          "ends for good (Ctrl-C again: exit at once; the same command then continues from the last "
                          "committed epoch, and ends by itself if the drain's final epoch was already planned)")
            drainer = threading.Thread(target=lambda: drain.append(flinkish_spark.stop(query, drain=True)),
                                       name="flinkish-mirror-drain", daemon=True)
            drainer.start()
        if signals.count >= 2 or orphaned:
            progress.note("stopping at once")
            quiet(spark)  # the cancelled batch's task errors are expected: not the user's business
            query.stop()
            return "interrupted" if query.exception() is None else "failed"
        try:
            query.awaitTermination(0.5)
        except Exception as exc:  # noqa: BLE001 - the query failed: reported by the caller
            if lost_server(exc):
                raise  # not the query's failure: its server is gone (server_calls says so)
            break
    progress.update(query)
    if drainer is not None:
        drainer.join(timeout=60)
        if drain and drain[0] in ("drained", "finished"):
            return drain[0]
    return str(flinkish_spark.await_finished(query, timeout=0))


_ENDINGS = {
    "drained": (EXIT_OK, "drained: every change up to the stop is committed; {released}. The mirror is finished: "
                         "the same command again does nothing (a new --uid starts a new one)"),
    "finished": (EXIT_OK, "finished: every table is copied"),
    "stopped": (EXIT_OK, "stopped (flinkish stop, no drain): run the same command to continue"),
    "interrupted": (EXIT_STOPPED, "stopped at once: run the same command to continue from the last committed epoch"),
    "terminated": (EXIT_STOPPED, "the query ended: run the same command to continue"),
}


def ending(how: str, config: MirrorConfig) -> tuple[int, str]:
    """The exit code and the last line for a query that ended ``how`` (``drained``, ``finished``, ...)."""
    code, text = _ENDINGS.get(how, (EXIT_STOPPED, how))
    if how == "drained":  # what the source held on the server (a MySQL source holds nothing: no slot)
        text = text.format(released="slot and publication dropped" if config.source_kind == "postgres" else
                           "the binary log position was only in the checkpoint: nothing on the server to drop")
    if how == "finished" and not config.stop_after_snapshot:
        from flinkish_spark.mirror.finished import DRAINED

        text = DRAINED
    return code, text


def _claimed(config: MirrorConfig) -> bool:
    """Whether an earlier run created the slot and publication (then a failure of this one leaves them alone)."""
    from flinkish_spark.mirror.leftovers import claimed

    try:
        return claimed(config)
    except Exception:  # noqa: BLE001 - unknown: never drop what may be another run's
        return True


def _release(config: MirrorConfig, claimed_before: bool) -> list[str]:
    from flinkish_spark.mirror.leftovers import release

    try:
        return release(config, claimed_before)
    except Exception as exc:  # noqa: BLE001 - the failure itself is what the user must see
        return [f"could not check the replication slot and publication this run may have created ({exc}); "
                "see SELECT slot_name FROM pg_replication_slots"]


def _report_failure(config: MirrorConfig, exc: Any, notes: list[str], terminal: Any) -> None:
    """The full error to the log (stderr, which is the log file unless --verbose); to the user: where it is,
    what became of the slot, the advice that fits, and -- the last line -- the cause."""
    from flinkish_spark.mirror.failure import advice, cause_of

    text = str(exc) if exc is not None else "the query ended without a reason"
    for secret in (config.source_password, config.sink_password):
        if secret:
            text = text.replace(secret, "***")
    print(f"flinkish mirror: failed:\n{text}", file=sys.stderr, flush=True)
    root = " ".join(cause_of(exc, text).split())[:2000]
    lines = [] if config.verbose else [f"the full error (Java and Python traces) is in {config.log_file}"]
    lines += [*notes, advice(root, text), f"failed: {root}"]
    for line in lines:
        print(f"flinkish mirror: {line}", file=terminal, flush=True)


def main() -> int:
    from flinkish_spark.faults import arm_for_process_group

    # the process group supervise() started it in: a crash point (the demo, crash tests) kills the whole driver
    arm_for_process_group()
    config = MirrorConfig.from_json(sys.stdin.read(), os.environ.get(SOURCE_PASSWORD_ENV),
                                    os.environ.get(SINK_PASSWORD_ENV))
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
