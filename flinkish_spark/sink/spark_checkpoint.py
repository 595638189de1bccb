"""A copy of Spark's own checkpoint next to the sink's metadata, so that a new machine continues the query.

Spark's ``checkpointLocation`` must be a local folder here (no S3A in the pyspark wheel), while the
flinkish metadata and the targets may be on an object store. When the driver's machine is lost, the
same query on another machine starts with an empty local folder: Spark would number batches from 0
and the restore checks refuse (``... checkpointLocation was deleted or replaced ...``). With the copy
the sink restores the folder before Spark reads it, and the query continues exactly once.

Layout: ``<root>/sinks/<uid>/spark/`` holds ``metadata`` (the Spark query id), ``offsets/<batch>``
(Spark's write-ahead log, copied byte for byte) and ``commits/<batch>`` (written by this module).

Protocol, for Spark's batch ``b`` in the sink's driver-side commit (after the lease is renewed):

1. *before the decision*: ``offsets/b`` (and ``metadata``, and the offsets of the last few batches
   if missing) are copied to the store. Hence every epoch with a decision has its offsets on the
   store: a restore replays it with the same offsets, so the source plans the same partitions (its
   write-ahead checkpoints) and the sink's per-epoch decision makes the replay commit what was decided.
2. *after the epoch is committed (marked done)*: ``commits/b`` is written to the store. Spark writes
   its local ``commits/b`` only after this commit returns, and the source's checkpoint-complete
   notification for ``b`` (slot advance, cleanup of finished input) comes after that, in the next
   ``latestOffset``. Hence the store's newest batch is either committed there (Spark goes on with
   ``b + 1``: the source plans it from ``b``'s checkpoint; a checkpoint an earlier run wrote for
   ``b + 1`` but never logged is ignored, see the source's write-ahead protocol) or not yet notified
   to the source (its replay reads input that is still there).

``commits/b`` is ``v1`` and ``{"nextBatchWatermarkMs": W}`` with ``W`` the watermark of batch
``b``'s offsets: the next batch's watermark, for the stateless queries this module serves, has no
effect on output. A query with state (a ``state`` folder) is not copied: its state store would be
needed too; its restart on another machine is refused as before.

Costs per epoch: one listing, two PUTs of a few hundred bytes; a DELETE of old entries every
``KEEP`` epochs. The restore (once, into an empty folder) is one listing and a GET per file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from typing import Mapping

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.io.fileio import FileIO, storage_options_from

#: Batches whose offsets and commits the copy keeps (Spark needs the last two offsets on restart).
KEEP = 10
_SPARK_LOGS = ("offsets", "commits")


def is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


def local_path(location: str) -> str:
    for prefix in ("file://", "file:"):
        if location.startswith(prefix):
            return location[len(prefix):]
    return location


def copy_wanted(location: str | None, root: str, option: bool | None) -> bool:
    """Whether a sink keeps the copy: ``option`` when given, else when Spark's checkpoint is a local
    folder and the sink's metadata root is not (the case where the two can be parted by a lost machine)."""
    if not location or not is_local(location):
        return False
    return option if option is not None else not is_local(root)


