"""In the pipeline process: record each committed batch's counts, and serve Prometheus metrics (``--metrics-port``).

:class:`Recorder` folds, at its start, the epochs a killed run committed after its last record, then runs
a thread that every second looks at the query's new progress events (Spark's ``recentProgress``): after a
committed batch it folds the sink's new done epochs into the counts record and writes it
(:mod:`flinkish_spark.mirror.counts`: exact under ``kill -9``), and takes the batch's durations into the
epoch histograms, once per batch (an idle trigger's event is no batch: :func:`~flinkish_spark.mirror.progress.is_batch`). Every :attr:`Recorder.REFRESH_S` it reads the status from the
metadata (:func:`flinkish_spark.mirror.status.mirror_status`, the one ``flinkish mirror status`` prints).
A scrape answers from what the thread read last: it never waits on the query or the metadata, so the
endpoint answers while a batch runs. Metric names, types and labels: docs/mirror.md, "Metrics and status".
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Iterator

from flinkish_spark.errors import ConfigError
from flinkish_spark.faults import crash_point
from flinkish_spark.mirror import counts
from flinkish_spark.mirror.config import MirrorConfig
from flinkish_spark.mirror.progress import is_batch, progress_after
from flinkish_spark.mirror.status import NOT_FOLLOWED, MirrorStatus, mirror_status

PREFIX = "flinkish_mirror"
STATES = ("joining", "snapshot", "streaming", NOT_FOLLOWED)
#: Spark's durations (``durationMs``) per phase of an epoch: planning it (the source's offsets, the plan),
#: running it (reading and writing; the sink's commit runs at its end, on the driver), committing Spark's logs
PHASES = {"plan": ("latestOffset", "queryPlanning", "getBatch"), "batch": ("addBatch",),
          "commit": ("walCommit", "commitOffsets")}
BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class _Collector:
    """The gauges and counters of the newest :class:`MirrorStatus` (a custom collector: a scrape reads it only)."""

    def __init__(self, recorder: "Recorder") -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.recorder.status
        if s is None:
            return
        state = GaugeMetricFamily(f"{PREFIX}_table_state", "1 for the table's state (joining, snapshot, streaming; "
                                  "not followed: it matches, without a usable key)", labels=["table", "state"])
        snap = CounterMetricFamily(f"{PREFIX}_table_snapshot_rows", "rows read by the table's snapshots",
                                   labels=["table"])
        chg = CounterMetricFamily(f"{PREFIX}_table_changes", "inserts, updates, deletes and truncates applied to "
                                  "the table's target", labels=["table"])
        lag = GaugeMetricFamily(f"{PREFIX}_table_lag_seconds", "visible in the table's target minus the source commit "
                                "time of its newest change, its newest epoch with changes", labels=["table"])
        last = GaugeMetricFamily(f"{PREFIX}_table_last_change_commit_timestamp_seconds", "source commit time of the "
                                 "table's newest change in its target", labels=["table"])
        epoch = GaugeMetricFamily(f"{PREFIX}_table_last_committed_epoch", "the newest committed epoch with rows of "
                                  "the table", labels=["table"])
        for t in s.tables:
            for st in STATES:
                state.add_metric([t.name, st], 1.0 if t.state == st else 0.0)
            if t.state == NOT_FOLLOWED:  # no target: its state (and the warning in status) is all there is
                continue
            snap.add_metric([t.name], t.snapshot_rows)
            chg.add_metric([t.name], t.changes)
            for family, value in ((lag, t.lag_s), (epoch, t.last_epoch),
                                  (last, None if t.last_commit_ms is None else t.last_commit_ms / 1000)):
                if value is not None:  # none yet: no sample (a 0 would read as 'no lag', 'epoch 0', '1970')
                    family.add_metric([t.name], value)
        yield from (state, snap, chg, lag, last, epoch)
        yield CounterMetricFamily(f"{PREFIX}_rows", "data rows of all committed batches", value=s.rows)
        yield CounterMetricFamily(f"{PREFIX}_changes", "changes of all committed batches", value=s.changes)
        gauges = {
            "running": ("1 while the source's lease is renewed", float(s.running)),
            "lag_seconds": ("visible in the targets minus source commit time of the newest change, newest epoch with "
                            "changes (every table holds every change up to it)", s.lag_s),
            "last_change_commit_timestamp_seconds": ("source commit time of the newest change in the targets",
                                                     None if s.last_commit_ms is None else s.last_commit_ms / 1000),
            "last_committed_epoch": ("the sink's newest committed epoch", s.last_epoch),
            "last_committed_epoch_timestamp_seconds": ("when the newest committed epoch was decided",
                                                       None if s.last_epoch_ms is None else s.last_epoch_ms / 1000),
            "status_read_timestamp_seconds": ("when these figures were read from the metadata", s.read_ms / 1000),
        }
        for name, (text, value) in gauges.items():
            if value is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=value)
        if s.slot is not None:
            for name, text, value in (
                    ("slot_retained_wal_bytes", "pg_current_wal_lsn() - restart_lsn", s.slot_retained_bytes),
                    ("slot_confirmed_lag_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn",
                     s.slot_confirmed_lag_bytes)):
                if value is not None:
                    g = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["slot"])
                    g.add_metric([s.slot], value)
                    yield g
        yield CounterMetricFamily(f"{PREFIX}_errors", "runs of the mirror that ended failed", value=s.errors)
        yield CounterMetricFamily(f"{PREFIX}_restarts", "starts of the mirror after its first", value=s.restarts)


class Recorder:
    """Records the query's committed batches and serves the metrics (``port``: None, none served)."""

    FOLD_S = 1.0
    REFRESH_S = 2.0
    _behind = False  # a fold or write failed: try again at the next look, not only after the next batch

    def __init__(self, config: MirrorConfig, query: Any, port: int | None = None) -> None:
        from flinkish_spark.io.fileio import FileIO, storage_options_from

        self.config, self.query = config, query
        self.root = config.checkpoint.rstrip("/")
        self.io = FileIO.for_url(self.root, storage_options_from(dict(config.source_extra), self.root),
                                 what="--checkpoint")
        self.log = counts.sink_log(self.io, self.root, config.uid)
        before = counts.read(self.io, self.root, config.uid) or counts.Record()
        self.record = replace(before, runs=before.runs + 1)
        try:
            # the epochs a killed run committed after its last write, counted before this run's first batch
            self.record = counts.fold(self.record, self.log)
        except Exception:  # noqa: BLE001 - figures never stop a mirror: the next fold takes them
            self._behind = True
        try:
            counts.write(self.io, self.root, config.uid, self.record)
        except Exception:  # noqa: BLE001 - the next batch writes it again
            self._behind = True
        self.status: MirrorStatus | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._refreshed = 0.0
        self._seen = -1  # the newest Spark batch of this run whose progress was taken
        self.server: Any = None
        self.durations: Any = None
        if port is not None:
            self._serve(port)
        self.thread = threading.Thread(target=self._loop, name="flinkish-mirror-metrics", daemon=True)
        self.thread.start()

    def _serve(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, Histogram, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        self.durations = Histogram(f"{PREFIX}_epoch_duration_seconds", "time an epoch spent per phase (plan, batch, "
                                   "commit), from Spark's progress", ["phase"], registry=registry, buckets=BUCKETS)
        registry.register(_Collector(self))
        try:
            self.server, _ = start_http_server(port, registry=registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: cannot serve metrics there ({exc.strerror or exc}); choose a "
                              "free port, or leave --metrics-port out") from None

    def _loop(self) -> None:
        while not self._stop.wait(self.FOLD_S):
            self.step()

    def step(self, force: bool = False) -> None:
        """Fold in new epochs; refresh the status when due. Best effort: figures never stop a mirror."""
        with self._lock:
            try:
                self._fold(force)
            except Exception:  # noqa: BLE001 - see the docstring
                self._behind = True
            if force or time.monotonic() - self._refreshed >= self.REFRESH_S:
                self._refreshed = time.monotonic()
                try:
                    self.status = mirror_status(self.root, self.config.uid, slot=True, io=self.io,
                                                record=None if self._behind else self.record)
                except Exception:  # noqa: BLE001 - keep the last status
                    pass

    def _fold(self, force: bool) -> None:
        """After a committed batch (its progress event), or when forced or behind: the sink's new done epochs into
        the record, and the record written. The batch's durations go to the histograms."""
        new = []
        for p in progress_after(self.query, self._seen):
            if not is_batch(p) or int(p.batchId) <= self._seen:
                # An idle trigger's event names the batch that has not run yet: taken as seen, it hid that batch's
                # own event (its durations missing from the histograms) and put the idle trigger's in them
                continue
            self._seen = int(p.batchId)
            new.append(p)
            if self.durations is not None:
                took = getattr(p, "durationMs", None) or {}
                for phase, keys in PHASES.items():
                    self.durations.labels(phase).observe(sum(float(took.get(k) or 0) for k in keys) / 1000)
        if not (new or force or self._behind):
            return
        behind, self._behind = self._behind, True  # until the record is written
        record = counts.fold(self.record, self.log)
        if record is not self.record or behind:
            crash_point("mirror.before_status_record")  # the epochs are committed, their counts not recorded yet
            counts.write(self.io, self.root, self.config.uid, record)
            self.record = record
        self._behind = False

    def close(self, failure: BaseException | None = None) -> None:
        """The last batches in, the failure (if any) recorded; the server stopped."""
        self._stop.set()
        self.thread.join(timeout=10)
        self.step(force=True)
        if failure is not None:
            with self._lock:
                line = " ".join(str(failure).split())[:500]
                self.record = replace(self.record, errors=self.record.errors + 1, last_error=line)
                try:
                    counts.write(self.io, self.root, self.config.uid, self.record)
                except Exception:  # noqa: BLE001 - best effort
                    pass
        if self.server is not None:
            self.server.shutdown()
