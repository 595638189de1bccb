"""The per-source checkpoint store: immutable, write-once metadata files plus retention.

Guarantees:

* a checkpoint file is created with put-if-absent and never overwritten; a reader
  sees either the whole file or none;
* ``write`` allocates the next id after every id on storage, so files left by a
  crashed run (written, never referenced by Spark's offset log) are never reused;
* retention deletes only ids strictly below the last *committed* id (the one
  Spark passes as the start of a new batch, which Spark will never replay) and
  keeps the newest ``retain`` of those at or below it: a file that Spark's
  offset log may still reference is never deleted.
"""

from __future__ import annotations

from flinkish_spark.checkpoint.layout import checkpoint_name, join, parse_checkpoint_name, source_dir
from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.checkpoint.serde import decode_source_checkpoint, encode_source_checkpoint
from flinkish_spark.errors import AlreadyExistsError, CheckpointMismatchError
from flinkish_spark.io.fileio import FileIO


class SourceCheckpointStore:
    def __init__(self, io: FileIO, root: str, uid: str, kind: str) -> None:
        self.io = io
        self.root = root
        self.uid = uid
        self.kind = kind
        self.directory = source_dir(root, uid)
        self._next_id: int | None = None

    def path(self, ckpt_id: int) -> str:
        return join(self.directory, checkpoint_name(ckpt_id))

    def ids(self) -> list[int]:
        ids = (parse_checkpoint_name(n) for n in self.io.list_names(self.directory))
        return sorted(i for i in ids if i is not None)

    def read(self, ckpt_id: int) -> SourceCheckpoint:
        path = self.path(ckpt_id)
        try:
            data = self.io.read_bytes(path)
        except FileNotFoundError:
            raise CheckpointMismatchError(
                f"Spark's offset log references checkpoint {ckpt_id} of source uid {self.uid!r}, "
                f"but {path} does not exist. The 'checkpoint' option must stay the same across "
                "restarts of a query, and its files must not be deleted by hand."
            ) from None
        ckpt = decode_source_checkpoint(data, path)
        if ckpt.uid != self.uid or ckpt.ckpt_id != ckpt_id:
            raise CheckpointMismatchError(
                f"{path} belongs to source uid {ckpt.uid!r} checkpoint {ckpt.ckpt_id}, "
                f"not to uid {self.uid!r} checkpoint {ckpt_id}; the metadata was moved or copied by hand"
            )
        if self.kind and ckpt.kind != self.kind:
            raise CheckpointMismatchError(
                f"source uid {self.uid!r} was checkpointed as a {ckpt.kind!r} source, but the query "
                f"now uses {self.kind!r} under the same uid. Give the new source its own uid."
            )
        return ckpt

    def latest(self) -> SourceCheckpoint | None:
        ids = self.ids()
        return self.read(ids[-1]) if ids else None

    def allocate_id(self) -> int:
        if self._next_id is None:
            ids = self.ids()
            self._next_id = (ids[-1] + 1) if ids else 0
        return self._next_id

    def write(self, ckpt: SourceCheckpoint) -> str:
        """Write ``ckpt`` (whose id came from :meth:`allocate_id`) exactly once."""
        path = self.path(ckpt.ckpt_id)
        try:
            self.io.write_exclusive(path, encode_source_checkpoint(ckpt))
        except AlreadyExistsError:
            self._next_id = None
            raise CheckpointMismatchError(
                f"checkpoint {ckpt.ckpt_id} of source uid {self.uid!r} was written by someone else "
                f"({path} appeared after this query listed the folder). Another query is running "
                "with the same 'checkpoint' and uid: stop it, or give this query its own uid."
            ) from None
        self._next_id = ckpt.ckpt_id + 1
        return path

    def retain(self, retain: int, committed_id: int) -> list[int]:
        """Delete checkpoints below ``committed_id`` beyond the newest ``retain``; return deleted ids."""
        ids = self.ids()
        at_or_below = [i for i in ids if i <= committed_id]
        keep_old = set(at_or_below[-retain:]) if retain > 0 else {committed_id}
        doomed = [i for i in at_or_below if i < committed_id and i not in keep_old]
        self.io.delete_many([self.path(i) for i in doomed])
        return doomed
