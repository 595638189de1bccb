"""flinkish.delta keyed commits under concurrent writers, lost answers and compactions (in process, no Spark).

The interleavings are forced: a hook runs another writer's commit after the sink computed
its version (lookup done, deletion vectors written) and before its put-if-absent, so the
put loses and the sink must read the winner and look its keys up again. The table read
by delta-rs must equal the model applied in commit order.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.connectors.delta import keyed
from flinkish_spark.errors import StorageUnavailableError
from flinkish_spark.testing.changes import Change, Model, normalized, random_epochs, run_epoch

deltalake = pytest.importorskip("deltalake")


def sink_at(path: Path, uid: str = "u", **options):
    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.testing.changes import SCHEMA

    defaults = {"mode": "upsert", "key": "id", "deletes": "true", "checkpoint_interval": 0, "rows_per_file": 1000}
    return DeltaSink.at(str(path), uid=uid, schema=SCHEMA, **{**defaults, **options})


def read_table(path: Path) -> list[dict]:
    return normalized(pa.table(deltalake.DeltaTable(str(path)).scan()).to_pylist())


def interleave(monkeypatch: pytest.MonkeyPatch, concurrent, uid: str = "a") -> list[int]:
    """Run ``concurrent()`` once, between ``uid``'s next keyed build and its put; returns the
    versions ``uid``'s builds read."""
    builds = []
    original = keyed.EpochCommit.build

    def build(self, **kwargs):
        built = original(self, **kwargs)
        if self.sink.uid != uid:
            return built
        builds.append(self.state.version)
        if len(builds) == 1:
            concurrent()
        return built

    monkeypatch.setattr(keyed.EpochCommit, "build", build)
    return builds


@pytest.mark.parametrize("other", ["keyed sink", "delta-rs delete", "delta-rs compact"])
def test_a_concurrent_commit_makes_the_sink_look_its_keys_up_again(tmp_path: Path, monkeypatch, other: str) -> None:
    path = tmp_path / "t"
    a = sink_at(path, uid="a")
    b = sink_at(path, uid="b")
    model = Model("upsert", "true")
    epochs = random_epochs(seed=21, epochs=4, keys=50, per_epoch=60, tasks=2)
    for epoch in range(3):
        run_epoch(a, epoch, epochs[epoch])
        model.apply(epochs[epoch])
    theirs = [Change(k, "u", f"b{k}", 10_000 + k) for k in range(0, 50, 2)] + [Change(7, "d", None, 20_000)]

    def concurrent() -> None:
        if other == "keyed sink":
            assert run_epoch(b, 0, theirs) == "COMMITTED"
            model.apply(theirs)
        elif other == "delta-rs delete":
            deltalake.DeltaTable(str(path)).delete("id % 3 = 0")
            model.rows = {k: v for k, v in model.rows.items() if k % 3}
        else:
            deltalake.DeltaTable(str(path)).optimize.compact()

    builds = interleave(monkeypatch, concurrent)
    before = deltalake.DeltaTable(str(path)).version()
    assert run_epoch(a, 3, epochs[3]) == "COMMITTED"
    model.apply(epochs[3])
    assert len(builds) == 2 and builds[1] == before + 1  # looked up again against the winner's version
    assert read_table(path) == model.table()
    assert deltalake.DeltaTable(str(path)).transaction_version("a") == 3


