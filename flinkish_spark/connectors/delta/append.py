"""``mode=append``: every epoch's rows added to the table as new data files, exactly once.

* **Prepare** (executors): each task writes its rows as Parquet data files straight into
  the table folder, below ``<path>/flinkish/<uid>/e<epoch>/[k=v/]``, and returns their
  Delta add actions (path, size, partition values, statistics). No log entry names the
  files yet, so no Delta reader sees them.
* **Commit** (driver, after the decision is recorded): one Delta transaction per epoch
  with every add action of the epoch and ``txn(appId = sink uid, version = epoch)`` --
  what Spark's own Delta streaming sink writes -- as a *blind append* through
  :mod:`flinkish_spark.connectors.delta.log` (O(1) per commit whatever the table's
  history). Tables whose protocol asks more of a writer (constraints, generated or
  identity columns, column mapping, row tracking, ...) are committed through delta-rs.
* **Idempotence**: the driver knows the table's ``txn`` version of the uid; when it is
  already >= the epoch, the commit answers ``ALREADY_COMMITTED`` without writing.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

import pyarrow as pa

from flinkish_spark.connectors.delta.committables import DeltaCommittable, DeltaFile, delta_files
from flinkish_spark.connectors.delta.log import StaleHead, TableChanged, add_action
from flinkish_spark.connectors.delta.table import DATA_PREFIX, DeltaTarget, committed_version, deltalake
from flinkish_spark.connectors.lakehouse.files import epoch_dir, write_files
from flinkish_spark.errors import StorageUnavailableError
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext

log = logging.getLogger(__name__)


def prepare_append(sink: DeltaTarget, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> DeltaCommittable | None:
    folder = epoch_dir(sink.path, DATA_PREFIX, sink.uid, ctx.epoch)
    written = write_files(sink.io, folder, batches, ctx, sink.partition_by, drop_partition_columns=True,
                          rows_per_file=sink.rows_per_file, target_file_size=sink.target_file_size)
    return DeltaCommittable(delta_files(sink.io, sink.path, written)) if written else None


def commit_append(sink: DeltaTarget, files: list[DeltaFile], epoch: int) -> CommitOutcome:
    for _ in range(3):
        head = sink._head()
        if head is not None and not sink.check_same_table():
            head = None  # another table is at the path now: its caches were dropped
        if head is None:
            # First commit in this process, or the table changed: read the table once.
            head = sink.set_head(sink.validate(False, "flinkish.delta commit"))
        if head.log.txn >= epoch:
            return "ALREADY_COMMITTED"  # from the same table as the head's: confirmed just above
        if not files:
            sink._committed_here = {epoch: frozenset()}
            return "COMMITTED"  # an empty epoch adds no version
        if not head.blind_append:
            return _commit_with_delta_rs(sink, files, epoch)
        now = int(time.time() * 1000)
        actions = [add_action(f.path, f.size, dict(f.partition_values), f.stats, now) for f in files]
        try:
            outcome = sink.log().append(head.log, sink.uid, epoch, actions, {"flinkish.uid": sink.uid, "flinkish.epoch": epoch})
        except (TableChanged, StaleHead):
            sink._forget_head()  # re-validate against the changed table, then append again
            continue
        except StorageUnavailableError:
            sink._forget_head()  # the put may have landed: the next attempt re-reads the log
            return "RETRY_LATER"
        if outcome == "COMMITTED":
            sink._committed_here = {epoch: frozenset(f.path for f in files)}
            after_append(sink, head.log.version)
        return outcome
    return "RETRY_LATER"


def after_append(sink: DeltaTarget, version: int) -> None:
    """Table maintenance on the versions that are multiples of its interval (O(live files) each).

    The epoch is committed already: a failure here is logged, not raised (the next
    interval tries again; readers only replay more commits meanwhile).
    """
    from deltalake.transaction import PostCommitHookProperties

    try:
        if sink.checkpoint_interval and version % sink.checkpoint_interval == 0:
            sink.table().create_checkpoint()
        if sink.compact_every and version % sink.compact_every == 0:
            sink.table().optimize.compact(post_commithook_properties=PostCommitHookProperties(create_checkpoint=False))
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("flinkish.delta: table maintenance after version %d of %s failed: %s", version, sink.path, exc)


def _commit_with_delta_rs(sink: DeltaTarget, files: list[DeltaFile], epoch: int) -> CommitOutcome:
    """The commit for tables whose protocol asks more of a writer than a blind append gives."""
    dl = deltalake()
    from deltalake.transaction import AddAction, CommitProperties, PostCommitHookProperties, Transaction

    table = sink.table()
    if committed_version(table, sink.uid) >= epoch:
        return "ALREADY_COMMITTED"
    now = int(time.time() * 1000)
    actions = [AddAction(f.path, f.size, dict(f.partition_values), now, True, f.stats) for f in files]
    try:
        table.create_write_transaction(
            actions, "append", sink.schema, list(sink.partition_by) or None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(sink.uid, epoch)],
                custom_metadata={"flinkish.uid": sink.uid, "flinkish.epoch": epoch},
                max_commit_retries=20),
            # Checkpoints are ours (checkpointInterval): delta-rs's default interval is 100.
            post_commithook_properties=PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False),
        )
    except dl.exceptions.CommitFailedError:
        # A commit of ours whose answer was lost, or conflicts beyond the retries:
        # the table's txn says which.
        sink._forget_head()
        if committed_version(sink.table(), sink.uid) >= epoch:
            return "ALREADY_COMMITTED"
        return "RETRY_LATER"
    sink._committed_here = {epoch: frozenset(f.path for f in files)}
    table.update_incremental()
    sink._forget_head()  # re-read with the table at the next commit
    after_append(sink, table.version())
    return "COMMITTED"


