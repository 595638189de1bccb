"""``flinkish.delta``: exactly-once writes to Delta Lake tables with delta-rs (no JVM jar).

``sink`` is the two-phase-commit sink and its ``writeStream`` data source, ``log`` the
``_delta_log`` writer its commits go through.
"""

from flinkish_spark.connectors.delta.sink import DeltaSink, DeltaSinkDataSource

__all__ = ["DeltaSink", "DeltaSinkDataSource"]
