"""``flinkish.iceberg``: exactly-once writes to Apache Iceberg tables with pyiceberg (no JVM jar).

``sink`` is the two-phase-commit sink and its ``writeStream`` data source; ``catalog`` finds
the catalog, ``table`` creates/validates the table and reads the idempotence record,
``schema`` maps Spark types, ``datafiles`` writes data files on executors, ``commit`` writes
the snapshot (manifests, manifest list, one catalog commit).
"""

from flinkish_spark.connectors.iceberg.sink import IcebergSink, IcebergSinkDataSource

__all__ = ["IcebergSink", "IcebergSinkDataSource"]
