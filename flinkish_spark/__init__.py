"""flinkish_spark: Apache Flink's model of finishing and restarting pipelines, for PySpark.

Public API::

    import flinkish_spark
    spark = flinkish_spark.session()          # local Spark with workers that find this package
    flinkish_spark.register(spark)            # flinkish.sequence, flinkish.files, ...
    df = (spark.readStream.format("flinkish.sequence")
          .option("uid", "numbers").option("checkpoint", "/tmp/p/meta")
          .option("rowsPerSplit", "1000").load())
    query = df.writeStream.format("flinkish.parquet")...start()
    flinkish_spark.await_finished(query)      # "finished": bounded input, final epoch committed
    flinkish_spark.stop(query, drain=False)   # graceful stop at an epoch boundary
    flinkish_spark.resnapshot("/tmp/p/meta", ["public.orders"])  # read a mirrored table again
    flinkish_spark.restore_spark_checkpoint(location, "s3://b/meta", "out")  # before start() on a new machine
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flinkish_spark.errors import (
    AlreadyExistsError,
    CheckpointMismatchError,
    CommitFailedError,
    ConfigError,
    ConnectServerUnavailableError,
    CorruptMetadataError,
    DatabaseAccessError,
    DatabaseUnavailableError,
    EnvironmentSetupError,
    FencedError,
    FlinkishError,
    ForeignMetadataError,
    MetadataError,
    PostgresSourceError,
    RetryableError,
    StorageAccessError,
    StorageError,
    StorageUnavailableError,
    TableMismatchError,
    TargetSchemaError,
    TargetWriteError,
    TerminalError,
    UnsupportedFormatVersionError,
)
from flinkish_spark.lazy_exports import lazy_exports

# Not lazy: the submodule flinkish_spark.session would shadow the function once imported.
from flinkish_spark.session import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from flinkish_spark.connectors.cdc.resnapshot_request import resnapshot
    from flinkish_spark.connectors.spark_files import files_sink
    from flinkish_spark.finish import QueryEnd, await_finished, stop, with_watermark
    from flinkish_spark.mirror.status import MirrorStatus, mirror_status
    from flinkish_spark.sink import CommitOutcome, PrepareContext, TwoPhaseCommitSink, transactional
    from flinkish_spark.sink.spark_checkpoint import restore_spark_checkpoint
    from flinkish_spark.source import Split, SplitDataSource, SplitEnumerator, SplitExtent, SplitReader
else:
    # Imported on first access: every Spark worker imports this package first, and most need
    # none of these (see flinkish_spark.lazy_exports).
    __getattr__, __dir__ = lazy_exports(__name__, {
        "files_sink": "flinkish_spark.connectors.spark_files",
        "resnapshot": "flinkish_spark.connectors.cdc.resnapshot_request",
        "QueryEnd": "flinkish_spark.finish",
        "await_finished": "flinkish_spark.finish",
        "stop": "flinkish_spark.finish",
        "with_watermark": "flinkish_spark.finish",
        "mirror_status": "flinkish_spark.mirror.status",
        "MirrorStatus": "flinkish_spark.mirror.status",
        "CommitOutcome": "flinkish_spark.sink",
        "PrepareContext": "flinkish_spark.sink",
        "TwoPhaseCommitSink": "flinkish_spark.sink",
        "transactional": "flinkish_spark.sink",
        "restore_spark_checkpoint": "flinkish_spark.sink.spark_checkpoint",
        "Split": "flinkish_spark.source",
        "SplitDataSource": "flinkish_spark.source",
        "SplitEnumerator": "flinkish_spark.source",
        "SplitExtent": "flinkish_spark.source",
        "SplitReader": "flinkish_spark.source",
    })

__version__ = "0.1.0"


def register(spark: "SparkSession", check_workers: bool = True) -> None:
    """Register every built-in flinkish source and sink with ``spark``, and install the finish controller.

    On a local master it first checks that Spark's Python workers can import this
    package (:class:`EnvironmentSetupError` naming the interpreter and the fix). A Spark
    Connect session has no such check: its workers run in the server, whose Python must have
    this package installed (docs/spark-connect.md).
    """
    from flinkish_spark.connectors.builtin import BUILTIN_SINKS, BUILTIN_SOURCES
    from flinkish_spark.session import check_session_workers

    if check_workers:
        check_session_workers(spark)

    for cls in (*BUILTIN_SOURCES, *BUILTIN_SINKS):
        spark.dataSource.register(cls)
    # Ends queries whose flinkish inputs have all ended, and carries out stop requests.
    from flinkish_spark.finish.controller import FinishController

    FinishController.install(spark)


__all__ = [
    "AlreadyExistsError",
    "CheckpointMismatchError",
    "ConfigError",
    "ConnectServerUnavailableError",
    "CorruptMetadataError",
    "EnvironmentSetupError",
    "FlinkishError",
    "ForeignMetadataError",
    "MetadataError",
    "RetryableError",
    "Split",
    "SplitDataSource",
    "SplitEnumerator",
    "SplitExtent",
    "SplitReader",
    "StorageAccessError",
    "StorageError",
    "StorageUnavailableError",
    "TableMismatchError",
    "TargetSchemaError",
    "TargetWriteError",
    "DatabaseAccessError",
    "DatabaseUnavailableError",
    "PostgresSourceError",
    "TerminalError",
    "UnsupportedFormatVersionError",
    "CommitOutcome",
    "FencedError",
    "CommitFailedError",
    "PrepareContext",
    "TwoPhaseCommitSink",
    "register",
    "QueryEnd",
    "await_finished",
    "stop",
    "resnapshot",
    "with_watermark",
    "mirror_status",
    "MirrorStatus",
    "transactional",
    "files_sink",
    "session",
]
