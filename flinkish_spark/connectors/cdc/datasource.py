"""What a CDC source's data source (``flinkish.postgres``, ``flinkish.mysql``) does the same way, whatever the database.

* **Read limit**: an epoch's snapshot chunks are bounded by ``snapshotRowsPerTrigger // splitSize`` (a chunk is
  read whole); changes by the enumerator's ``maxRowsPerTrigger``.
* **Tasks**: an epoch's chunks in at most ``snapshotPartitions`` tasks; the change range alone, or each of its
  pieces alone when its planning cut it at transaction boundaries (:func:`.change_split.epoch_pieces`: MySQL's
  ``changeReaders``).
* **The descriptor** (how the driver's finish rebuilds the source): the URL without its password, and
  ``passwordEnv`` kept (the base class drops option names that look secret).
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.cdc.change_split import epoch_pieces
from flinkish_spark.source.datasource import DESCRIPTOR_FILE, SplitDataSource
from flinkish_spark.source.planning import ReadRange, read_ranges


class CdcDataSource(SplitDataSource):
    """A CDC source's data source; subclasses set ``conn_info`` (with a password-free ``url``), ``split_size``,
    ``snapshot_rows_per_trigger`` and ``snapshot_partitions`` in ``configure``."""

    conn_info: Any
    split_size: int
    snapshot_rows_per_trigger: int | None
    snapshot_partitions: int

    def default_read_limit(self) -> ReadLimit:
        if self.snapshot_rows_per_trigger is not None:
            return ReadMaxFiles(max(1, self.snapshot_rows_per_trigger // self.split_size))
        return ReadAllAvailable()

    def group_ranges(self, ranges: list[ReadRange]) -> list[list[ReadRange]]:
        """An epoch's chunks in at most ``snapshotPartitions`` tasks (consecutive chunks each), changes alone.

        A task per chunk costs each chunk a Spark task, a Python worker round trip, a connection and an
        output file: with the default splitSize, most of the snapshot's time on two cores (see
        docs/benchmarks.md). A change range (or each piece of one: :meth:`epoch_ranges`) is a partition of its own.
        """
        chunks = [r for r in ranges if r.split_id.startswith("snapshot-")]
        groups: list[list[ReadRange]] = [[r] for r in ranges if not r.split_id.startswith("snapshot-")]
        n = min(self.snapshot_partitions, len(chunks))
        for i in range(n):
            groups.append(chunks[len(chunks) * i // n: len(chunks) * (i + 1) // n])
        return groups

    def epoch_ranges(self, checkpoint: SourceCheckpoint) -> list[ReadRange]:
        """The epoch's ranges, the change range cut into the pieces its planning recorded in the checkpoint."""
        return epoch_pieces(read_ranges(checkpoint), checkpoint.enumerator_state)

    def write_descriptor(self) -> None:
        """As the base class, but with the password masked out of the URL and 'passwordEnv' kept.

        The final notification rebuilds the source from this file in the driver's process: it connects
        with the password variable (PGPASSWORD, MYSQL_PWD) or the one 'passwordEnv' names.
        """
        options = {k: v for k, v in self.raw_options.items() if k not in ("storageOptions",)}
        options["url"] = self.conn_info.url  # the URL without its password
        cls = type(self)
        descriptor = {"class": f"{cls.__module__}:{cls.__qualname__}", "options": options}
        self.io.write_bytes(f"{self.checkpoint_store().directory}/{DESCRIPTOR_FILE}", json.dumps(descriptor).encode())
