"""Checkpoint metadata roots for tests that need no Spark: written through the project's own modules
(the checkpoint store, the tables registry), as a source would have left them."""

from __future__ import annotations

import json
from typing import Iterable

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc.registry import Registry, TableEntry
from flinkish_spark.io.fileio import FileIO


def postgres_source(io: FileIO, root: str, uid: str, tables: Iterable[str] | None, startup: str = "initial",
                    finished: bool = False) -> SourceCheckpoint:
    """A ``flinkish.postgres`` source's newest checkpoint: with ``tables`` (``schema.table`` names) a
    multi-table source whose registry follows them, streaming; with None a single-table source."""
    store = SourceCheckpointStore(io, root, uid, kind="flinkish.postgres")
    state: dict[str, object] = {"generation": 0, "started": True, "snapshot_done": True, "changes_discovered": True}
    if tables is not None:
        names = list(tables)
        parts = [n.split(".", 1) for n in names]
        entries = [TableEntry(i, 16000 + i, schema, table, "streaming") for i, (schema, table) in enumerate(parts)]
        state["registry"] = registry.write(io, store.directory, Registry().with_entries(entries, len(names)))
        config = {"tables": ", ".join(names), "startup": startup}
    else:
        config = {"table": "public.orders", "startup": startup}
    ckpt_id = store.allocate_id()
    splits = (SplitRecord("changes-0", 0, 10, 10 if finished else None, finished, ckpt_id if finished else None),)
    ckpt = SourceCheckpoint(uid, "flinkish.postgres", ckpt_id, ckpt_id - 1 if ckpt_id else None, 0,
                            json.dumps(config), json.dumps(state).encode(), finished, splits)
    store.write(ckpt)
    return ckpt
