"""Files on a local disk: put-if-absent by a hidden temporary file and a link, in one step or staged behind one
sync of the file system; and that sync, once per epoch where each file's folder would be fsynced (issue 26).

What is at stake is only a crash of the *machine* (power loss, kernel panic): a process killed with ``kill -9``
loses nothing the kernel accepted, synced or not. On a local disk a routed sink's epoch writes one log version
per changed table; each version is written to a hidden temporary file that is fsynced *before* it is linked to
its name (so a version is never torn or empty after a machine crash), and its folder used to be fsynced after
the link as well (so the name itself survives). With 1,000 tables that is 1,000 folder fsyncs per epoch, each
a journal commit that the other committers' fsyncs queue behind.

:func:`sync_file_systems` replaces them with one ``syncfs(2)`` per file system (Linux) around the epoch's table
commits (:meth:`~flinkish_spark.connectors.delta.routed.RoutedDeltaSink.commit`):

* **before the first version**: the files the epoch's tasks wrote (data files, key entries), which no task
  fsyncs, are durable before any version can name them -- stronger than before, when a version could survive a
  machine crash that its data files did not;
* **after the last version, before the decision's** ``.done``: every version of the epoch is durable before the
  epoch is marked done. A machine crash before that loses some of the epoch's versions at most, never a part of
  one; the restart finds the decision recorded and not done and commits the epoch again in exactly the tables
  that lack it (their ``txn``), as after a ``kill -9`` between two tables. Within one table a later version of
  the same epoch (a compaction) fsyncs the folder itself, which makes the earlier name durable too: a log never
  has a gap.

A reader that looked at a table between a version's link and the machine crash may have seen that version,
which the restart then writes again (the same rows; its commit info's time differs). Where ``syncfs`` does not
exist (not Linux) the fallback keeps the old guarantee for the versions -- each folder fsynced, after the
fact -- and asks ``sync(2)`` for the data files.
"""

from __future__ import annotations

import ctypes
import os
import uuid
from typing import Any, Iterable

_LIBC: Any = None


def _syncfs() -> Any:
    """glibc's (and musl's) ``syncfs``, None where there is none."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _LIBC = False
    return getattr(_LIBC, "syncfs", None) if _LIBC else None


def sync_file_systems(paths: Iterable[str], folders_too: bool = True) -> int:
    """Make everything written so far on the local file systems holding ``paths`` durable: one ``syncfs`` per file
    system (a path that does not exist is skipped: nothing below it was written). Without ``syncfs``: ``sync`` once,
    then -- ``folders_too`` -- an fsync of each existing path (folders: their entries). Returns how many
    ``syncfs`` calls or fsyncs were made."""
    syncfs = _syncfs()
    existing = [p for p in dict.fromkeys(paths) if os.path.isdir(p)]
    if syncfs is None:
        os.sync()
        if not folders_too:
            return 0
        for path in existing:
            _fsync(path)
        return len(existing)
    devices: dict[int, str] = {}
    for path in existing:
        devices.setdefault(os.stat(path).st_dev, path)
    for path in devices.values():
        fd = os.open(path, os.O_RDONLY)
        try:
            if syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"syncfs of the file system holding {path!r} failed: {os.strerror(err)}")
        finally:
            os.close(fd)
    return len(devices)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_exclusive(path: str, data: bytes, sync_folder: bool = True) -> None:
    """Put-if-absent of ``path``: its bytes fsynced before the name appears (never torn, also after a machine
    crash); the folder fsynced after (``sync_folder``: the name survives a machine crash). FileExistsError when
    ``path`` exists."""
    publish_staged(stage_file(path, data, durable=True), path, sync_folder)


def stage_file(path: str, data: bytes, durable: bool) -> str:
    """``data`` in a hidden temporary file beside ``path`` (fsynced: ``durable``); its name."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
    try:
        f = open(tmp, "wb")
    except FileNotFoundError:  # the folder's first file (a mkdir per write would cost as much as the write)
        os.makedirs(directory, exist_ok=True)
        f = open(tmp, "wb")
    with f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    return tmp


def publish_staged(tmp: str, path: str, sync_folder: bool) -> None:
    """Link the staged ``tmp`` to ``path`` -- atomic, EEXIST when another writer got there first -- and remove it."""
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    if sync_folder:
        _fsync(os.path.dirname(path) or ".")
