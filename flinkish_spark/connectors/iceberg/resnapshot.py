"""A re-snapshot's end (``_op`` 'E') in a keyed Iceberg table: the live rows whose key it did not deliver.

The keys come from :class:`~flinkish_spark.connectors.lakehouse.resnapshot.ResnapshotKeys`;
the rows found here are deleted in the snapshot of the epoch holding 'E' (position deletes,
or rewritten files with ``copyOnWrite``: :func:`~.keyed.plan_epoch`'s ``gone``), so exactly once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flinkish_spark.connectors.iceberg.keyed import Target
from flinkish_spark.connectors.iceberg.lookup import LiveFiles
from flinkish_spark.connectors.lakehouse.resnapshot import positions_not_in


def gone_rows(target: Target, table: Any, seen: pa.Table) -> dict[str, np.ndarray]:
    """Per live data file of ``table``: the positions of its live rows whose key ``seen`` does not hold."""
    key = list(target.plan.key)
    live = LiveFiles(table)
    gone: dict[str, np.ndarray] = {}
    for f in live.data:
        with target.io.fs.open(target.io.strip(f.path), "rb") as handle:
            keys = pq.read_table(handle, columns=key)
        positions = (np.arange(keys.num_rows, dtype=np.int64) if seen.num_columns == 0
                     else positions_not_in(keys, seen))
        positions = np.setdiff1d(positions, live.deleted(target.io, f))
        if len(positions):
            gone[f.path] = positions
    return gone
