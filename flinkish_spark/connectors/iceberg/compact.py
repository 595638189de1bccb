"""Compaction of a merge-on-read table: data files with position deletes written again without the
deleted rows, so readers stop merging (option ``compactEvery``: after every N-th epoch).

One ``replace`` snapshot removes the rewritten data files and every delete file whose rows
all point at them (or at files no longer live), and adds the compacted files. It carries
the epoch's ``flinkish.uid``/``flinkish.epoch`` (and ``flinkish.compaction``), so the
epoch's cleanup keeps its files and recovery reads the same epoch as committed.

**Racing commits lose nothing, duplicate nothing**: the snapshot asserts that ``main``
still points at the snapshot the compaction read. A commit that landed in between (ours,
or another writer's) makes it fail; the compaction deletes what it wrote and plans again
on the new snapshot. A keyed commit that planned before a compaction landed is refused the
same way and looks its keys up again. So no delete is ever applied to a file it was not
computed for, and no rewritten file is committed without the deletes made since.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.connectors.iceberg.commit import Changes, commit_snapshot
from flinkish_spark.connectors.iceberg.datafiles import to_data_file, write_data_files
from flinkish_spark.connectors.iceberg.deletes import read_positions
from flinkish_spark.connectors.iceberg.routed_target import table_arrow
from flinkish_spark.connectors.lakehouse.routed_modes import conform
from flinkish_spark.connectors.iceberg.keyed import Target
from flinkish_spark.connectors.iceberg.lookup import LiveFiles
from flinkish_spark.faults import crash_point
from flinkish_spark.sink.protocol import PrepareContext

log = logging.getLogger(__name__)

COMPACTION_PROPERTY = "flinkish.compaction"
ATTEMPTS = 5


def plan(target: Target, table: Any, epoch: int) -> tuple[Changes, list[str]] | None:
    """The rewrite of every live data file that has deletes (None: nothing to compact), and the files written."""
    live = LiveFiles(table)
    affected = {f.path: f for f in live.data if live.deletes_for(f)}
    if not affected:
        return None
    live_paths = {f.path for f in live.data}
    new: list[Any] = []
    removed: dict[str, set[str]] = {}
    try:
        for path, f in affected.items():
            gone = read_positions(target.io, live.deletes_for(f))
            gone = gone.filter(pc.equal(gone["file_path"], path))["pos"].to_numpy()
            with target.io.fs.open(target.io.strip(path), "rb") as handle:
                data = pq.read_table(handle)
            keep = np.ones(data.num_rows, dtype=bool)
            keep[gone.astype(np.int64)] = False
            # in the table's columns: a file written before a column was added lacks it
            rest = conform(data.filter(pa.array(keep)), table_arrow(table.schema()))
            if rest.num_rows:
                ctx = PrepareContext(target.uid, epoch, 99997, 0)
                files = write_data_files(target.io, target.info, target.uid, iter(rest.to_batches()), ctx,
                                         target.partition_by, target.rows_per_file, target.target_file_size)
                new += [to_data_file(x, f.entry.data_file.spec_id or 0) for x in files]
            removed.setdefault(f.manifest, set()).add(path)
        for d in live.deletes:
            referenced = set(read_positions(target.io, [d.path])["file_path"].unique().to_pylist())
            if all(p in affected or p not in live_paths for p in referenced):
                removed.setdefault(d.manifest, set()).add(d.path)
    except BaseException:
        target.io.delete_many([f.file_path for f in new])
        raise
    return Changes(data_files=new, removed={m: frozenset(p) for m, p in removed.items()}, rewrite=True), \
        [f.file_path for f in new]


def compact(target: Target, catalog: Any, table: Any, load: Callable[[], Any], epoch: int, properties: dict[str, str],
            retain: int, protect_property: str, delete_files: Callable[[list[str]], None]) -> bool:
    """Compact ``table`` (re-read with ``load`` after a refused commit); False when racing commits won every time."""
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(ATTEMPTS):
        planned = plan(target, table, epoch)
        if planned is None:
            return True
        changes, written = planned
        crash_point("iceberg.compaction.before_snapshot")  # the rewritten files written, no snapshot names them
        try:
            commit_snapshot(catalog, table, changes, table.metadata.default_spec_id,
                            {**properties, COMPACTION_PROPERTY: "true"}, retain=retain,
                            protect_property=protect_property, delete_files=delete_files)
            return True
        except CommitFailedException:
            delete_files(written)
            time.sleep(min(0.05 * 2 ** attempt, 1.0))
            table = load()
    log.warning("flinkish.iceberg: compaction after epoch %d lost %d races with other commits; the next one retries",
                epoch, ATTEMPTS)
    return False
