"""Compaction of a merge-on-read table (option ``compactEvery``: after every N-th epoch): data files
with position deletes, and small data files, written again, so readers stop merging deletes and the
number of live files stays bounded.

Chosen per partition spec and partition (:func:`choose`, the rule of the Delta compaction,
:mod:`flinkish_spark.connectors.delta.compaction`):

* every live data file that a position delete file applies to, and
* the files smaller than a quarter of ``rowsPerFile`` when there are two or more of them (or
  a file with deletes to merge them into) -- without this, every epoch that changes a table
  leaves one more small file, and a mirror running for months reads thousands of them.

Their live rows are merged, sorted by key (the files' min/max bounds let the key lookup skip
them again), and written in files of at most ``rowsPerFile`` rows. So after a compaction a
table holds at most ~4 files per ``rowsPerFile`` of its rows plus one per partition, and each
snapshot until the next adds its own few.

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
from flinkish_spark.connectors.lakehouse.files import small_file_rows
from flinkish_spark.connectors.lakehouse.routed_modes import conform
from flinkish_spark.connectors.iceberg.keyed import Target
from flinkish_spark.connectors.iceberg.lookup import LiveFile, LiveFiles
from flinkish_spark.faults import crash_point
from flinkish_spark.sink.protocol import PrepareContext

log = logging.getLogger(__name__)

COMPACTION_PROPERTY = "flinkish.compaction"
ATTEMPTS = 5


def choose(target: Target, live: LiveFiles) -> list[list[LiveFile]]:
    """The live data files to write again, in groups of one partition spec and partition: every file with
    deletes, and the files smaller than a quarter of ``rowsPerFile`` when there are two or more of them in the
    group, or a file with deletes to merge them into."""
    small = small_file_rows(target.rows_per_file)
    groups: dict[tuple[int, tuple[Any, ...]], tuple[list[LiveFile], list[LiveFile]]] = {}
    for f in live.data:
        with_deletes, tiny = groups.setdefault((f.spec_id, f.partition), ([], []))
        if live.deletes_for(f):
            with_deletes.append(f)
        elif int(f.entry.data_file.record_count) < small:
            tiny.append(f)
    return [with_deletes + (tiny if len(tiny) >= 2 or with_deletes else [])
            for with_deletes, tiny in groups.values() if with_deletes or len(tiny) >= 2]


def plan(target: Target, table: Any, epoch: int) -> tuple[Changes, list[str]] | None:
    """The rewrite of the chosen live data files (None: nothing to compact), and the files written."""
    live = LiveFiles(table)
    groups = choose(target, live)
    if not groups:
        return None
    chosen = {f.path for group in groups for f in group}
    live_paths = {f.path for f in live.data}
    schema = table_arrow(table.schema())
    key = [(k, "ascending") for k in target.plan.key if k in schema.names]
    new: list[Any] = []
    removed: dict[str, set[str]] = {}
    try:
        for group in groups:
            pieces = []
            for f in group:
                with target.io.fs.open(target.io.strip(f.path), "rb") as handle:
                    data = pq.read_table(handle)
                deletes = live.deletes_for(f)
                if deletes:
                    gone = read_positions(target.io, deletes)
                    gone = gone.filter(pc.equal(gone["file_path"], f.path))["pos"].to_numpy()
                    keep = np.ones(data.num_rows, dtype=bool)
                    keep[gone.astype(np.int64)] = False
                    data = data.filter(pa.array(keep))
                # in the table's columns: a file written before a column was added lacks it
                pieces.append(conform(data, schema))
                removed.setdefault(f.manifest, set()).add(f.path)
            # sorted by key: the merged files' min/max bounds let the key lookup skip them again
            rest = pa.concat_tables(pieces).sort_by(key) if key else pa.concat_tables(pieces)
            if rest.num_rows:
                ctx = PrepareContext(target.uid, epoch, 99997, 0)
                files = write_data_files(target.io, target.info, target.uid, iter(rest.to_batches()), ctx,
                                         target.partition_by, target.rows_per_file, target.target_file_size)
                new += [to_data_file(x, group[0].spec_id) for x in files]
        for d in live.deletes:
            referenced = set(read_positions(target.io, [d.path])["file_path"].unique().to_pylist())
            if all(p in chosen or p not in live_paths for p in referenced):
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
