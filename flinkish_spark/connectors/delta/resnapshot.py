"""A re-snapshot (``_op`` 'B' ... 'E' after a lost slot) applied to a keyed Delta table.

The keys the re-snapshot delivered are remembered by
:class:`~flinkish_spark.connectors.lakehouse.resnapshot.ResnapshotKeys` (format-independent,
in the sink's metadata); in the version of the epoch holding 'E' every live row of the table
whose key is not among them is deleted with deletion vectors, as any replaced row -- part of the
epoch's one Delta version (txn of the uid), so exactly once.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow.parquet as pq

from flinkish_spark.connectors.delta.committables import KeyedCommittable
from flinkish_spark.connectors.delta.live import deleted_positions
from flinkish_spark.connectors.delta.state import DeltaState
from flinkish_spark.connectors.delta.table import DeltaTarget
from flinkish_spark.connectors.lakehouse.resnapshot import ResnapshotKeys, positions_not_in


class Resnapshots(ResnapshotKeys):
    """The re-snapshots under way for the Delta targets of one sink uid (by table path)."""

    def step_delta(self, target: DeltaTarget, state: DeltaState, begin: bool, end: bool,
                   keyed: Sequence[KeyedCommittable], epoch: int) -> dict[str, np.ndarray] | None:
        """Remember the epoch's keys; at the end, the live rows to delete (table file -> positions)."""
        assert target.plan is not None
        key = target.plan.key
        entries = [k.entries_table(target.io, target.path, epoch) for k in keyed]
        seen_keys = self.step(target.path, key, entries, begin, end, epoch)
        if seen_keys is None:
            return None
        gone: dict[str, np.ndarray] = {}
        for f in state.files.values():
            url = f.relative_path if "://" in f.relative_path or f.relative_path.startswith("/") else target.url(f.relative_path)
            with target.io.fs.open(target.io.strip(url), "rb") as handle:
                keys_of_file = pq.read_table(handle, columns=list(key))
            positions = (np.arange(keys_of_file.num_rows, dtype=np.int64) if seen_keys.num_columns == 0
                         else positions_not_in(keys_of_file, seen_keys))
            positions = np.setdiff1d(positions, deleted_positions(target, f))
            if len(positions):
                gone[f.path] = positions
        return gone
