"""flinkish.delta keyed modes: the driver process's caches (live-file state, vectors, key indexes)
never answer for a table that is not the one on storage any more.

Spark reuses the driver's Python workers across queries, so a query started after the table
was deleted (and created again) runs its commits in a process that remembers the old table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.testing.changes import SCHEMA, Change, run_epoch

deltalake = pytest.importorskip("deltalake")


def sink_at(path: Path, uid: str = "u", **options):
    from flinkish_spark.connectors.delta import DeltaSink

    defaults = {"mode": "upsert", "key": "id", "deletes": "true", "checkpoint_interval": 0, "rows_per_file": 1000}
    return DeltaSink.at(str(path), uid=uid, schema=SCHEMA, **{**defaults, **options})


def ids(path: Path) -> list[tuple[int, str]]:
    rows = pa.table(deltalake.DeltaTable(str(path)).scan()).to_pylist()
    return sorted((r["id"], r["v"]) for r in rows)


def test_a_table_deleted_between_two_queries_is_created_again_and_gets_every_epoch(tmp_path: Path) -> None:
    """The first query commits epochs 0..2; the table folder is deleted; a second query (a new
    checkpoint: epochs from 0 again) in the same process must write its rows, not answer
    'already committed' from the old table's txn."""
    path = tmp_path / "t"
    first = sink_at(path)
    for epoch in range(3):
        assert run_epoch(first, epoch, [Change(epoch, "c", f"old{epoch}", 10 + epoch)]) == "COMMITTED"
    shutil.rmtree(path)

    second = sink_at(path)  # the new query's start: validates (creates) the table
    assert (path / "_delta_log").exists(), "the table was not created again"
    assert run_epoch(second, 0, [Change(7, "c", "new", 1)]) == "COMMITTED"
    assert run_epoch(second, 1, [Change(8, "c", "new2", 2)]) == "COMMITTED"
    assert ids(path) == [(7, "new"), (8, "new2")]
    assert deltalake.DeltaTable(str(path)).transaction_version("u") == 1


@pytest.mark.parametrize("others", [1, 5])
def test_a_table_recreated_by_another_writer_is_not_written_with_stale_state(tmp_path: Path, others: int) -> None:
    """Between two epochs of one sink the table is deleted and created again by another writer
    (with rows of its own): the next epoch applies to the new table -- no version gap, no rows of
    the old table brought back, the new table's rows kept. With ``others=5`` the new table has as
    many versions as the old one had when the sink last looked (0..4): every version number the
    sink's caches name exists again, with other commits (failed with a check of the number alone)."""
    path = tmp_path / "t"
    sink = sink_at(path)
    for epoch in range(4):
        assert run_epoch(sink, epoch, [Change(epoch, "c", f"old{epoch}", 10 + epoch)]) == "COMMITTED"
    shutil.rmtree(path)
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int32())])
    for i in range(others):
        deltalake.write_deltalake(str(path), pa.table({"id": [100 + i], "v": ["theirs"], "n": [6]}, schema=schema),
                                  mode="append", configuration={"delta.enableDeletionVectors": "true"})
    assert run_epoch(sink, 4, [Change(101, "u", "mine", 50)]) == "COMMITTED"
    table = deltalake.DeltaTable(str(path))
    assert table.version() == others  # the other writer's versions, then our epoch: no gap
    assert ids(path) == sorted([(100 + i, "theirs") for i in range(others) if i != 1] + [(101, "mine")])


def test_files_a_committed_version_names_stay_after_the_compaction_that_follows_it(tmp_path: Path) -> None:
    """compactEvery rewrites the epoch's own small files right after the epoch's version: a reader
    that loaded that version (a concurrent scan, time travel) must still find its files -- the
    epoch's cleanup deletes only what no version named, as VACUUM's retention would (and as the
    Iceberg sink keeps every file its epoch's snapshots added)."""
    path = tmp_path / "t"
    sink = sink_at(path, compact_every=2, rows_per_file=400)
    assert run_epoch(sink, 0, [Change(k, "r", f"s{k}", None, part=k % 2, row=k) for k in range(50)]) == "COMMITTED"
    assert run_epoch(sink, 1, [Change(k, "u", f"e1-{k}", 100 + k, part=k % 2, row=k) for k in range(0, 50, 3)]) \
        == "COMMITTED"
    table = deltalake.DeltaTable(str(path))
    operations = [h["operation"] for h in reversed(table.history())]
    assert operations[-1] == "OPTIMIZE", operations  # the compaction after epoch 1 removed epoch 1's files
    epoch_1 = table.version() - 1
    old = deltalake.DeltaTable(str(path), version=epoch_1)
    got = sorted((r["id"], r["v"]) for r in pa.table(old.scan()).to_pylist())
    assert got == sorted((k, f"e1-{k}" if k % 3 == 0 else f"s{k}") for k in range(50))


