"""``flinkish.iceberg``: exactly-once writes to Apache Iceberg tables with pyiceberg (no JVM jar).

``sink`` is the two-phase-commit sink and its ``writeStream`` data source, ``commit`` the
snapshot/manifest writer its commits go through.
"""

from flinkish_spark.connectors.iceberg.sink import IcebergSink, IcebergSinkDataSource

__all__ = ["IcebergSink", "IcebergSinkDataSource"]
