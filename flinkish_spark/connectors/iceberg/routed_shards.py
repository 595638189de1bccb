"""Merged shards in routed Iceberg targets: several source tables, one Iceberg table (:mod:`~flinkish_spark.connectors.lakehouse.shards`).

A merged target's epoch is one :class:`~flinkish_spark.connectors.lakehouse.shards.MergedEpoch`: one snapshot per
target per epoch holding every shard's rows, with the target's one ``flinkish.uid`` / ``flinkish.epoch`` marker -- a
restart finds the target with the epoch or commits all its shards. A truncate of one shard, or a re-snapshot's end,
takes only that shard's live rows (those whose ``_source_table`` is the shard), as the mode says (deleted by
position deletes, marked ``_deleted``, closed at the shard's truncate's time in history -- see
:func:`~flinkish_spark.connectors.lakehouse.shards.shard_close_times` --, kept): :func:`shard_gone`, part of the
same snapshot. Each shard's
re-snapshot keys are remembered apart. Cost: a truncate or a re-snapshot's end of a shard reads the
``_source_table`` column (and the key at 'E') of every live data file of its target.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flinkish_spark.connectors.iceberg.keyed import KeyedCommittable, Target, entries_of
from flinkish_spark.connectors.iceberg.lookup import LiveFiles
from flinkish_spark.connectors.lakehouse.resnapshot import ResnapshotKeys
from flinkish_spark.connectors.lakehouse.routes import SOURCE_TABLE
from flinkish_spark.connectors.lakehouse.shards import MergedEpoch, add_positions, shard_file_positions, shard_read_columns
from flinkish_spark.io.fileio import FileIO


def _positions(target: Target, table: Any, shard: str, seen: pa.Table | None) -> dict[str, np.ndarray]:
    """The live rows of ``shard`` (file -> positions); with ``seen``, only those whose key is not in it."""
    key = [k for k in target.plan.key if k != SOURCE_TABLE]
    live = LiveFiles(table)
    out: dict[str, np.ndarray] = {}
    for f in live.data:
        with target.io.fs.open(target.io.strip(f.path), "rb") as handle:
            rows = pq.read_table(handle, columns=shard_read_columns(key, seen))
        mine = shard_file_positions(rows, shard, key, seen, live.deleted(target.io, f))
        if len(mine):
            out[f.path] = mine
    return out


def resnapshot_name(identifier: str, shard: str) -> str:
    return f"{identifier}\0{shard}"


def shard_gone(t: MergedEpoch[Any], target: Target, table: Any, keyed: Sequence[tuple[str, KeyedCommittable]],
               io: FileIO, epoch: int, resnapshots: ResnapshotKeys | None, identifier: str, how: str
               ) -> dict[str, np.ndarray] | None:
    """The rows the epoch's truncates and re-snapshot ends of the shards take (``keyed``: each counted part's source
    table and its committable); None: none (or the mode keeps them)."""
    if how == "keep":
        return None
    gone: dict[str, np.ndarray] = {}
    for shard, st in t.shards.items():
        if st.truncate:
            add_positions(gone, _positions(target, table, shard, None))
        name = resnapshot_name(identifier, shard)
        if resnapshots is not None and (st.begin or st.end or resnapshots.active(name)):
            entries = [entries_of(k, io, epoch) for table_name, k in keyed if table_name == shard]
            seen = resnapshots.step(name, target.plan.key, entries, st.begin, st.end, epoch)
            if seen is not None:
                add_positions(gone, _positions(target, table, shard, seen))
    return gone or None


def finish_resnapshots(t: MergedEpoch[Any], identifier: str, resnapshots: ResnapshotKeys | None) -> None:
    if resnapshots is not None:
        for shard, st in t.shards.items():
            if st.end:
                resnapshots.finish(resnapshot_name(identifier, shard))