def test_a_recreated_table_whose_files_reuse_a_name_is_not_looked_up_in_the_old_files_index(tmp_path: Path) -> None:
    """Files the commit writes itself have names fixed per (uid, epoch) (``driver-copy-0000`` below the
    epoch's folder): the same query run again on a recreated table writes a file of the same name --
    and here of the same size -- holding another key. The key index of the old file must not answer."""
    path = tmp_path / "t"

    def run(values: dict[int, str], deleted: int) -> None:
        sink = sink_at(path, deletes="soft")
        run_epoch(sink, 0, [Change(k, "r", v, None, row=k) for k, v in values.items()])
        run_epoch(sink, 1, [Change(deleted, "d", None, 10)])  # soft: a driver-copy file with its row
        run_epoch(sink, 2, [Change(deleted, "u", "zz", 20)])  # looks the key up in that file

    run({5: "aaaa", 6: "bbbb"}, deleted=5)
    shutil.rmtree(path)
    run({5: "xxxx", 6: "aaaa"}, deleted=6)
    rows = sorted((r["id"], r["v"], r["_deleted"]) for r in pa.table(deltalake.DeltaTable(str(path)).scan()).to_pylist())
    assert rows == [(5, "xxxx", False), (6, "zz", False)]


def test_a_long_running_commit_process_keeps_one_vector_per_file(tmp_path: Path) -> None:
    """Every epoch deletes a row of the same file, so its deletion vector is replaced each time: the
    process caches the file's newest vector only, and its byte count stays the sum of what it holds.
    (Before: every vector ever written stayed, and each store summed them all -- a routed commit of
    ~1,000 tables grew by ~0.4 s per epoch the process had run, benchmarks/routed_commit_growth.py.)"""
    from flinkish_spark.connectors.delta import live

    path = tmp_path / "t"
    sink = sink_at(path)
    assert run_epoch(sink, 0, [Change(k, "c", f"v{k}", k + 1) for k in range(50)]) == "COMMITTED"
    for epoch in range(1, 21):
        assert run_epoch(sink, epoch, [Change(epoch, "d", None, 100 + epoch)]) == "COMMITTED"
    assert ids(path) == [(k, f"v{k}") for k in [0, *range(21, 50)]]
    mine = [key for key in live._DV_CACHE if key.startswith(f"{sink.table_uri}|")]
    assert len(mine) == 1, f"{len(mine)} vectors cached for the table's one file"
    assert live.vector_cache_bytes() == sum(live._cost(p) for _, p in live._DV_CACHE.values())


@pytest.mark.parametrize("deletes", ["true", "soft"])
def test_the_key_index_a_commit_seeds_is_the_one_its_files_give_and_the_next_lookup_reads_none(
        tmp_path: Path, monkeypatch, deletes: str) -> None:
    """Each commit keeps the key index of the tasks' files it names (from the epoch's entries) instead of the next
    epoch's lookup reading them back: every seeded index equals the index read from the file (codes, positions,
    keys), the next epoch reads no file the previous one wrote, and the table is the change sequence."""
    from flinkish_spark.connectors.delta.state import load_state
    from flinkish_spark.connectors.lakehouse import key_lookup
    from flinkish_spark.connectors.lakehouse.key_lookup import CACHE, CandidateFile, KeyLookup
    from flinkish_spark.testing.changes import Model, random_epochs

    from tests.connectors.delta.test_keyed import read_table

    read: list[str] = []
    build = key_lookup.KeyLookup._build

    def reading(self, f):
        read.append(f.url)
        return build(self, f)

    monkeypatch.setattr(key_lookup.KeyLookup, "_build", reading)
    path = tmp_path / "t"
    sink = sink_at(path, deletes=deletes, rows_per_file=7)  # several files per task
    model = Model("upsert", deletes)
    key_types = None
    for epoch, changes in enumerate(random_epochs(seed=13, epochs=6, keys=80, per_epoch=60, tasks=3)):
        read.clear()
        assert run_epoch(sink, epoch, changes) == "COMMITTED"
        model.apply(changes)
        assert read_table(str(path)) == model.table(), f"epoch {epoch}"
        if epoch > 0:
            assert read == [], f"epoch {epoch} read back the key index of {read}"
        state = load_state(sink.log(), deltalake.DeltaTable(str(path)).version())
        mine = [f for f in state.files.values() if f"/e{epoch:012d}/" in f.path]
        assert mine, "the epoch named none of its files"
        key_types = key_types or pa.schema([pa.field("id", pa.int64())])
        fresh = KeyLookup(sink.io, ("id",), None, cache=key_lookup.KeyIndexCache())
        fresh.types = key_types
        for f in mine:
            url = sink.url(f.relative_path)
            seeded = CACHE.get((url, f.size, ("id",), None, key_types))
            assert seeded is not None, f"{f.path}: no index kept by the commit"
            back = fresh._index(pq_keys(url))
            assert seeded.codes.tolist() == back.codes.tolist() and seeded.positions is None and back.positions is None
            assert len(seeded.codes) == f.num_records


def pq_keys(url: str) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(url, columns=["id"])
