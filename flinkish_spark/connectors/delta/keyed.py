"""``mode=upsert|history``: an epoch's changes applied by key with deletion vectors, exactly once.

* **Prepare** (executors): a task checks its rows (:func:`check_rows`), resolves them by
  key (:func:`resolve_task`: the last change per key, or every version), writes the rows
  the table will hold sorted by key as Parquet files below ``flinkish/<uid>/e<epoch>/``,
  and returns a :class:`KeyedCommittable`: the files and the task's *entries* (its keys,
  the order of their changes, where their rows are) -- above 1 MiB in a file beside the data
  files that the committable names (:mod:`flinkish_spark.connectors.lakehouse.entries_file`).
* **Commit** (driver, after the decision is recorded): the epoch's entries are resolved
  across tasks, the changed keys are looked up in the table's live files
  (:class:`KeyLookup`: positions of the rows they replace), and one Delta version is
  written with put-if-absent: the new files (``add``), for every table file holding a
  replaced row ``remove`` (its old deletion vector) + ``add`` (same path, the old vector
  united with the new positions) -- or, with ``mergeMode=copyOnWrite``, the file rewritten
  without them -- rows copied with columns changed (soft deletes, closed history
  versions) in one more file, and ``txn(appId = uid, version = epoch)``. Also an epoch
  that changes nothing writes its version: the txn says it is done. The commit yields its
  version write (:func:`keyed_steps`): written at once, or -- the tables of a routed epoch on a
  local disk -- staged behind one sync of the file system (:mod:`.version_writes`).
* **Exactly once**: before each attempt the sink reads the commits written since its
  state (:class:`DeltaState`) and answers ``ALREADY_COMMITTED`` when the txn of its uid
  is >= the epoch -- a replay, or a commit of ours whose answer was lost. When another
  writer took the version (the put-if-absent failed), its commit is read and the
  lookup is done again against the new version: positions are never applied to a state
  they were not computed on (Delta's conflict rule for a read-modify-write, taken
  literally: any concurrent commit means a new read).
* **Files the commit writes itself** (the DV file, copies, rewrites) are below the
  epoch's folder under names that are the same in every attempt of the epoch (so a
  later attempt overwrites, never orphans); cleanup keeps those the table names now and
  those the epoch's version named (a compaction right after it may have removed some,
  but a reader of that version still reads them).

Every ``compactEvery`` epochs (a routed target: every ``compactEvery`` versions of the table, at its
own offset) the commit is followed by a compaction
(:mod:`flinkish_spark.connectors.delta.compaction`); every ``checkpointInterval``
versions by a checkpoint, written from the commit's state
(:mod:`flinkish_spark.connectors.delta.checkpoint`: no listing of the log, whose length grows
with the table's history).
"""

from __future__ import annotations

import logging
import uuid
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.delta.checkpoint import write_checkpoint
from flinkish_spark.connectors.delta.committables import KeyedCommittable, delta_files
from flinkish_spark.connectors.delta.compaction import compact
from flinkish_spark.connectors.delta.epoch_commit import EpochCommit, EpochExtra
from flinkish_spark.connectors.delta.live import forget_state, remember_dv, table_state
from flinkish_spark.connectors.delta.log import StaleHead, TableChanged, VersionTaken, stored_files
from flinkish_spark.connectors.delta.state import DeltaState
from flinkish_spark.connectors.delta.table import DATA_PREFIX, DeltaTarget
from flinkish_spark.connectors.delta.version_writes import Steps, VersionWrite, write_now
from flinkish_spark.connectors.lakehouse.changes import check_rows
from flinkish_spark.connectors.lakehouse.entries_file import SUFFIX, store_entries
from flinkish_spark.connectors.lakehouse.files import epoch_dir, write_grouped
from flinkish_spark.connectors.lakehouse.resolve import resolve_epoch
from flinkish_spark.connectors.lakehouse.resolve_task import E_POS, resolve_task
from flinkish_spark.errors import StorageUnavailableError
from flinkish_spark.faults import crash_point, fail_point
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 20


