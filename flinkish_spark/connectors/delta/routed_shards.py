"""Merged shards in routed Delta targets: several source tables, one Delta table (:mod:`~flinkish_spark.connectors.lakehouse.routes`).

* **Prepare** (executors): a shard's rows get the column ``_source_table`` (``schema.table``) and its schema the
  shard schema (:func:`~flinkish_spark.connectors.lakehouse.routes.shard_schema`: keyed by the key and
  ``_source_table`` unless keys are unique across shards) -- :func:`shard_tables`; from there the keyed prepare
  writes its files below the target as for any table.
* **Commit** (driver): the epoch's parts of every shard of a target are **one** :class:`MergedEpoch` -- one Delta
  version per target per epoch holding every shard's rows, with the one ``txn(appId = uid, version = epoch)`` that
  makes the target's commit idempotent: a restart finds the target at the epoch or commits all its shards. Keyed by
  ``_source_table``, two shards' rows never share a key, so the shards' keyed parts apply together in any order.
* **Truncate, re-snapshot** of one shard take only that shard's rows: the live rows whose ``_source_table`` is the
  shard (read from the target's files) are gone as the mode says (deleted, marked ``_deleted``, kept) --
  :func:`merged_extra`; a shard's re-snapshot keys are remembered apart from the other shards'. With keys unique
  across shards, a row belongs to the shard that wrote it last.
* **Schema**: the shards' schemas are the target's evolution steps, one shard after the other; each as a snapshot
  schema, so a shard's column narrower than the target's (another shard widened it) fits and is written as is; a
  column one shard added is the target's, null in the other shards' rows; another kind of type is the routed sink's
  stop naming the fix. Shards with different key columns, or of different modes, stop before anything is written.
* **Modes**: every mode, one for all the shards of a target (else refused, naming the shards). History: a truncated
  shard's current versions close at its truncate's time -- the rows it took and its keys the epoch writes again,
  none of another shard's (:func:`~flinkish_spark.connectors.lakehouse.shards.shard_close_times`); a re-snapshot's
  end closes the shard's undelivered keys at the epoch's newest change of the target. All in the one version.
* **Cost**: a truncate or a re-snapshot's end of a shard reads the ``_source_table`` column (and the key at 'E') of
  every live file of its target; nothing more otherwise.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flinkish_spark.connectors.delta.epoch_commit import EpochExtra
from flinkish_spark.connectors.delta.evolve import RoutedDeltaTarget, schema_actions
from flinkish_spark.connectors.delta.live import deleted_positions
from flinkish_spark.connectors.delta.resnapshot import Resnapshots
from flinkish_spark.connectors.delta.state import DeltaState
from flinkish_spark.connectors.lakehouse.routed_modes import close_time_us, gone_rows_as
from flinkish_spark.connectors.lakehouse.routes import SOURCE_TABLE
from flinkish_spark.connectors.lakehouse.shards import (
    MergedEpoch, add_positions, label, merged_tables, shard_close_times, shard_file_positions, shard_read_columns,
    shard_tables,
)

__all__ = ["MergedEpoch", "finish_resnapshots", "label", "merged_extra", "merged_tables", "shard_tables"]


def _shard_positions(target: RoutedDeltaTarget, state: DeltaState, shard: str, seen: pa.Table | None) -> dict[str, np.ndarray]:
    """The live rows of ``shard`` in the target (file -> positions); with ``seen``, only those whose key is not in it."""
    assert target.plan is not None
    key = [k for k in target.plan.key if k != SOURCE_TABLE]
    out: dict[str, np.ndarray] = {}
    for f in state.files.values():
        url = f.relative_path if "://" in f.relative_path or f.relative_path.startswith("/") else target.url(f.relative_path)
        with target.io.fs.open(target.io.strip(url), "rb") as handle:
            rows = pq.read_table(handle, columns=shard_read_columns(key, seen))
        mine = shard_file_positions(rows, shard, key, seen, deleted_positions(target, f))
        if len(mine):
            out[f.path] = mine
    return out


def resnapshot_key(target: RoutedDeltaTarget, shard: str) -> str:
    return f"{target.path}\0{shard}"


def merged_extra(t: MergedEpoch[Any], target: RoutedDeltaTarget, evolution: Any, created: bool, epoch: int,
                 resnapshots: Resnapshots | None) -> Callable[[DeltaState], EpochExtra]:
    """What the target's one version adds for its shards: the evolved schema, and each truncated or re-snapshotted
    shard's rows gone as the mode says (only that shard's)."""
    how = gone_rows_as(target.mode)

    def extra(state: DeltaState) -> EpochExtra:
        before = () if created else schema_actions(target, state, evolution)
        gone: dict[str, np.ndarray] = {}
        if how != "keep":
            for shard, st in t.shards.items():
                if st.truncate and not created:  # a target created now holds nothing to truncate
                    add_positions(gone, _shard_positions(target, state, shard, None))
                name = resnapshot_key(target, shard)
                if resnapshots is not None and (st.begin or st.end or resnapshots.active(name)):
                    assert target.plan is not None
                    entries = [k.entries_table(target.io, target.path, epoch) for k in st.keyed()]
                    seen = resnapshots.step(name, target.plan.key, entries, st.begin, st.end, epoch)
                    if seen is not None:
                        add_positions(gone, _shard_positions(target, state, shard, seen))
        at = close_time_us(t.parts, False)  # a re-snapshot's end; a truncated shard's rows close at its own time
        by_shard = shard_close_times(t) if how == "close" and not created else ()
        return EpochExtra(tuple(before), False, gone or None, how, close_us=at, routed=True, shard_close_us=by_shard)

    return extra


def finish_resnapshots(t: MergedEpoch[Any], target: RoutedDeltaTarget, resnapshots: Resnapshots | None) -> None:
    """After the target's version: forget the re-snapshots the epoch ended."""
    if resnapshots is not None:
        for shard, st in t.shards.items():
            if st.end:
                resnapshots.finish(resnapshot_key(target, shard))
