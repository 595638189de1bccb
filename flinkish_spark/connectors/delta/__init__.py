"""``flinkish.delta``: exactly-once writes to Delta Lake tables with delta-rs (no JVM jar).

``sink`` wires the two-phase-commit sink and its ``writeStream`` data source; ``append``
and ``keyed`` are its two commits (``mode=append``; ``mode=upsert|history`` with deletion
vectors); ``table`` validates and creates the table; ``log`` writes ``_delta_log``
versions; ``state`` replays the log's live files (with their deletion vectors);
``deletion_vectors`` is the DV codec and file; ``compaction`` rewrites files with deletes.
"""

from flinkish_spark.connectors.delta.sink import DeltaSink, DeltaSinkDataSource

__all__ = ["DeltaSink", "DeltaSinkDataSource"]
