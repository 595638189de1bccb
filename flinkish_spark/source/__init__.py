"""FLIP-27 style split sources for Spark: enumerator on the driver, split readers on executors."""

from flinkish_spark.source.adapter import SplitPartition, SplitStreamReader
from flinkish_spark.source.datasource import SplitDataSource
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.reader import SplitReader
from flinkish_spark.source.split import Split, SplitExtent

__all__ = [
    "Split",
    "SplitDataSource",
    "SplitEnumerator",
    "SplitExtent",
    "SplitPartition",
    "SplitReader",
    "SplitStreamReader",
]
