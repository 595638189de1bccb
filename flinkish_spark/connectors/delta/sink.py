"""``flinkish.delta``: exactly-once writes to a Delta Lake table with delta-rs (no JVM jar).

Two ways to write, by the option ``mode``:

* ``append`` (default; :mod:`~flinkish_spark.connectors.delta.append`): each epoch's rows
  are added as new data files in one blind-append commit per epoch.
* ``upsert`` / ``history`` (:mod:`~flinkish_spark.connectors.delta.keyed`): the rows are
  changes applied by key -- the table mirrors the input's latest row per key (or keeps
  every version, SCD type 2) -- merge-on-read with deletion vectors by default.

Both are two-phase: tasks write Parquet files below ``<path>/flinkish/<uid>/e<epoch>/``
that no log entry names yet (*prepare*); the driver, after recording the decision,
writes one Delta version with the files and ``txn(appId = uid, version = epoch)``
(*commit*). The txn makes the commit idempotent: a replayed epoch, or a commit of ours
whose answer was lost, is recognised in the log and not applied again. *Abort/cleanup*
deletes files of the epoch's folder that the table does not name (failed task
attempts, a crashed run's prepare) -- never a file that the table's commit of the epoch
added (or its compaction), whatever the decision says: when the table holds the epoch,
that commit is read from the log (or known, when this object wrote it), and when it
cannot be found nothing of the epoch is deleted.

*The target's record* (:meth:`DeltaTarget.last_committed_epoch`): the uid's txn version, in
append and keyed modes alike, which the framework asks when the sink's metadata is missing
or belongs to another Spark query (see :mod:`flinkish_spark.sink.incarnation`).

Every ``checkpointInterval`` table versions (default 10) the driver writes a Delta
checkpoint (O(live files): delta-rs lists them all). ``compactEvery`` (default 0: off):
in append mode delta-rs's ``optimize.compact`` every N versions; in the keyed modes
every N epochs the sink rewrites files that carry deletes (and small ones); routed (``{table}``
in ``path``) every N versions of each table, at the table's own offset (:mod:`.routed`).

Options: ``uid``, ``path`` (local or ``s3://``), ``mode``, ``key``, ``deletes``,
``mergeMode``, ``partitionBy`` (append only), ``tableModes`` (routed: each table's ``mode`` /
``deletes`` by table pattern, :mod:`~flinkish_spark.connectors.lakehouse.table_modes`), ``createTable`` (default true),
``checkpoint``, ``checkpointInterval``, ``compactEvery``, ``rowsPerFile``,
``targetFileSize``, and the storage options ``endpointUrl``, ``region``, ``storageOptions``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Iterator, Union

import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.connectors.delta.append import commit_append, prepare_append
from flinkish_spark.connectors.delta.committables import (
    DeltaCommittable, DeltaFile, KeyedCommittable, decode_files, decode_keyed, encode_files, encode_keyed, is_keyed,
)
from flinkish_spark.connectors.delta.committers import commit_processes
from flinkish_spark.connectors.delta.keyed import commit_keyed, prepare_keyed
from flinkish_spark.connectors.delta.live import LiveTarget
from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
from flinkish_spark.connectors.delta.table import DEFAULT_CHECKPOINT_INTERVAL, Head, deltalake
from flinkish_spark.connectors.lakehouse.changes import (
    KEYED_SINK_OPTIONS, ChangePlan, KeyedOptions, parse_keyed_options, plan_changes,
)
from flinkish_spark.connectors.lakehouse.routing import (
    check_stream, is_routed, parse_route, refuse_keyed_options,
)
from flinkish_spark.connectors.lakehouse.routes import ROUTE_OPTIONS, path_resolver, sink_routes
from flinkish_spark.connectors.lakehouse.table_modes import TABLE_MODE_OPTIONS, TRACK, TRACK_EXCEPT, TableModes, parse_table_modes
from flinkish_spark.connectors.lakehouse.transform.rules import TRANSFORM_OPTION, sink_transforms
from flinkish_spark.connectors.lakehouse.files import DEFAULT_ROWS_PER_FILE, DEFAULT_TARGET_FILE_SIZE
from flinkish_spark.connectors.parquet_sink import parse_size
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.options import Options
from flinkish_spark.sink.datasource import TwoPhaseCommitDataSource
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

Committable = Union[DeltaCommittable, KeyedCommittable]
__all__ = ["DeltaSink", "DeltaSinkDataSource", "DeltaCommittable", "DeltaFile", "Head", "arrow_schema"]


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark hands timestamps over in UTC; the zone only tells Delta/Iceberg "with time zone".
    return to_arrow_schema(schema, timezone="UTC")


def keyed_plan(keyed: KeyedOptions, schema: StructType, partition_by: tuple[str, ...], component: str) -> ChangePlan | None:
    if not keyed.keyed:
        return None
    if partition_by:
        raise ConfigError(f"{component}: option 'partitionBy' is not supported with mode {keyed.mode!r} yet (the "
                          "keyed commit reads whole rows back from data files); drop it, or use mode 'append'")
    return plan_changes(keyed, schema, arrow_schema(schema), component)


def paths(c: Committable) -> set[str]:
    """What a task wrote, relative to the table root (a keyed task's entries file too)."""
    return c.paths() if isinstance(c, KeyedCommittable) else {f.path for f in c.files}


class DeltaSink(LiveTarget, TwoPhaseCommitSink[Committable]):
    def __init__(self, io: FileIO, path: str, uid: str, schema: pa.Schema, partition_by: tuple[str, ...],
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL, compact_every: int = 0,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
                 plan: ChangePlan | None = None) -> None:
        super().__init__(io, path, uid, plan.table_schema if plan is not None else schema, partition_by, plan,
                         checkpoint_interval, compact_every, rows_per_file, target_file_size)

    @classmethod
    def at(cls, path: str, uid: str, schema: StructType, partition_by: tuple[str, ...] = (), create_table: bool = True,
           checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL, compact_every: int = 0,
           rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
           options: dict[str, str] | None = None, mode: str = "append", key: str | tuple[str, ...] = (),
           deletes: str = "false", merge_mode: str = "mergeOnRead") -> "DeltaSink":
        """A sink for :func:`flinkish_spark.transactional` (foreachBatch); checks or creates the table now.

        ``mode``, ``key``, ``deletes``, ``merge_mode``: as the options of the same names.
        """
        component = f"DeltaSink uid {uid!r}"
        raw = {"mode": mode, **({"key": key if isinstance(key, str) else ",".join(key)} if key else {})}
        if mode != "append":
            raw.update(deletes=deletes, mergeMode=merge_mode)
        keyed = parse_keyed_options(Options(raw, component, KEYED_SINK_OPTIONS))
        io = FileIO.for_url(path, storage_options_from(options or {}, path), what="path")
        io.check_writable_root(path, "path")
        sink = cls(io, path, uid, arrow_schema(schema), tuple(partition_by), checkpoint_interval, compact_every,
                   rows_per_file, target_file_size, keyed_plan(keyed, schema, tuple(partition_by), component))
        sink.ensure_table(create_table, "DeltaSink.at()")
        return sink

    # -- prepare (executors) -----------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> Committable | None:
        if self.plan is not None:
            return prepare_keyed(self, batches, ctx)
        return prepare_append(self, batches, ctx)

    # -- commit / abort / cleanup (driver) ------------------------------------------------------

    def commit(self, committables: list[Committable], epoch: int) -> CommitOutcome:
        if self.plan is not None:
            return commit_keyed(self, [c for c in committables if isinstance(c, KeyedCommittable)], epoch)
        return commit_append(self, [f for c in committables if isinstance(c, DeltaCommittable) for f in c.files], epoch)

    def abort(self, committables: list[Committable], epoch: int) -> None:
        self.io.delete_many([self.url(p) for c in committables for p in paths(c)])

    def cleanup(self, epoch: int, keep: list[Committable]) -> None:
        self.cleanup_epoch(epoch, {p for c in keep for p in paths(c)})

    def encode(self, committable: Committable) -> bytes:
        if isinstance(committable, KeyedCommittable):
            return encode_keyed(committable)
        return json.dumps(encode_files(committable.files)).encode()

    def decode(self, data: bytes) -> Committable:
        if is_keyed(data):
            return decode_keyed(data)
        return DeltaCommittable(decode_files(json.loads(data)))


class DeltaSinkDataSource(TwoPhaseCommitDataSource):
    """``df.writeStream.format("flinkish.delta")``."""

    KIND = "flinkish.delta"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ("partitionBy", "createTable", "checkpointInterval", "compactEvery",
                                                "commitProcesses",
                                                "rowsPerFile", "targetFileSize", *KEYED_SINK_OPTIONS, *TABLE_MODE_OPTIONS,
                                                TRANSFORM_OPTION, *ROUTE_OPTIONS)

    def configure(self, opts: Options) -> None:
        self.path = opts.required("path", "the Delta table's folder, e.g. .option('path', 's3://b/tables/orders')").rstrip("/")
        self.route = sink_routes(parse_route(self.path, "path", "path", opts.component) if is_routed(self.path) else None,
                                 opts.has, opts.get, opts.component, "path", path_resolver(self.path, opts.component))
        if self.route is not None:
            refuse_keyed_options(opts.has, opts.component, "path")
        elif routing_only := [o for o in ("tableModes", TRACK, TRACK_EXCEPT) if opts.has(o)]:
            raise ConfigError(f"{opts.component}: option '{routing_only[0]}' gives the tables of a routing sink their modes "
                              "('{table}' in 'path'); one table's sink has 'mode' and 'deletes'. Drop it.")
        self.commit_processes = commit_processes(opts, self.route is not None)
        self.modes = parse_table_modes(opts.get, opts.component) if self.route is not None else TableModes()
        self.transforms = sink_transforms(opts.get, self.route is not None, opts.component, "path")
        raw = opts.get("partitionBy") or ""
        self.partition_by = tuple(c.strip() for c in raw.split(",") if c.strip())
        self.create_table = opts.boolean("createTable", True)
        self.checkpoint_interval = opts.integer("checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL, minimum=0)
        self.compact_every = opts.integer("compactEvery", 0, minimum=0) or 0
        self.rows_per_file = opts.integer("rowsPerFile", DEFAULT_ROWS_PER_FILE, minimum=1) or DEFAULT_ROWS_PER_FILE
        self.target_file_size = parse_size(opts, "targetFileSize", DEFAULT_TARGET_FILE_SIZE)
        self.keyed = (parse_keyed_options(opts) if self.route is None else
                      KeyedOptions("upsert", (), "true", opts.choice("mergeMode", ("mergeOnRead", "copyOnWrite"), "mergeOnRead")))
        root = self.path if self.route is None else self.path[:self.path.index("{")].rstrip("/")
        if self.route is not None and (not root or root.endswith(":/") or root.endswith(":")):
            raise ConfigError(f"{opts.component}: option 'path' = {self.path!r} needs a folder before its first "
                              "placeholder (e.g. s3://bucket/lake/{schema}/{table})")
        self.data_io = FileIO.for_url(root, storage_options_from(self.raw_options, root), what="option 'path'")
        self.data_io.check_writable_root(root, "option 'path'")
        deltalake()  # a missing package fails at start(), not in the first batch

    def sink(self, schema: StructType) -> Any:
        component = f"{self.name()} sink uid {self.uid!r}"
        if self.route is not None:
            check_stream(schema.fieldNames(), component, "path")
            routed = RoutedDeltaSink(self.data_io, self.route, self.uid, self.keyed.merge_mode,
                                     DEFAULT_CHECKPOINT_INTERVAL if self.checkpoint_interval is None else self.checkpoint_interval,
                                     self.rows_per_file, self.target_file_size, self.create_table,
                                     self.io, self.decision_log().directory, self.compact_every, self.modes,
                                     self.commit_processes)
            routed.transforms = self.transforms
            return routed
        missing = [c for c in self.partition_by if c not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' names {missing}, which the query does not have ({schema.simpleString()})")
        if self.partition_by and len(self.partition_by) == len(schema.fieldNames()):
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' cannot name every column")
        return DeltaSink(self.data_io, self.path, self.uid, arrow_schema(schema), self.partition_by,
                         DEFAULT_CHECKPOINT_INTERVAL if self.checkpoint_interval is None else self.checkpoint_interval,
                         self.compact_every, self.rows_per_file, self.target_file_size,
                         keyed_plan(self.keyed, schema, self.partition_by, component))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        # On the driver before any task of the batch: a wrong table fails with nothing written.
        # (Routed targets are checked and created in the commit: only the rows name them.)
        sink = self.sink(schema)
        if isinstance(sink, DeltaSink):
            sink.ensure_table(self.create_table, f"{self.name()} sink")
        return super().streamWriter(schema, overwrite)
