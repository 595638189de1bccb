"""Files on a local disk (flinkish_spark/io/local_disk.py): put-if-absent in one step or staged, and the one sync of
the file system per epoch that replaces a folder fsync per file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flinkish_spark.errors import AlreadyExistsError
from flinkish_spark.io import local_disk
from flinkish_spark.io.fileio import FileIO


def test_a_put_if_absent_never_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = str(tmp_path / "log" / "00000000000000000001.json")
    local_disk.create_exclusive(path, b"ours")  # the folder is created on the first write
    with pytest.raises(FileExistsError):
        local_disk.create_exclusive(path, b"theirs")
    assert Path(path).read_bytes() == b"ours"
    assert os.listdir(tmp_path / "log") == ["00000000000000000001.json"]


def test_a_staged_file_is_hidden_until_published_and_a_taken_name_removes_it(tmp_path: Path) -> None:
    io = FileIO.for_url(str(tmp_path))
    url = str(tmp_path / "00000000000000000002.json")
    staged = io.stage_exclusive(url, b"v2")
    assert os.path.basename(staged).startswith(".00000000000000000002.json.tmp-")
    assert not os.path.exists(url)
    io.publish_staged(staged, url)
    assert Path(url).read_bytes() == b"v2" and os.listdir(tmp_path) == ["00000000000000000002.json"]

    again = io.stage_exclusive(url, b"another v2")
    with pytest.raises(AlreadyExistsError, match="already exists"):
        io.publish_staged(again, url)
    assert Path(url).read_bytes() == b"v2" and os.listdir(tmp_path) == ["00000000000000000002.json"]


def test_one_syncfs_per_file_system_and_none_for_paths_that_do_not_exist(tmp_path: Path, monkeypatch) -> None:
    if local_disk._syncfs() is None:
        pytest.skip("no syncfs here (not Linux)")
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    calls = []
    real = local_disk._syncfs()
    monkeypatch.setattr(local_disk, "_syncfs", lambda: lambda fd: (calls.append(fd), real(fd))[1])
    paths = [str(tmp_path / n) for n in ("a", "b", "c", "missing")]
    assert local_disk.sync_file_systems(paths) == 1  # one file system
    assert len(calls) == 1
    assert local_disk.sync_file_systems([str(tmp_path / "missing")]) == 0


def test_without_syncfs_every_folder_is_fsynced_after_a_sync(tmp_path: Path, monkeypatch) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    synced, fsynced = [], []
    real_fsync = os.fsync
    monkeypatch.setattr(local_disk, "_syncfs", lambda: None)
    monkeypatch.setattr(os, "sync", lambda: synced.append(True))
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1])
    paths = [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "a")]
    assert local_disk.sync_file_systems(paths) == 2
    assert synced == [True] and sorted(fsynced) == [str(tmp_path / "a"), str(tmp_path / "b")]
    fsynced.clear()
    assert local_disk.sync_file_systems(paths, folders_too=False) == 0  # data files: the sync alone
    assert fsynced == [] and synced == [True, True]


def test_a_failing_syncfs_names_the_file_system(tmp_path: Path, monkeypatch) -> None:
    import ctypes

    monkeypatch.setattr(local_disk, "_syncfs", lambda: lambda fd: -1)
    monkeypatch.setattr(ctypes, "get_errno", lambda: 5)
    with pytest.raises(OSError, match=f"syncfs of the file system holding '{tmp_path}' failed: Input/output error"):
        local_disk.sync_file_systems([str(tmp_path)])
