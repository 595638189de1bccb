"""The status model below Spark: the per-table figures the sink records with each epoch's ``.done`` marker folded
into the counts record once per epoch, ``mirror_status`` / ``flinkish mirror status`` on a metadata root (with the
epochs a killed run did not record), and the exporter's text."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc.patterns import write_not_followed
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.mirror import counts
from flinkish_spark.mirror.progress import OBSERVED
from flinkish_spark.sink.decisions import DecisionLog, encode_done

A, B = "public.orders", "sales.items"
T0 = 1_700_000_000_000_000  # a source commit time, epoch µs


def figures(**by_table: tuple[int, int, int, int]) -> dict:
    """A ``.done`` marker's figures: table (``schema__table``) -> (snapshot rows, changes, truncates, commit_us)."""
    return {"tables": {name.replace("__", "."): list(f) for name, f in by_table.items()}}


def done(log: DecisionLog, epoch: int, visible_ms: int, figs: dict | None) -> None:
    """Epoch ``epoch`` decided and done, its marker as the sink's commit writes it (at ``visible_ms``)."""
    log.record(epoch, [b"x"], "run")
    log.io.write_exclusive(log.done_path(epoch), encode_done(visible_ms, figs) if figs is not None else b"")


def test_a_record_folds_each_epoch_once_per_table_and_knows_each_tables_lag(tmp_path: Path) -> None:
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path), "mirror_sink")
    done(log, 0, T0 // 1000, figures(public__orders=(1001, 0, 0, -1), sales__items=(7, 0, 0, -1)))
    done(log, 1, T0 // 1000 + 4_000, figures(public__orders=(0, 5, 1, T0 + 1_500_000), sales__items=(0, 2, 0, T0)))
    r = counts.fold(counts.Record(), log)
    assert counts.fold(r, log) is r  # folded again: nothing new, nothing counted twice
    assert r.tables[A] == counts.TableCounts(1001, 6, 1, T0 + 1_500_000, pytest.approx(2.5))
    assert r.tables[B] == counts.TableCounts(7, 2, 1, T0, pytest.approx(4.0))
    assert (r.epoch, r.rows, r.changes, r.exact) == (1, 1001 + 7 + 7, 8, True)  # a truncate is a change, not a row
    # mirror-wide: the epoch's newest change (every table holds the changes up to it)
    assert r.lag_s == pytest.approx(2.5) and r.last_commit_us == T0 + 1_500_000
    assert counts.Record.from_json(r.to_json()) == r
    # An epoch without figures (an older flinkish committed it), then a gap (retention removed epoch 3 before a
    # fold took it): the counts say they are not exact.
    done(log, 2, T0 // 1000 + 5_000, None)
    later = counts.fold(r, log)
    assert (later.epoch, later.tables, later.exact) == (2, r.tables, False)
    done(log, 4, T0 // 1000 + 6_000, figures(public__orders=(0, 1, 0, T0 + 5_000_000)))
    assert not counts.fold(replace(r, epoch=2), log).exact
    # A record of an older flinkish (Spark batch ids, no epochs) counted the epochs done now: it goes on after them.
    legacy = counts.Record.from_json(json.dumps({"batch": 9, "rows": 5, "changes": 5, "tables": {
        A: {"snapshot_rows": 0, "changes": 5}}}).encode())
    on = counts.fold(legacy, log)
    assert (on.epoch, on.rows, on.tables[A].changes, on.legacy) == (4, 5, 5, False)


C = "public.scratch"
NOTE = ("public.scratch is not followed: it has no primary key. ALTER TABLE public.scratch ADD PRIMARY KEY (...) "
        "makes it followed")


def write_mirror(root: str) -> None:
    """A stopped mirror's metadata: its source's newest checkpoint naming a registry of two tables; sink epochs 0
    and 1 committed, 2 decided; the counts record written after epoch 0 only (the run was killed before it
    recorded epoch 1)."""
    io = FileIO.for_url(root)
    store = SourceCheckpointStore(io, root, "mirror", "flinkish.postgres")
    reg = registry.Registry(1, 2, (registry.TableEntry(0, 100, "public", "orders", "streaming"),
                                   registry.TableEntry(1, 101, "sales", "items", "snapshot")))
    name = registry.write(io, store.directory, reg)
    state = json.dumps({"registry": name}).encode()
    store.write(SourceCheckpoint("mirror", "flinkish.postgres", 3, None, 0, "{}", state, False,
                                 (SplitRecord("changes-0", 0, 4096),)))
    write_not_followed(io, store.directory, {C: NOTE})  # a matching table without a key
    log = DecisionLog(io, root, "mirror_sink")
    done(log, 0, T0 // 1000, figures(public__orders=(1000, 0, 0, -1), sales__items=(7, 0, 0, -1)))
    r = counts.fold(counts.Record(), log)
    counts.write(io, root, "mirror", replace(r, runs=3, errors=1, last_error="TargetWriteError: disk full"))
    done(log, 1, T0 // 1000 + 1_500, figures(public__orders=(1, 5, 0, T0)))
    log.record(2, [b"x"], "run")


def test_mirror_status_and_the_command_read_the_metadata(tmp_path: Path) -> None:
    import flinkish_spark

    root = str(tmp_path / "meta")
    write_mirror(root)
    s = flinkish_spark.mirror_status(root)
    # epoch 1, which the killed run did not record, is counted (once: the record is not written by a reader)
    assert [(t.name, t.state, t.snapshot_rows, t.changes, t.last_epoch) for t in s.tables] == [
        (A, "streaming", 1001, 5, 1), (B, "snapshot", 7, 0, 0), (C, "not followed", 0, 0, None)]
    assert s.tables[2].note == NOTE and s.table_states() == {"streaming": 1, "snapshot": 1, "not followed": 1}
    assert s.tables[0].lag_s == pytest.approx(1.5) and s.tables[0].last_commit_ms == T0 // 1000
    assert s.tables[1].lag_s is None and s.tables[1].last_commit_ms is None  # snapshot rows only: no lag
    assert (s.uid, s.last_epoch, s.rows, s.changes, s.restarts, s.errors, s.running) == ("mirror", 1, 1013, 5, 2, 1, False)
    assert s.lag_s == pytest.approx(1.5) and s.counts_exact and s.slot is None  # no slot: the source created none here
    assert flinkish_spark.mirror_status(root).tables == s.tables

    run = [sys.executable, "-m", "flinkish_spark.cli", "mirror", "status", "--checkpoint", root]
    got = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120, check=True).stdout)
    assert got["tables"] == [{"name": A, "state": "streaming", "snapshot_rows": 1001, "changes": 5, "last_epoch": 1,
                              "last_commit_ms": T0 // 1000, "lag_s": pytest.approx(1.5), "note": ""},
                             {"name": B, "state": "snapshot", "snapshot_rows": 7, "changes": 0, "last_epoch": 0,
                              "last_commit_ms": None, "lag_s": None, "note": ""},
                             {"name": C, "state": "not followed", "snapshot_rows": 0, "changes": 0, "last_epoch": None,
                              "last_commit_ms": None, "lag_s": None, "note": NOTE}]
    assert (got["last_epoch"], got["restarts"], got["last_error"]) == (1, 2, "TargetWriteError: disk full")
    text = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "last committed epoch 1" in text and "1001" in text and "restarts 2" in text, text
    assert "1.5s" in text.split(A)[1].splitlines()[0], text  # the table's lag on its line
    assert "not followed" in text.split(C)[1].splitlines()[0] and f"warning: {NOTE}" in " ".join(text.split()), text

    missing = subprocess.run([*run[:-1], str(tmp_path / "nothing")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no flinkish checkpoint at" in missing.stderr, missing.stderr


def test_the_exporter_serves_the_status_as_prometheus_text(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from flinkish_spark.mirror.metrics import _Collector
    from flinkish_spark.mirror.status import mirror_status

    root = str(tmp_path / "meta")
    write_mirror(root)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(SimpleNamespace(status=mirror_status(root))))  # type: ignore[arg-type]
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert families["flinkish_mirror_table_snapshot_rows"].type == "counter"
    assert samples[("flinkish_mirror_table_snapshot_rows_total", (("table", A),))] == 1001
    assert samples[("flinkish_mirror_table_changes_total", (("table", A),))] == 5
    assert samples[("flinkish_mirror_table_state", (("state", "snapshot"), ("table", B)))] == 1
    assert samples[("flinkish_mirror_table_state", (("state", "streaming"), ("table", B)))] == 0
    assert samples[("flinkish_mirror_last_committed_epoch", ())] == 1
    assert samples[("flinkish_mirror_lag_seconds", ())] == pytest.approx(1.5)
    assert samples[("flinkish_mirror_table_lag_seconds", (("table", A),))] == pytest.approx(1.5)
    assert samples[("flinkish_mirror_table_last_change_commit_timestamp_seconds", (("table", A),))] == T0 / 1e6
    assert samples[("flinkish_mirror_table_last_committed_epoch", (("table", A),))] == 1
    assert samples[("flinkish_mirror_table_last_committed_epoch", (("table", B),))] == 0
    assert ("flinkish_mirror_table_lag_seconds", (("table", B),)) not in samples  # no change yet: no sample
    assert samples[("flinkish_mirror_table_state", (("state", "not followed"), ("table", C)))] == 1
    assert ("flinkish_mirror_table_snapshot_rows_total", (("table", C),)) not in samples  # no target, no count
    assert samples[("flinkish_mirror_restarts_total", ())] == 2 and samples[("flinkish_mirror_errors_total", ())] == 1


def test_the_pipeline_counts_a_killed_runs_epochs_at_its_start_then_each_committed_batch_once(tmp_path: Path) -> None:
    from flinkish_spark.mirror.config import MirrorConfig
    from flinkish_spark.mirror.metrics import Recorder

    root = str(tmp_path / "meta")
    write_mirror(root)  # the record holds epoch 0; epoch 1 was committed by a run killed before it recorded it
    io = FileIO.for_url(root)
    config = MirrorConfig("mirror", "m", "postgresql://db/x", "public.*", "delta", str(tmp_path / "lake/{schema}/{table}"),
                          root, str(tmp_path / "spark"))
    query = SimpleNamespace(recentProgress=[])
    recorder = Recorder(config, query)
    try:
        at_start = counts.read(io, root, "mirror")
        assert at_start is not None and (at_start.epoch, at_start.tables[A].changes, at_start.runs) == (1, 5, 4)
        log = DecisionLog(io, root, "mirror_sink")
        log.io.write_exclusive(log.done_path(2), encode_done(T0 // 1000 + 3_000, figures(public__orders=(0, 2, 0, T0))))
        query.recentProgress = [SimpleNamespace(batchId=0, durationMs={},  # the batch of epoch 2 committed
                                                observedMetrics={OBSERVED: {"rows": 2}})]
        recorder.step()
        recorder.step()
        after = counts.read(io, root, "mirror")
        assert after is not None and (after.epoch, after.tables[A].changes, after.rows) == (2, 7, 1015)
    finally:
        recorder.close()
    assert recorder.status is not None and recorder.status.tables[0].changes == 7


def test_each_committed_batchs_durations_are_scraped_once_an_idle_trigger_before_it_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark reports an idle trigger as an event with the id of the batch that has not run yet (no observed metrics,
    no batch run). The histogram took the idle trigger's durations as that batch's and then skipped the real batch's
    event as seen: an epoch's ``batch`` time of 0 s instead of 2 s."""
    import prometheus_client
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from flinkish_spark.mirror.config import MirrorConfig
    from flinkish_spark.mirror.metrics import Recorder

    def batch(n: int, run_ms: int) -> SimpleNamespace:
        return SimpleNamespace(batchId=n, observedMetrics={OBSERVED: {"rows": 1}}, durationMs={
            "latestOffset": 10, "queryPlanning": 5, "getBatch": 5, "addBatch": run_ms, "walCommit": 20,
            "commitOffsets": 30, "triggerExecution": run_ms + 70})

    idle = SimpleNamespace(batchId=1, observedMetrics={}, durationMs={"latestOffset": 4, "triggerExecution": 4})
    root = str(tmp_path / "meta")
    write_mirror(root)
    config = MirrorConfig("mirror", "m", "postgresql://db/x", "public.*", "delta", str(tmp_path / "lake/{schema}/{table}"),
                          root, str(tmp_path / "spark"))
    served: list = []  # the registry the endpoint answers from (an HTTP server's shutdown alone takes 0.5 s)

    def serve(port: int, registry: object) -> tuple:
        served.append(registry)
        return SimpleNamespace(shutdown=lambda: None), None

    monkeypatch.setattr(prometheus_client, "start_http_server", serve)
    query = SimpleNamespace(recentProgress=[], lastProgress=None)
    recorder = Recorder(config, query, port=9)
    try:
        for event in (batch(0, 1000), idle, batch(1, 2000)):
            query.recentProgress = [*query.recentProgress, event]
            query.lastProgress = event
            recorder.step()
    finally:
        recorder.close()
    text = generate_latest(served[0]).decode()  # what a scrape reads
    samples = {(s.name, s.labels.get("phase")): s.value for f in text_string_to_metric_families(text)
               for s in f.samples if f.name == "flinkish_mirror_epoch_duration_seconds"}
    assert (samples[("flinkish_mirror_epoch_duration_seconds_count", "batch")],
            samples[("flinkish_mirror_epoch_duration_seconds_sum", "batch")]) == (2, pytest.approx(3.0))
    assert (samples[("flinkish_mirror_epoch_duration_seconds_count", "plan")],
            samples[("flinkish_mirror_epoch_duration_seconds_sum", "plan")]) == (2, pytest.approx(0.04))
