"""flinkish.iceberg mode=upsert|history against the shared model (flinkish_spark/testing/changes.py):
seeded change streams -- many changes of the same keys per epoch, spread over tasks, LSNs shared
within a transaction -- through prepare/commit/cleanup; the table as pyiceberg's scan and polars'
own Iceberg reader read it (both apply the position deletes) must equal the model after each epoch,
a replay must change nothing, and nothing may stay on storage that the table does not name."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.testing.changes import SCHEMA, Model, normalized, random_epochs, run_epoch

pyiceberg = pytest.importorskip("pyiceberg")


def sink_at(path: Path, **options):
    from flinkish_spark.connectors.iceberg import IcebergSink

    defaults = {"mode": "upsert", "key": "id", "deletes": "true", "rows_per_file": 1000}
    return IcebergSink.at("db.t", uid="u", schema=SCHEMA, checkpoint=str(path), **{**defaults, **options})


def read_table(sink) -> list[dict]:
    import polars as pl

    table = sink.catalog().load_table("db.t")
    rows = normalized(table.scan().to_arrow().to_pylist())
    native = pl.scan_iceberg(table, reader_override="native").collect().to_arrow()
    assert normalized(native.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_large_string(f.type) else f
                                             for f in native.schema])).to_pylist()) == rows
    return rows


def stray_files(sink) -> set[str]:
    """Files below the table's data folder that no snapshot names (files a copy-on-write or compaction
    snapshot removed are still named by the snapshots before it: snapshot expiry's to delete)."""
    table = sink.catalog().load_table("db.t")
    named = {e.data_file.file_path.removeprefix("file://") for snap in table.snapshots()
             for m in snap.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=False)}
    return {str(p) for p in Path(table.location().removeprefix("file://"), "data").rglob("*.parquet")} - named


@pytest.mark.parametrize("deletes", ["true", "soft", "false"])
def test_upsert_equals_the_change_sequence(tmp_path: Path, deletes: str) -> None:
    sink = sink_at(tmp_path, deletes=deletes)
    model = Model("upsert", deletes)
    for epoch, changes in enumerate(random_epochs(seed=3, epochs=8, keys=60, per_epoch=80, tasks=3)):
        assert run_epoch(sink, epoch, changes) == "COMMITTED"
        model.apply(changes)
        assert read_table(sink) == model.table(), f"epoch {epoch}"
        assert run_epoch(sink, epoch, changes) == "ALREADY_COMMITTED"  # a replay: nothing changes
    assert read_table(sink) == model.table() and stray_files(sink) == set()
    table = sink.catalog().load_table("db.t")
    assert len(table.snapshots()) == 8 and int(table.current_snapshot().summary["total-position-deletes"]) > 0


@pytest.mark.parametrize("merge_mode", ["mergeOnRead", "copyOnWrite"])
def test_history_keeps_every_version(tmp_path: Path, merge_mode: str) -> None:
    sink = sink_at(tmp_path, mode="history", merge_mode=merge_mode)
    model = Model("history", "true")
    for epoch, changes in enumerate(random_epochs(seed=5, epochs=6, keys=30, per_epoch=60, tasks=2)):
        assert run_epoch(sink, epoch, changes) == "COMMITTED"
        model.apply(changes)
        assert read_table(sink) == model.table(), f"epoch {epoch}"
    assert stray_files(sink) == set()


def test_copy_on_write_and_compaction_equal_the_model(tmp_path: Path) -> None:
    cow = sink_at(tmp_path / "cow", merge_mode="copyOnWrite")
    compacted = sink_at(tmp_path / "compacted", compact_every=3)
    model = Model("upsert", "true")
    for epoch, changes in enumerate(random_epochs(seed=9, epochs=7, keys=50, per_epoch=70, tasks=3)):
        assert run_epoch(cow, epoch, changes) == run_epoch(compacted, epoch, changes) == "COMMITTED"
        model.apply(changes)
        assert read_table(cow) == read_table(compacted) == model.table(), f"epoch {epoch}"
    assert all(not t.delete_files for t in cow.catalog().load_table("db.t").scan().plan_files())
    assert stray_files(cow) == stray_files(compacted) == set()


def test_partitioned_table_keys_moving_between_partitions(tmp_path: Path) -> None:
    """partitionBy n (the value's length): a key's new version can land in another partition than the
    row it replaces; each position delete file lives in its data file's partition."""
    sink = sink_at(tmp_path, partition_by=("n",), deletes="soft")
    model = Model("upsert", "soft")
    for epoch, changes in enumerate(random_epochs(seed=11, epochs=6, keys=40, per_epoch=60, tasks=3)):
        assert run_epoch(sink, epoch, changes) == "COMMITTED"
        model.apply(changes)
        assert read_table(sink) == model.table(), f"epoch {epoch}"
    table = sink.catalog().load_table("db.t")
    tasks = list(table.scan().plan_files())
    assert len({t.file.partition[0] for t in tasks}) > 1 and any(t.delete_files for t in tasks)
    for t in tasks:
        assert all(d.partition == t.file.partition for d in t.delete_files)
    assert stray_files(sink) == set()


def test_compaction_merges_each_partitions_small_files_into_one_sorted_by_key(tmp_path: Path) -> None:
    """partitionBy n, compactEvery=4, three tasks an epoch (a few small files per partition and epoch): right
    after the 8th epoch's compaction each partition holds one data file, its rows sorted by key, and no
    delete file; the rows equal the model after every epoch and nothing stays that the table does not name."""
    import pyarrow.parquet as pq

    sink = sink_at(tmp_path, partition_by=("n",), compact_every=4)
    model = Model("upsert", "true")
    for epoch, changes in enumerate(random_epochs(seed=13, epochs=8, keys=40, per_epoch=40, tasks=3)):
        assert run_epoch(sink, epoch, changes) == "COMMITTED"
        model.apply(changes)
        assert read_table(sink) == model.table(), f"epoch {epoch}"
    table = sink.catalog().load_table("db.t")
    tasks = list(table.scan().plan_files())
    partitions = [t.file.partition[0] for t in tasks]
    assert len(set(partitions)) > 1 and len(partitions) == len(set(partitions)), partitions
    assert not any(t.delete_files for t in tasks)
    for t in tasks:
        rows = pq.read_table(t.file.file_path.removeprefix("file://")).to_pydict()
        assert rows["id"] == sorted(rows["id"]) and set(rows["n"]) == {t.file.partition[0]}
    assert stray_files(sink) == set()
