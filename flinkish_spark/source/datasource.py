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

from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.errors import ConfigError
from flinkish_spark.operator import operator_settings, parse_uid
from flinkish_spark.options import STORAGE_OPTIONS, Options
from flinkish_spark.source.adapter import SplitStreamReader
from flinkish_spark.source.enumerator import SplitEnumerator
from flinkish_spark.source.planning import ReadRange, read_ranges
from flinkish_spark.source.reader import SplitReader

DEFAULT_RETAIN = 10
COMMON_OPTIONS = ("uid", "checkpoint", "retainCheckpoints", "leaseTimeout", "watermarkColumn", *STORAGE_OPTIONS)
DESCRIPTOR_FILE = "_source.json"
_SECRET_WORDS = ("key", "secret", "token", "password", "credential")


class SplitDataSource(DataSource):
    KIND: ClassVar[str] = ""
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.setup_source()

    def setup_source(self) -> None:
        """Validate the options as a source's (idempotent).

        Runs from ``__init__``; a data source that also serves as a sink under the same
        format name overrides ``__init__`` and calls this only when Spark asks it for a
        reader (``schema``/``streamReader``), so that sink options are never checked as
        source options.
        """
        if getattr(self, "_source_set_up", False):
            return
        options = self.options
        opts = Options(options, f"{self.name()} source", COMMON_OPTIONS + self.EXTRA_OPTIONS)
        uid = parse_uid(opts)  # the uid error comes before the checkpoint error
        root = opts.required("checkpoint", "the metadata root URL, e.g. s3://bucket/pipelines/p1/meta or /tmp/p1/meta")
        settings = operator_settings(opts, uid, root)
        self.uid, self.checkpoint_root, self.io = settings.uid, settings.checkpoint_root, settings.io
        self.lease_timeout, self.raw_options = settings.lease_timeout, settings.raw_options
        self.retain = opts.integer("retainCheckpoints", DEFAULT_RETAIN, minimum=1) or DEFAULT_RETAIN
        self.watermark_column = (opts.get("watermarkColumn") or "").strip() or None
        self.configure(opts)
        # Reachability last: every pure validation error comes first, and nothing is written.
        self.io.check_writable_root(self.checkpoint_root, "option 'checkpoint'")
        self._source_set_up = True

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

    def group_ranges(self, ranges: list[ReadRange]) -> list[list[ReadRange]]:
        """The Spark partitions of an epoch: each a list of ranges read one after the other.

        One partition per range by default; a source of many small splits may pack them.
        """
        return [[r] for r in ranges]

    def spread(self, r: ReadRange) -> tuple[int, str] | None:
        """``(tasks, key column)`` to read the range ``r`` while its epoch is planned and hand its rows to that many
        tasks by the key (:mod:`.spread_read`); None (the default): ``r`` is read by a task of its own."""
        return None

    def epoch_ranges(self, checkpoint: SourceCheckpoint) -> list[ReadRange]:
        """The ranges the epoch of ``checkpoint`` reads: :func:`.planning.read_ranges` by default. A source may cut a
        range into pieces read by separate tasks (a change log range at the transaction boundaries its planning
        found: :mod:`flinkish_spark.connectors.cdc.change_split`) -- only as the checkpoint says, so that a
        replay reads the same pieces."""
        return read_ranges(checkpoint)

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
        if self.watermark_column is not None:
            from pyspark.sql.types import TimestampNTZType, TimestampType

            field = next((f for f in schema.fields if f.name == self.watermark_column), None)
            if field is None or not isinstance(field.dataType, (TimestampType, TimestampNTZType)):
                raise ConfigError(
                    f"{self.name()} source: option 'watermarkColumn' must name a timestamp column of "
                    f"the schema; {self.watermark_column!r} is "
                    + ("not in it" if field is None else f"a {field.dataType.simpleString()}")
                    + f" (schema: {schema.simpleString()})"
                )
        return SplitStreamReader(self, schema)

    # -- the final checkpoint notification from the driver's own process -------------------

    def write_descriptor(self) -> None:
        """Record how to rebuild this source (class and options, never credentials).

        The finish controller runs in the driver's Python process, not in Spark's
        source worker; it uses this to deliver the final "checkpoint complete"
        notification, which Spark itself never sends (see flinkish_spark.finish).
        """
        options = {
            k: v for k, v in self.raw_options.items() if not any(w in k.lower() for w in _SECRET_WORDS)
        }
        options.pop("storageOptions", None)  # may hold credentials; the environment provides them
        cls = type(self)
        descriptor = {"class": f"{cls.__module__}:{cls.__qualname__}", "options": options}
        self.io.write_bytes(
            f"{self.checkpoint_store().directory}/{DESCRIPTOR_FILE}", json.dumps(descriptor).encode()
        )

    @staticmethod
    def from_descriptor(io: Any, root: str, uid: str, extra_options: dict[str, str]) -> "SplitDataSource":
        import importlib

        path = f"{SourceCheckpointStore(io, root, uid, '').directory}/{DESCRIPTOR_FILE}"
        descriptor = json.loads(io.read_bytes(path))
        module, _, qualname = descriptor["class"].partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        options = {**descriptor["options"], **extra_options}
        source = obj(options)
        assert isinstance(source, SplitDataSource)
        source.setup_source()
        return source
