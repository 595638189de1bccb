"""How a keyed commit's version file reaches storage: written at once, or -- the many tables of one epoch on a
local disk -- staged without an fsync, the file system synced once, then linked (issue 26).

A keyed commit is a generator (:func:`~flinkish_spark.connectors.delta.keyed.keyed_steps`) that yields a
:class:`VersionWrite` where it writes its version and is sent nothing back (written) or thrown the write's error
(:class:`~flinkish_spark.connectors.delta.log.VersionTaken`: another writer has the version -- the commit reads it
and tries again); the commit's logic is the same whichever way the file is written.

* :func:`write_now`: each version by put-if-absent when it comes (:meth:`FileIO.write_exclusive`: on a local disk
  the bytes fsynced before the name appears). One table's sink, the first table of a routed epoch, object storage.
* :func:`write_staged` (local disk only): every table's commit runs to its version, which goes to a hidden temporary
  file beside its name, not fsynced; then **one** ``syncfs`` (:func:`~flinkish_spark.io.local_disk.sync_file_systems`)
  makes those files -- and the deletion vectors and copies the commits wrote -- durable; only then is each version
  linked to its name and its commit finished. So after a machine crash no version is torn or names a file that is
  not there, as with one fsync per file, at one sync per epoch instead of one per table (two committer processes'
  per-table fsyncs queue behind the same journal). The names become durable at the routed sink's sync before the
  epoch's ``.done`` (:meth:`~flinkish_spark.connectors.delta.routed.RoutedDeltaSink.commit`). A table whose version
  was taken meanwhile retries the usual way (its new files synced before its new version).
* Staged files not linked when something fails are removed; a ``kill -9`` in between leaves them: hidden
  ``.<version>.json.tmp-<hex>`` files in ``_delta_log``, which no reader of the log (delta-rs, Spark) takes for a
  version and which may be deleted.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generator

from flinkish_spark.connectors.delta.log import VersionTaken
from flinkish_spark.errors import AlreadyExistsError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.io.local_disk import sync_file_systems
from flinkish_spark.sink.protocol import CommitOutcome

if TYPE_CHECKING:
    from flinkish_spark.connectors.delta.log import DeltaLog


@dataclass(frozen=True)
class VersionWrite:
    """A commit's version file, to be written by whoever drives the commit."""

    log: DeltaLog
    version: int
    payload: bytes

    @property
    def url(self) -> str:
        return self.log.commit_url(self.version)


#: A commit: yields its version writes, returns its outcome.
Steps = Generator[VersionWrite, None, CommitOutcome]


def write_now(steps: Steps, sync_folder: bool = True) -> CommitOutcome:
    """Drive ``steps``, writing each version when it comes (``sync_folder`` False: the caller makes the names
    durable, :mod:`~flinkish_spark.io.local_disk`)."""
    return _finish(steps, lambda: next(steps), sync_folder, files_durable=True)


def write_staged(commits: list[Steps], io: FileIO) -> list[CommitOutcome]:
    """Drive the ``commits`` (each made with ``staged=True``, on the local disk of ``io``) to their versions, stage
    those, sync the file system once, link each and finish its commit; their outcomes, in order."""
    outcomes: dict[int, CommitOutcome] = {}
    staged: dict[int, tuple[VersionWrite, str]] = {}
    try:
        for i, steps in enumerate(commits):
            try:
                step = next(steps)
            except StopIteration as stop:
                outcomes[i] = stop.value
                continue
            staged[i] = (step, io.stage_exclusive(step.url, step.payload))
        sync_file_systems({os.path.dirname(io.strip(step.url)) for step, _ in staged.values()}, folders_too=False)
        for i in sorted(staged):
            step, tmp = staged.pop(i)
            steps = commits[i]
            try:
                io.publish_staged(tmp, step.url)
            except AlreadyExistsError:
                taken = VersionTaken(step.version)  # another writer's: the commit reads it and tries again
                outcomes[i] = _finish(steps, lambda: steps.throw(taken), False, files_durable=False)
            else:
                outcomes[i] = _finish(steps, lambda: steps.send(None), False, files_durable=False)
    finally:
        for _, tmp in staged.values():  # staged, never linked: nothing names them
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return [outcomes[i] for i in range(len(commits))]


def _finish(steps: Steps, advance: Callable[[], VersionWrite], sync_folder: bool, files_durable: bool) -> CommitOutcome:
    """``advance`` the commit, then write each further version it yields at once -- after a sync of the file system
    when its own files were written without fsync (a staged commit that retries)."""
    try:
        step = advance()
        while True:
            try:
                if not files_durable:
                    sync_file_systems([os.path.dirname(step.log.io.strip(step.url))], folders_too=False)
                step.log.write_version(step.version, step.payload, sync_folder)
            except Exception as exc:  # noqa: BLE001 - the commit decides: a version taken is read, others re-raised
                step = steps.throw(exc)
            else:
                step = steps.send(None)
    except StopIteration as stop:
        return stop.value
