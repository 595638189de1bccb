""":func:`~flinkish_spark.sink.spark_checkpoint.restore_spark_checkpoint` where the Spark driver is: in a Spark
Connect server.

Spark's ``checkpointLocation`` is a folder of the *driver's* machine; under Spark Connect that is the server's,
which the client may not see (another machine: a new cluster after a restart, a rescheduled pod). A client
that restored the copy into its own disk would fill the wrong folder, and the server, starting with an empty
one, would number batches from 0 (the sink refuses that: "checkpointLocation was deleted or replaced").

:func:`restore_on_server` runs the restore in the server: a batch read of the one-row data source
``flinkish.restore_spark_checkpoint``, whose planning (``partitions()``, which Spark runs in a Python worker of
the driver) restores the folder and whose one row is the number of files restored. The same guarantees as
the restore itself: an empty folder is filled from the copy, a folder behind the copy is moved aside, anything
else is left alone; running it twice is the same as once.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from flinkish_spark.options import STORAGE_OPTIONS

NAME = "flinkish.restore_spark_checkpoint"


class SparkCheckpointRestore(DataSource):
    """Options ``location`` (Spark's checkpoint folder, as the driver sees it), ``checkpoint`` (the metadata
    root), ``uid`` (the sink's) and the storage options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "restored long"

    def reader(self, schema: Any) -> DataSourceReader:
        return _Restore(dict(self.options))


class _Restore(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = {k.lower(): v for k, v in options.items()}

    def partitions(self) -> Sequence[InputPartition]:
        from flinkish_spark.sink.spark_checkpoint import restore_spark_checkpoint

        o = self.options
        storage = {k: o[k.lower()] for k in STORAGE_OPTIONS if k.lower() in o}
        return [InputPartition(restore_spark_checkpoint(o["location"], o["checkpoint"], o["uid"], storage))]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (int(partition.value),)


def restore_on_server(spark: Any, location: str, checkpoint: str, uid: str,
                      options: Mapping[str, str] | None = None) -> int:
    """Restore Spark's checkpoint folder ``location`` of the driver of ``spark`` (a Connect server, or this
    process) from the copy sink ``uid`` keeps under ``checkpoint``; the number of files restored."""
    spark.dataSource.register(SparkCheckpointRestore)
    reader = spark.read.format(NAME).option("location", location).option("checkpoint", checkpoint).option("uid", uid)
    for key in STORAGE_OPTIONS:
        if options and options.get(key):
            reader = reader.option(key, options[key])
    return int(reader.load().collect()[0][0])
