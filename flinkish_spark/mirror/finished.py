"""Has this mirror ended for good? Answered from its metadata before Spark starts (milliseconds, not a minute).

A drained mirror (or a ``--stop-after-snapshot`` copy that finished) never reads again: started once more, the
query would only find that out after Spark's start. :func:`ended_before` says it from what the run left:

* Spark's own checkpoint (``offsets/N``, ``commits/N`` -- local, see ``--spark-checkpoint``): the last planned
  batch is committed, and its offset says the source is FINISHED. A planned final batch that is not committed
  yet is not the end: Spark must run (replay) it, so the answer is then "not ended";
* the source's replication slot, when it created one: dropped. The drop is the final "checkpoint complete"
  notification (:mod:`flinkish_spark.finish.notify`); when a crash came between the final commit and the drop,
  the next start of Spark delivers it, so the answer is then "not ended" too.

Anything unreadable or unreachable is "not ended": the normal start decides, as before.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from flinkish_spark.mirror.config import MirrorConfig

if TYPE_CHECKING:
    from flinkish_spark.source.offset import SourceOffset

DRAINED = ("finished: this mirror was drained before (its source has ended for good, the slot is dropped); "
           "nothing more to read. A new --uid starts a new mirror with a new snapshot")
COPIED = ("finished: every table was copied before (the source ended after its snapshot); nothing more to read. "
          "A new --uid (or a new --checkpoint) copies them again")


def _numbered(folder: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


def committed_offset(spark_checkpoint: str, uid: str) -> "SourceOffset | None":
    """Source ``uid``'s offset in the last batch Spark committed (None: none yet)."""
    from flinkish_spark.source.offset import SourceOffset

    committed = _numbered(os.path.join(spark_checkpoint, "commits"))
    if not committed:
        return None
    try:
        with open(os.path.join(spark_checkpoint, "offsets", str(committed[-1]))) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return next((o for o in map(SourceOffset.from_json, lines[2:]) if o is not None and o.uid == uid), None)


def ended_before(config: MirrorConfig) -> str | None:
    """The line to print when this mirror's metadata says it ended for good (see the module docstring), else
    None."""
    planned = _numbered(os.path.join(config.spark_checkpoint, "offsets"))
    if planned[-1:] != _numbered(os.path.join(config.spark_checkpoint, "commits"))[-1:]:
        return None  # the last planned batch is not committed: Spark runs (replays) it
    last = committed_offset(config.spark_checkpoint, config.uid)
    if last is None or not last.finished or _slot_left(config):
        return None
    return DRAINED if last.stop else COPIED


def _slot_left(config: MirrorConfig) -> bool:
    """Whether the replication slot the source created still exists (or that cannot be known)."""
    if config.source_kind != "postgres":  # MySQL: the position lives in the checkpoint only
        return False
    from flinkish_spark.checkpoint.layout import join
    from flinkish_spark.connectors.postgres.connection import ConnectionInfo, connect, parse_url
    from flinkish_spark.connectors.postgres.slot import Ownership, slot_info
    from flinkish_spark.io.fileio import FileIO, storage_options_from

    try:
        root = config.checkpoint.rstrip("/")
        io = FileIO.for_url(root, storage_options_from(dict(config.source_extra), root), what="--checkpoint")
        owned = Ownership.read(io, join(root, "sources", config.uid))
        if owned is None or not owned.slot_created:
            return False
        info = parse_url(config.source_url, dict(config.source_extra).get("passwordEnv"))
        if config.source_password is not None:
            info = ConnectionInfo(info.url, None, config.source_password)
        with connect(info, autocommit=True, connect_timeout=10) as conn:
            return slot_info(conn, owned.slot)[0] != "missing"
    except Exception:  # noqa: BLE001 - unknown: let the normal start decide
        return True
