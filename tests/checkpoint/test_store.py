"""The checkpoint store: id allocation past orphans, fencing by exclusive create, retention."""

from __future__ import annotations

import pytest

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.errors import CheckpointMismatchError, CorruptMetadataError
from flinkish_spark.io.fileio import FileIO


def _ckpt(store: SourceCheckpointStore, ckpt_id: int, created_ms: int = 0) -> SourceCheckpoint:
    return SourceCheckpoint(store.uid, store.kind, ckpt_id, None, created_ms, "{}", b"", False, (SplitRecord("a", 0, ckpt_id),))


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> SourceCheckpointStore:
    if request.param == "local":
        return SourceCheckpointStore(FileIO.for_url(str(tmp_path)), str(tmp_path / "meta"), "src", "flinkish.sequence")
    endpoint = request.getfixturevalue("s3")
    return SourceCheckpointStore(FileIO.for_url("s3://test", {"endpoint_url": endpoint}), "s3://test/meta", "src", "flinkish.sequence")


def test_ids_continue_after_files_a_crashed_run_left(store: SourceCheckpointStore) -> None:
    for i in range(3):
        store.write(_ckpt(store, store.allocate_id()))
    fresh = SourceCheckpointStore(store.io, store.root, store.uid, store.kind)  # a restarted driver
    assert fresh.allocate_id() == 3
    assert fresh.read(2).splits[0].position == 2


def test_second_writer_of_the_same_id_is_fenced(store: SourceCheckpointStore) -> None:
    other = SourceCheckpointStore(store.io, store.root, store.uid, store.kind)
    ckpt_id = store.allocate_id()
    assert other.allocate_id() == ckpt_id
    store.write(_ckpt(store, ckpt_id))
    with pytest.raises(CheckpointMismatchError, match="Another query is running with the same 'checkpoint' and uid"):
        # Another query's checkpoint differs from ours at least in its creation time (as every
        # exclusive write of flinkish does): byte-equal objects count as our own resent write on S3.
        other.write(_ckpt(other, ckpt_id, created_ms=1))


def test_retention_keeps_newest_and_everything_not_yet_committed(store: SourceCheckpointStore) -> None:
    for _ in range(15):
        store.write(_ckpt(store, store.allocate_id()))
    deleted = store.retain(retain=3, committed_id=10)
    assert deleted == list(range(0, 8))
    assert store.ids() == [8, 9, 10, 11, 12, 13, 14]  # 11..14 may still be in Spark's offset log


def test_missing_referenced_checkpoint_is_a_clear_error(store: SourceCheckpointStore) -> None:
    with pytest.raises(CheckpointMismatchError, match="references checkpoint 42 of source uid 'src'"):
        store.read(42)


def test_other_kind_under_same_uid_is_refused(store: SourceCheckpointStore) -> None:
    store.write(_ckpt(store, store.allocate_id()))
    other = SourceCheckpointStore(store.io, store.root, store.uid, "flinkish.files")
    with pytest.raises(CheckpointMismatchError, match="checkpointed as a 'flinkish.sequence' source"):
        other.read(0)


def test_corrupt_file_in_store_names_its_path(store: SourceCheckpointStore) -> None:
    store.io.write_bytes(store.path(0), b"garbage")
    with pytest.raises(CorruptMetadataError, match="000000000000.parquet is not a Parquet file"):
        store.read(0)


def test_unrelated_files_in_the_folder_are_ignored(store: SourceCheckpointStore) -> None:
    store.write(_ckpt(store, store.allocate_id()))
    store.io.write_bytes(store.directory + "/README.txt", b"notes")
    store.io.write_bytes(store.directory + "/.000000000009.parquet.tmp-abc", b"partial")
    assert store.ids() == [0]