def test_a_commit_whose_answer_was_lost_is_found_again(tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.delta.log import DeltaLog

    path = tmp_path / "t"
    sink = sink_at(path)
    model = Model("upsert", "true")
    epochs = random_epochs(seed=4, epochs=3, keys=30, per_epoch=40, tasks=2)
    for epoch in range(2):
        run_epoch(sink, epoch, epochs[epoch])
        model.apply(epochs[epoch])
    original = DeltaLog.write_version

    def lost(self, version, payload, *args):
        original(self, version, payload, *args)
        raise StorageUnavailableError("the answer was lost")

    monkeypatch.setattr(DeltaLog, "write_version", lost)
    from flinkish_spark.testing.changes import prepare

    prepared = [c for c in prepare(sink, 2, epochs[2]) if c is not None]
    assert sink.commit(prepared, 2) == "RETRY_LATER"
    monkeypatch.setattr(DeltaLog, "write_version", original)
    version = deltalake.DeltaTable(str(path)).version()
    assert sink.commit(prepared, 2) == "ALREADY_COMMITTED"
    assert deltalake.DeltaTable(str(path)).version() == version  # applied once
    model.apply(epochs[2])
    assert read_table(path) == model.table()


def test_the_sinks_compaction_is_abandoned_when_another_writer_changes_its_files(tmp_path: Path, monkeypatch) -> None:
    """The compaction after an epoch loses its version to another writer's keyed commit that gives a
    compacted file a new deletion vector: re-adding those rows would resurrect them, so it gives up
    and deletes its files; the next compaction (after epoch 5) succeeds."""
    path = tmp_path / "t"
    a = sink_at(path, uid="a", compact_every=3, rows_per_file=200)
    b = sink_at(path, uid="b")
    model = Model("upsert", "true")
    epochs = random_epochs(seed=9, epochs=6, keys=200, per_epoch=100, tasks=2)
    theirs = [Change(k, "u", f"b{k}", 50_000 + k) for k in range(0, 200, 5)]
    from flinkish_spark.connectors.delta.log import DeltaLog

    write_version = DeltaLog.write_version
    raced = []

    def racing(self, version, payload, *args):
        if b'"operation":"OPTIMIZE"' in payload and not raced:
            raced.append(version)
            assert run_epoch(b, 0, theirs) == "COMMITTED"  # after a's epoch: applied to the model after it
        return write_version(self, version, payload, *args)

    monkeypatch.setattr(DeltaLog, "write_version", racing)
    for epoch in range(6):
        run_epoch(a, epoch, epochs[epoch])
        model.apply(epochs[epoch])
        if raced and epoch == 2:
            model.apply(theirs)
        assert read_table(path) == model.table(), f"epoch {epoch}"
    assert raced
    history = [h["operation"] for h in reversed(deltalake.DeltaTable(str(path)).history())]
    assert history.count("OPTIMIZE") == 1  # after epoch 2 abandoned, after epoch 5 committed
    on_disk = {p.name for p in path.rglob("compact-*.parquet")}
    live = {p.split("/")[-1] for p in deltalake.DeltaTable(str(path)).file_uris()}
    assert on_disk <= live  # the abandoned compaction left nothing behind


COMPACTOR = r'''
import os, sys, time, deltalake
path, ready, stop, done = sys.argv[1:5]
n = 0
open(ready, "w").close()
while not os.path.exists(stop):
    try:
        metrics = deltalake.DeltaTable(path).optimize.compact()
        n += metrics["numFilesRemoved"] > 0  # nothing to compact commits nothing
        open(done, "w").write(str(n))
    except Exception as e:  # a conflict with the sink's commit: delta-rs refuses, try again
        pass
    time.sleep(0.05)
print(n)
'''


def _compactions(done: Path) -> int:
    try:
        return int(done.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def test_compactions_of_another_process_racing_the_sinks_commits_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    # The sink keeps committing until the other process has compacted at least twice in between
    # (at least 24 epochs): on a fast machine 24 epochs can end before the other process has
    # imported delta-rs, and then nothing raced; on a loaded one the sink's back-to-back commits
    # can win every race for 80 epochs, so after 40 it pauses a little between epochs.
    path = tmp_path / "t"
    sink = sink_at(path, rows_per_file=100)
    model = Model("upsert", "true")
    epochs = random_epochs(seed=13, epochs=200, keys=400, per_epoch=120, tasks=3)
    run_epoch(sink, 0, epochs[0])
    model.apply(epochs[0])
    ready, stop, done = tmp_path / "ready", tmp_path / "stop", tmp_path / "done"
    proc = subprocess.Popen(
        [sys.executable, "-c", COMPACTOR, str(path), str(ready), str(stop), str(done)], stdout=subprocess.PIPE, text=True
    )
    last = 0
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the compacting process did not start"
        for epoch in range(1, len(epochs)):
            assert run_epoch(sink, epoch, epochs[epoch]) == "COMMITTED"
            model.apply(epochs[epoch])
            last = epoch
            if epoch >= 24 and _compactions(done) >= 2:
                break
            if epoch >= 40:
                time.sleep(0.2)
    finally:
        stop.touch()
        out, _ = proc.communicate(timeout=120)
    assert int(out.strip()) >= 2  # the other process did compact meanwhile
    history = [h["operation"] for h in deltalake.DeltaTable(str(path)).history()]
    assert history.count("OPTIMIZE") >= 2
    assert read_table(path) == model.table()
    assert deltalake.DeltaTable(str(path)).transaction_version("u") == last
