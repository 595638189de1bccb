"""Compaction of a keyed Delta table: files that carry deletes, and small files, written again.

Merge-on-read leaves replaced rows in their files, marked by deletion vectors, and every
epoch adds a few small files: readers then read more rows and more files than the table
holds. Every ``compactEvery`` epochs, right after the epoch's commit, the sink rewrites

* every live file whose vector covers at least :data:`DELETED_FRACTION` of its rows, and
* every file smaller than a quarter of ``rowsPerFile`` (when there are at least two),

into new files without the deleted rows, sorted by key (so min/max statistics prune
lookups again), and commits ``remove`` (each old file with its vector) + ``add`` of the
new files with ``dataChange = false``: no row changes, only where rows live.

It never loses or duplicates a row under concurrent commits: it runs in the sink's own
commit call, so it cannot race the sink's own commits; when another writer takes the
version it wanted, it reads that commit, and if it touched any file being compacted (a
new vector, a remove -- another compaction) the compaction is abandoned and its files
deleted: rows it would re-add could have been deleted meanwhile. Other writers' keyed
commits must do the same in turn (delta-rs's conflict checker does: tested). Its files
live below the triggering epoch's folder; after a crash the epoch's cleanup removes
those the table does not name.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.delta.committables import delta_files
from flinkish_spark.connectors.delta.live import deleted_positions
from flinkish_spark.connectors.delta.log import VersionTaken, add_action, commit_payload
from flinkish_spark.connectors.delta.state import DeltaState, LiveFile
from flinkish_spark.connectors.delta.table import DATA_PREFIX, DeltaTarget
from flinkish_spark.connectors.lakehouse.files import epoch_dir, read_positions, small_file_rows, write_grouped
from flinkish_spark.connectors.lakehouse.routed_modes import conform
from flinkish_spark.errors import StorageUnavailableError
from flinkish_spark.faults import crash_point

log = logging.getLogger(__name__)

DELETED_FRACTION = 0.1
MAX_ATTEMPTS = 10


def choose(sink: DeltaTarget, state: DeltaState) -> list[LiveFile]:
    small = small_file_rows(sink.rows_per_file)
    heavy = []
    tiny = []
    for f in state.files.values():
        rows = f.num_records
        if rows is None:
            continue
        if f.dv is not None and f.dv.cardinality >= DELETED_FRACTION * rows:
            heavy.append(f)
        elif rows - f.deleted_rows < small:
            tiny.append(f)
    if len(tiny) < 2 and not heavy:
        return []
    return heavy + (tiny if len(tiny) >= 2 else [])


def compact(sink: DeltaTarget, state: DeltaState, epoch: int) -> int | None:
    """Compact now; the version written, or None when there was nothing to do or it was abandoned."""
    plan = sink.plan
    assert plan is not None
    chosen = choose(sink, state)
    if not chosen:
        return None
    read_version = state.version
    identity = {f.path: _dv_id(f) for f in chosen}
    pieces = []
    for f in chosen:
        rows = f.num_records or 0
        keep = np.setdiff1d(np.arange(rows, dtype=np.int64), deleted_positions(sink, f))
        url = f.relative_path if "://" in f.relative_path else sink.url(f.relative_path)
        # conform, not cast: a routed table's older files lack columns added since, or keep one the source dropped
        pieces.append(conform(read_positions(sink.io, url, keep), plan.table_schema))
    table = pa.concat_tables(pieces, promote_options="permissive").sort_by([(k, "ascending") for k in plan.key])
    token = uuid.uuid4().hex[:8]
    folder = epoch_dir(sink.path, DATA_PREFIX, sink.uid, epoch)
    written, _ = write_grouped(sink.io, folder, table, lambda i: f"compact-{token}-{i:04d}.parquet",
                               sink.partition_by, sink.rows_per_file, sink.target_file_size)  # per partition
    new_files = delta_files(sink.io, sink.path, [w for w, _ in written])
    now = int(time.time() * 1000)
    actions = [f.remove_action(now, data_change=False) for f in chosen]
    actions += [add_action(nf.path, nf.size, dict(nf.partition_values), nf.stats, now, data_change=False)
                for nf in new_files]
    info = {"flinkish.uid": sink.uid, "flinkish.compaction": epoch,
            "operationMetrics": {"numRemovedFiles": len(chosen), "numAddedFiles": len(new_files),
                                 "numRows": table.num_rows}}
    crash_point("delta.compaction.before_version")
    for _ in range(MAX_ATTEMPTS):
        version = state.version + 1
        payload = commit_payload(sink.uid, None, actions, info, read_version, blind=False, operation="OPTIMIZE")
        try:
            sink.log().write_version(version, payload)
        except VersionTaken:
            before = {p: i for p, i in identity.items()}
            state.catch_up(sink.log())
            still = all(p in state.files and _dv_id(state.files[p]) == i for p, i in before.items())
            if not still:
                log.info("flinkish.delta: compaction after epoch %d abandoned: a concurrent commit changed its files", epoch)
                sink.io.delete_many([sink.url(nf.path) for nf in new_files])
                return None
            continue
        except StorageUnavailableError:
            return None  # may have landed: the epoch's cleanup keeps the files only if the table names them
        crash_point("delta.compaction.after_version")  # the version is written, this process has not seen it
        state.apply(version, [json.loads(line) for line in payload.decode().splitlines() if line.strip()])
        return version
    sink.io.delete_many([sink.url(nf.path) for nf in new_files])
    return None


def _dv_id(f: LiveFile) -> str | None:
    return None if f.dv is None else f.dv.unique_id