def prepare_keyed(sink: DeltaTarget, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> KeyedCommittable | None:
    plan = sink.plan
    assert plan is not None
    got = [b for b in batches if b.num_rows]
    if not got:
        return None
    table = pa.Table.from_batches(got)
    check_rows(plan, table, f"flinkish.delta sink uid {sink.uid!r}")
    resolved = resolve_task(plan, table)
    rows = resolved.rows.cast(plan.table_schema)
    token = uuid.uuid4().hex[:8]
    folder = epoch_dir(sink.path, DATA_PREFIX, sink.uid, ctx.epoch)
    written, order = write_grouped(sink.io, folder, rows,
                                   lambda i: f"{ctx.partition_id:05d}-{ctx.attempt}-{token}-{i:04d}.parquet",
                                   sink.partition_by, sink.rows_per_file, sink.target_file_size)
    entries = resolved.entries
    if order is not None:  # a partitioned routed target: the rows were grouped by partition, so are the positions
        at = np.empty(len(order), dtype=np.int64)
        at[order] = np.arange(len(order))
        pos = np.asarray(entries.column(E_POS).to_numpy(), dtype=np.int64)
        moved = np.where(pos >= 0, at[np.maximum(pos, 0)], pos)
        entries = entries.set_column(entries.schema.get_field_index(E_POS), E_POS, pa.array(moved, pa.int64()))
    # Large entries go to a file named like the data files (unique to this prepare: a replay never
    # overwrites the one a decision names), written before the committable exists.
    root = sink.io.strip(sink.path).rstrip("/") + "/"
    relative = f"{sink.io.strip(folder)[len(root):]}/{ctx.partition_id:05d}-{ctx.attempt}-{token}{SUFFIX}"
    inline, entries_file = store_entries(sink.io, sink.path, relative, entries)
    fail_point("sink.write", attempt=ctx.attempt)
    return KeyedCommittable(ctx.partition_id, delta_files(sink.io, sink.path, [w for w, _ in written]),
                            tuple(s for _, s in written), inline, entries_file)


def commit_keyed(sink: DeltaTarget, committables: list[KeyedCommittable], epoch: int,
                 extra: Callable[[DeltaState], EpochExtra] | None = None) -> CommitOutcome:
    """``extra``: computed against each attempt's state (routing: a new schema, a truncate, a re-snapshot's end)."""
    return write_now(keyed_steps(sink, committables, epoch, extra), sink.sync_version_folder)


def keyed_steps(sink: DeltaTarget, committables: list[KeyedCommittable], epoch: int,
                extra: Callable[[DeltaState], EpochExtra] | None = None, staged: bool = False) -> Steps:
    """The keyed commit, yielding its version where it is written (:mod:`.version_writes`: at once, or staged
    with other tables' behind one sync of the file system -- ``staged``: then the files the commit writes
    itself, its deletion vectors, need no fsync of their own)."""
    plan = sink.plan
    assert plan is not None
    changes = None
    for _ in range(MAX_ATTEMPTS):
        try:
            state = table_state(sink)
        except StorageUnavailableError:
            return "RETRY_LATER"
        if state.txn(sink.uid) >= epoch:
            return "ALREADY_COMMITTED"  # table_state() confirmed that the state is of the table on storage
        if changes is None:
            # Read once the table is known not to hold the epoch: a table that does (a recovered commit)
            # needs no entries, and its entries file may be cleaned up already.
            try:
                entries = [(c.partition, c.entries_table(sink.io, sink.path, epoch)) for c in committables]
                changes = resolve_epoch(plan, entries)
            except StorageUnavailableError:
                return "RETRY_LATER"
        more = extra(state) if extra is not None else None
        built = EpochCommit(sink, state, changes, committables, epoch, more).build(durable_files=not staged)
        version = state.version + 1
        try:
            passed = sink.log().behind_checkpoint(version, sink.log().last_checkpoint())
            if passed is not None:
                state.apply(version, passed)  # a version we had not seen: read again and redo
                continue
            yield VersionWrite(sink.log(), version, built.payload)
        except VersionTaken:
            continue  # another writer's commit: read it, then look the keys up again
        except (StaleHead, TableChanged):
            forget_state(sink)
            continue
        except StorageUnavailableError:
            forget_state(sink)  # the put may have landed: the next attempt reads the log again
            return "RETRY_LATER"
        state.apply(version, built.actions, validated=version)  # a metaData action of ours is validated
        sink._committed_here = {epoch: frozenset(stored_files(built.actions))}
        for (path, unique_id), positions in built.vectors.items():
            remember_dv(sink, path, unique_id, positions)
        crash_point("delta.keyed.after_version")
        after_keyed(sink, state, version, epoch)
        return "COMMITTED"
    return "RETRY_LATER"


def after_keyed(sink: DeltaTarget, state: DeltaState, version: int, epoch: int) -> None:
    """Compaction every ``compactEvery`` epochs (a routed target: versions, at its offset --
    :meth:`~flinkish_spark.connectors.delta.table.DeltaTarget.compaction_due`), a checkpoint every
    ``checkpointInterval`` versions (at the target's
    :attr:`~flinkish_spark.connectors.delta.table.DeltaTarget.checkpoint_offset`).

    The epoch is committed already: a failure here is logged, not raised.
    """
    try:
        if sink.compaction_due(version, epoch):
            compacted = compact(sink, state, epoch)
            if compacted is not None:
                version = compacted
        if sink.checkpoint_due(version) and not write_checkpoint(sink.log(), state, version):
            sink.table().create_checkpoint()  # a state the sink cannot checkpoint from (checkpoint.py)
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("flinkish.delta: table maintenance after epoch %d of %s failed: %s", epoch, sink.path, exc)