@dataclass(frozen=True)
class SparkCheckpointCopy:
    """The copy of one query's Spark checkpoint (local folder ``local``) under ``remote`` on ``io``."""

    io: FileIO
    remote: str
    local: str

    @classmethod
    def of_sink(cls, io: FileIO, sink_directory: str, location: str) -> "SparkCheckpointCopy":
        return cls(io, join(sink_directory, "spark"), local_path(location))

    @classmethod
    def for_uid(cls, io: FileIO, root: str, uid: str, location: str) -> "SparkCheckpointCopy":
        return cls.of_sink(io, join(root, "sinks", uid), location)

    def _stateful(self) -> bool:
        return os.path.isdir(os.path.join(self.local, "state"))

    def _read_local(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.local, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _remote_names(self) -> set[str]:
        base = self.io.strip(self.remote).rstrip("/") + "/"
        return {p[len(base):] for p in self.io.find(self.remote) if p.startswith(base)}

    def before_decision(self, batch: int) -> None:
        """Copy ``offsets/batch`` (overwritten: the run that decides the batch writes it), and what a restore
        also needs if it is missing: ``metadata``, the offsets of the previous batches kept."""
        if self._stateful():
            return
        offsets = self._read_local(f"offsets/{batch}")
        if offsets is None:
            return  # not Spark's batch numbering here (nothing to copy)
        have = self._remote_names()
        if "metadata" not in have:
            metadata = self._read_local("metadata")
            if metadata is not None:
                self.io.write_bytes(join(self.remote, "metadata"), metadata)
        for earlier in range(max(0, batch - 2), batch):  # Spark reads offsets/b-1 when it resumes at b
            if f"offsets/{earlier}" not in have:
                data = self._read_local(f"offsets/{earlier}")
                if data is not None:
                    self.io.write_bytes(join(self.remote, f"offsets/{earlier}"), data)
        self.io.write_bytes(join(self.remote, f"offsets/{batch}"), offsets)
        self._prune(have, batch)

    def after_commit(self, batch: int) -> None:
        """Record on the store that ``batch`` is committed (before Spark's local ``commits/batch``)."""
        if self._stateful():
            return
        offsets = self._read_local(f"offsets/{batch}")
        if offsets is None:
            return
        lines = offsets.decode().splitlines()
        watermark = int(json.loads(lines[1]).get("batchWatermarkMs", 0)) if len(lines) > 1 else 0
        self.io.write_bytes(join(self.remote, f"commits/{batch}"),
                            f"v1\n{json.dumps({'nextBatchWatermarkMs': watermark}, separators=(',', ':'))}".encode())

    def _prune(self, have: set[str], batch: int) -> None:
        old = [n for n in have if (b := _batch_of(n)) is not None and b < batch - KEEP]
        if len(old) >= KEEP:  # one request every KEEP epochs
            self.io.delete_many([join(self.remote, n) for n in sorted(old)])

    def restore(self) -> int:
        """Fill a local folder Spark has not started in (no ``metadata``: empty, missing, or a restore cut
        short) from the copy; the number of files written (0: nothing to do).

        ``metadata`` is written last, so a restore cut short is done again by the next start; Spark writes
        its ``metadata`` before any other file, so a folder without it holds nothing of Spark's.

        A folder that is *behind* the copy (:meth:`stale`: the machine came back after another one went on
        with the query) is moved aside to ``<folder>.stale-<epoch seconds>`` (kept, never deleted) and the
        copy restored in its place: the store, where every decision is, says where the query is."""
        names = sorted(self._remote_names(), key=lambda n: n == "metadata")
        if "metadata" not in names:
            return 0
        if os.path.exists(os.path.join(self.local, "metadata")):
            if not self.stale(names):
                return 0
            os.replace(self.local, f"{self.local.rstrip(os.sep)}.stale-{int(time.time())}")
        for name in names:
            target = os.path.join(self.local, *name.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.restoring")
            with open(tmp, "wb") as f:
                f.write(self.io.read_bytes(join(self.remote, name)))
            os.replace(tmp, target)
        return len(names)

    def stale(self, names: set[str] | list[str] | None = None) -> bool:
        """Whether the local folder (of the same Spark query) is behind the copy: the copy holds offsets of a
        batch after the folder's newest commit that the folder lacks or holds with other bytes -- batches
        another machine planned and decided. On the machine that wrote the copy this is never so: it copies
        its own offsets byte for byte, and only its one planned-not-committed batch may be missing there."""
        have = set(self._remote_names() if names is None else names)
        local_meta = self._read_local("metadata")
        if local_meta is None or "metadata" not in have:
            return False  # a folder Spark has not started in, or no copy
        if self.io.read_bytes(join(self.remote, "metadata")) != local_meta:
            return False  # another query's folder: not this module's to judge
        committed = [int(n) for n in _listdir(os.path.join(self.local, "commits")) if n.isdigit()]
        newest = max(committed, default=-1)
        for name in sorted(have):
            batch = _batch_of(name)
            if name.startswith("offsets/") and batch is not None and batch > newest:
                if self._read_local(name) != self.io.read_bytes(join(self.remote, name)):
                    return True
        return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _batch_of(name: str) -> int | None:
    log, _, batch = name.partition("/")
    return int(batch) if log in _SPARK_LOGS and batch.isdigit() else None


def restore_spark_checkpoint(checkpoint_location: str, checkpoint: str, uid: str,
                             options: Mapping[str, str] | None = None) -> int:
    """Fill Spark's empty local ``checkpoint_location`` from the copy the sink ``uid`` keeps under the metadata
    root ``checkpoint``, so that the query started next continues where the lost machine left it.

    Call it on the driver's machine before ``writeStream...start()``, with the sink's ``uid`` and
    ``checkpoint`` and its storage options (``endpointUrl``, ``region``, ``storageOptions``). A folder
    Spark has started in (it has ``metadata``) is left alone unless it is behind the copy (the machine
    came back after another one went on: it is moved aside to ``<folder>.stale-<seconds>``), and so is
    everything when there is no copy (a new query). Returns the number of files restored::

        flinkish_spark.restore_spark_checkpoint("/var/lib/app/spark", "s3://bucket/meta", "orders_sink")
        query = df.writeStream.format("flinkish.delta").option("uid", "orders_sink") \\
            .option("checkpoint", "s3://bucket/meta").option("checkpointLocation", "/var/lib/app/spark")...start()
    """
    if not is_local(checkpoint_location):
        return 0
    io = FileIO.for_url(checkpoint, storage_options_from(dict(options or {}), checkpoint), what="option 'checkpoint'")
    return SparkCheckpointCopy.for_uid(io, checkpoint, uid, checkpoint_location).restore()
