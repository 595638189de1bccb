"""The status model below Spark: the per-table counts a batch's observed metrics carry, the record the pipeline
writes, ``mirror_status`` / ``flinkish mirror status`` on a metadata root, and the exporter's text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.connectors.postgres.source import registry
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.mirror import counts
from flinkish_spark.sink.decisions import DecisionLog

A, B = "public.orders", "sales.items"


def bins(**by_table: int) -> list[dict[str, float]]:
    """Histogram bins as Spark returns them: one per table and partition (the same key twice is summed)."""
    out = []
    for name, n in by_table.items():
        table = name.replace("__", ".")
        out += [{"x": counts.table_key(table), "y": float(n - n // 2)}, {"x": counts.table_key(table), "y": float(n // 2)}]
    return out


def batch(snapshot: dict[str, int], changes: dict[str, int], last_commit_us: int | None = None) -> dict:
    return {"rows": sum(snapshot.values()) + sum(changes.values()), "changes": sum(changes.values()),
            "last_commit_us": last_commit_us,
            counts.SNAPSHOT_BY_TABLE: bins(**{k.replace(".", "__"): v for k, v in snapshot.items()}),
            counts.CHANGES_BY_TABLE: bins(**{k.replace(".", "__"): v for k, v in changes.items()})}


def test_a_record_folds_each_batch_once_per_table_and_knows_the_lag() -> None:
    r = counts.Record().with_batch(0, batch({A: 1001, B: 7}, {}), 1_000_000, [A, B])
    r = r.with_batch(1, batch({}, {A: 5}, last_commit_us=1_000_000_000 - 2_500_000), 1_000_000, [A, B])
    assert r.with_batch(1, batch({}, {A: 5}), 2_000_000, [A, B]) == r  # a batch seen again: not counted twice
    assert r.tables == {A: counts.TableCounts(1001, 5), B: counts.TableCounts(7, 0)}
    assert (r.rows, r.changes, r.batch, r.exact) == (1013, 5, 1, True)
    assert r.lag_s == pytest.approx(2.5) and r.last_commit_us == 1_000_000_000 - 2_500_000
    # A bin that names no table (merged bins: more tables in a batch than the histogram holds): totals only.
    merged = {**batch({}, {A: 1}), counts.CHANGES_BY_TABLE: [{"x": 12345.0, "y": 3.0}]}
    later = r.with_batch(2, merged, 1_000_000, [A, B])
    assert later.tables[A].changes == 5 and later.changes == 6 and not later.exact
    assert counts.Record.from_json(later.to_json()) == later
    # A new Spark checkpoint (a new query id) numbers its batches from 0 again: they count.
    again = later.for_query("q1").with_batch(0, batch({}, {B: 2}), 1_000_000, [A, B])
    assert again.tables[B].changes == 2 and again.for_query("q1") == again


def write_mirror(root: str) -> None:
    """A stopped mirror's metadata: its source's newest checkpoint naming a registry of two tables, a committed
    and a decided sink epoch, and the counts record."""
    io = FileIO.for_url(root)
    store = SourceCheckpointStore(io, root, "mirror", "flinkish.postgres")
    reg = registry.Registry(1, 2, (registry.TableEntry(0, 100, "public", "orders", "streaming"),
                                   registry.TableEntry(1, 101, "sales", "items", "snapshot")))
    name = registry.write(io, store.directory, reg)
    state = json.dumps({"registry": name}).encode()
    store.write(SourceCheckpoint("mirror", "flinkish.postgres", 3, None, 0, "{}", state, False,
                                 (SplitRecord("changes-0", 0, 4096),)))
    log = DecisionLog(io, root, "mirror_sink")
    for epoch in (6, 7):
        log.record(epoch, [b"x"], "run")
    log.mark_done(6)
    r = counts.Record().with_batch(6, batch({A: 1001, B: 7}, {A: 5}, last_commit_us=1_700_000_000_000_000),
                                   1_700_000_001_500, [A, B])
    from dataclasses import replace

    counts.write(io, root, "mirror", replace(r, runs=3, errors=1, last_error="TargetWriteError: disk full"))


def test_mirror_status_and_the_command_read_the_metadata(tmp_path: Path) -> None:
    import flinkish_spark

    root = str(tmp_path / "meta")
    write_mirror(root)
    s = flinkish_spark.mirror_status(root)
    assert [(t.name, t.state, t.snapshot_rows, t.changes) for t in s.tables] == [
        (A, "streaming", 1001, 5), (B, "snapshot", 7, 0)]
    assert (s.uid, s.last_epoch, s.rows, s.changes, s.restarts, s.errors, s.running) == ("mirror", 6, 1013, 5, 2, 1, False)
    assert s.lag_s == pytest.approx(1.5) and s.slot is None  # no slot: the source did not create one here

    run = [sys.executable, "-m", "flinkish_spark.cli", "mirror", "status", "--checkpoint", root]
    got = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120, check=True).stdout)
    assert got["tables"] == [{"name": A, "state": "streaming", "snapshot_rows": 1001, "changes": 5},
                             {"name": B, "state": "snapshot", "snapshot_rows": 7, "changes": 0}]
    assert (got["last_epoch"], got["restarts"], got["last_error"]) == (6, 2, "TargetWriteError: disk full")
    text = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "last committed epoch 6" in text and "1001" in text and "restarts 2" in text, text

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
    assert samples[("flinkish_mirror_last_committed_epoch", ())] == 6
    assert samples[("flinkish_mirror_lag_seconds", ())] == pytest.approx(1.5)
    assert samples[("flinkish_mirror_restarts_total", ())] == 2 and samples[("flinkish_mirror_errors_total", ())] == 1
