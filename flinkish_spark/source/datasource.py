"""The base class of every flinkish split source: common options and the wiring to Spark.

A connector subclasses :class:`SplitDataSource`, declares its ``KIND`` (the
format name) and extra options, parses them in :meth:`configure`, and returns
its enumerator and reader. Everything else -- checkpoints, offsets, admission
control, AvailableNow, restarts -- comes from :class:`SplitStreamReader`.

Options are validated when the DataFrame is defined (``load()``), so a bad
option fails before any query starts and before anything is written.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.operator import operator_settings, parse_uid
from flinkish_spark.options import STORAGE_OPTIONS, Options
from flinkish_spark.source.adapter import SplitStreamReader
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.reader import SplitReader

DEFAULT_RETAIN = 10
COMMON_OPTIONS = ("uid", "checkpoint", "retainCheckpoints", "leaseTimeout", *STORAGE_OPTIONS)


class SplitDataSource(DataSource):
    KIND: ClassVar[str] = ""
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        opts = Options(options, f"{self.name()} source", COMMON_OPTIONS + self.EXTRA_OPTIONS)
        uid = parse_uid(opts)  # the uid error comes before the checkpoint error
        root = opts.required("checkpoint", "the metadata root URL, e.g. s3://bucket/pipelines/p1/meta or /tmp/p1/meta")
        settings = operator_settings(opts, uid, root)
        self.uid, self.checkpoint_root, self.io = settings.uid, settings.checkpoint_root, settings.io
        self.lease_timeout, self.raw_options = settings.lease_timeout, settings.raw_options
        self.retain = opts.integer("retainCheckpoints", DEFAULT_RETAIN, minimum=1) or DEFAULT_RETAIN
        self.configure(opts)
        # Reachability last: every pure validation error comes first, and nothing is written.
        self.io.check_writable_root(self.checkpoint_root, "option 'checkpoint'")

    @classmethod
    def name(cls) -> str:
        return cls.KIND

    # -- for subclasses -------------------------------------------------------------------

    @abstractmethod
    def configure(self, opts: Options) -> None:
        """Parse and validate this connector's own options (raise ConfigError)."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """The configuration that defines the source's data, recorded in each checkpoint."""

    @abstractmethod
    def create_enumerator(self) -> SplitEnumerator: ...

    @abstractmethod
    def create_reader(self, schema: StructType) -> SplitReader: ...

    def default_read_limit(self) -> ReadLimit:
        return ReadAllAvailable()

    # -- wiring ---------------------------------------------------------------------------

    def config_json(self, schema: StructType) -> str:
        """The configuration recorded in each checkpoint: the source's own plus its schema."""
        return json.dumps({**self.config(), "schema": schema.json()}, sort_keys=True)

    def recorded_schema(self) -> StructType | None:
        """The schema recorded by the newest checkpoint of this uid, if there is one.

        A restarted query keeps the schema it started with, even when the input
        that it was inferred from is gone (archived, deleted).
        """
        latest = self.checkpoint_store().latest()
        if latest is None:
            return None
        recorded = json.loads(latest.config).get("schema")
        if not recorded:
            return None
        parsed = StructType.fromJson(json.loads(recorded))
        return parsed

    def checkpoint_store(self) -> SourceCheckpointStore:
        return SourceCheckpointStore(self.io, self.checkpoint_root, self.uid, self.name())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SplitStreamReader(self, schema)
