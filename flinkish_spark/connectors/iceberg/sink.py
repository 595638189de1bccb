"""``flinkish.iceberg``: exactly-once appends -- or keyed changes (:mod:`.keyed`) -- to an Apache
Iceberg table with pyiceberg (no JVM jar).

* **Prepare** (executors): each task writes its rows as Parquet data files (with Iceberg
  field ids) below ``<table location>/data/flinkish/<uid>/e<epoch>/[k=v/]`` and returns
  their Iceberg data-file descriptions (path, size, partition, column statistics from the
  Parquet footer). No manifest names them yet, so no reader sees them.
* **Commit** (driver, after the decision is recorded): one append snapshot per epoch
  holding every data file of the epoch, with the snapshot summary properties
  ``flinkish.uid`` and ``flinkish.epoch`` -- what Flink's Iceberg committer does with
  ``flink.job-id`` and ``flink.max-committed-checkpoint-id``. It is written by
  :mod:`flinkish_spark.connectors.iceberg.commit` (one catalog commit, merged manifests,
  old snapshots expired in the same commit), so its cost does not grow with the history.
* **Idempotence**: before committing, the driver walks the current snapshot's ancestry
  back to the newest snapshot this uid committed; when its ``flinkish.epoch`` is >= the
  epoch, the epoch is in the table and the commit answers ``ALREADY_COMMITTED``. The walk
  stops at that snapshot, so it costs O(snapshots other writers added since), not
  O(history). The commit requires ``main`` to still point at the snapshot the check saw
  (``assert-ref-snapshot-id``): a concurrent writer, or a commit of ours whose answer was
  lost, makes it fail, and the driver re-reads the table and checks again.
* **Keyed modes** (``mode=upsert|history``): see :mod:`.keyed` -- one snapshot per epoch with
  the new rows and position delete files, a marker snapshot for an epoch that changed
  nothing, the lookup redone when another commit came first; ``compactEvery``: :mod:`.compact`.
* **Abort / cleanup**: files of an epoch's folder that the table does not name once it has
  the epoch -- or, before, that no decided committable names (failed task attempts, a
  crashed run's prepare, a refused attempt's delete files) -- are deleted by listing it.
  Never a file that the epoch's snapshots added (data, position delete and compaction
  files, read from their manifests), whatever the decision says; when the table holds the
  epoch and its snapshots are gone (expired), nothing of the epoch is deleted.
* **The target's record** (:meth:`IcebergSink.last_committed_epoch`): the ancestry walk
  above -- in keyed modes a marker snapshot of an epoch that changed nothing counts -- which
  the framework asks when the sink's metadata is missing or belongs to another Spark query
  (see :mod:`flinkish_spark.sink.incarnation`).

Catalog: see :mod:`.catalog` (``catalog`` / ``catalogUri`` + ``warehouse`` / embedded,
``catalogName``).

Options: ``uid``, ``table`` (``namespace.name``; with ``{schema}``/``{table}`` placeholders the
multi-table stream is routed, one keyed table per source table: :mod:`.routed`), ``catalog`` / ``catalogUri`` /
``warehouse`` / ``catalogName``, ``partitionBy`` (identity partitions), ``createTable`` (default true),
``checkpoint``, ``rowsPerFile``, ``targetFileSize``, ``retainSnapshots`` (default 100: each
commit expires all but the newest N snapshots, never the newest of any flinkish uid -- its
idempotence record; 0 keeps all, and then the commit cost grows with the snapshot count),
``mode`` / ``key`` / ``deletes`` / ``mergeMode`` (the shared keyed options), ``compactEvery``,
storage options. Tables the sink creates get ``commit.manifest-merge.enabled`` and
``write.metadata.delete-after-commit.enabled``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.connectors.iceberg.catalog import catalog_properties, identifier, load, pyiceberg
from flinkish_spark.connectors.iceberg.commit import append_snapshot, commit_snapshot
from flinkish_spark.connectors.iceberg.compact import compact
from flinkish_spark.connectors.iceberg.keyed import KeyedCommittable, Target, plan_epoch, prepare
from flinkish_spark.connectors.iceberg.routed import RoutedIcebergSink
from flinkish_spark.connectors.iceberg.datafiles import IcebergFile, epoch_folder, to_data_file, write_data_files
from flinkish_spark.connectors.iceberg.schema import iceberg_schema, keyed_table_schema, shape
from flinkish_spark.connectors.iceberg.table import (
    EPOCH_PROPERTY,
    UID_PROPERTY,
    TableCache,
    TableInfo,
    committed_epoch,
    ensure_table,
    files_added_by,
    info_of,
    keyed_properties,
)
from flinkish_spark.connectors.lakehouse.changes import (
    KEYED_SINK_OPTIONS,
    ChangePlan,
    KeyedOptions,
    parse_keyed_options,
    plan_changes,
)
from flinkish_spark.connectors.lakehouse.files import DEFAULT_ROWS_PER_FILE, DEFAULT_TARGET_FILE_SIZE
from flinkish_spark.connectors.lakehouse.routing import (
    check_stream, is_routed, parse_route, refuse_keyed_options,
)
from flinkish_spark.connectors.lakehouse.routes import ROUTE_OPTIONS, sink_routes
from flinkish_spark.connectors.lakehouse.table_modes import TRACK, TRACK_EXCEPT, TableModes, parse_table_modes
from flinkish_spark.connectors.lakehouse.transform.rules import TRANSFORM_OPTION, sink_transforms
from flinkish_spark.connectors.parquet_sink import parse_size
from flinkish_spark.errors import ConfigError, TableMismatchError
from flinkish_spark.faults import crash_point
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.options import Options
from flinkish_spark.sink.datasource import TwoPhaseCommitDataSource
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

log = logging.getLogger(__name__)

# A long streaming job must not make every commit slower: keep the newest 100 snapshots
# (and each uid's newest, its idempotence record). 0 keeps all.
DEFAULT_RETAIN_SNAPSHOTS = 100


@dataclass(frozen=True)
class IcebergCommittable:
    files: tuple[IcebergFile, ...]


Committable = IcebergCommittable | KeyedCommittable


class IcebergSink(TwoPhaseCommitSink[Committable]):
    def __init__(self, catalog_properties: dict[str, str], identifier: str, uid: str, schema: StructType,
                 partition_by: tuple[str, ...], io: FileIO, info: TableInfo | None = None,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
                 retain_snapshots: int = DEFAULT_RETAIN_SNAPSHOTS, plan: ChangePlan | None = None,
                 compact_every: int = 0) -> None:
        self.catalog_properties = catalog_properties
        self.identifier = identifier
        self.uid = uid
        self.spark_schema = schema
        self.partition_by = partition_by
        self.io = io
        self.info = info
        self.rows_per_file = rows_per_file
        self.target_file_size = target_file_size
        self.retain_snapshots = retain_snapshots
        self.plan = plan  # None: append mode
        self.compact_every = compact_every

    @classmethod
    def at(cls, table: str, uid: str, schema: StructType, checkpoint: str | None = None, catalog: str | None = None,
           catalog_uri: str | None = None, warehouse: str | None = None, partition_by: tuple[str, ...] = (),
           create_table: bool = True, rows_per_file: int = DEFAULT_ROWS_PER_FILE,
           target_file_size: int = DEFAULT_TARGET_FILE_SIZE, retain_snapshots: int = DEFAULT_RETAIN_SNAPSHOTS,
           options: dict[str, str] | None = None, catalog_name: str | None = None, mode: str = "append",
           key: tuple[str, ...] | str = (), deletes: str | None = None, merge_mode: str | None = None,
           compact_every: int = 0) -> "IcebergSink":
        """A sink for :func:`flinkish_spark.transactional` (foreachBatch); checks or creates the table now.

        Without ``catalog``/``catalog_uri`` the embedded SQLite catalog lives in ``checkpoint``.
        ``mode``, ``key``, ``deletes``, ``merge_mode``, ``compact_every``: as the options of the same names.
        """
        keys = ",".join(key) if not isinstance(key, str) else key
        given = {k: v for k, v in {"mode": mode, "key": keys, "deletes": deletes, "mergeMode": merge_mode}.items() if v}
        keyed = parse_keyed_options(Options(given, "IcebergSink.at()", KEYED_SINK_OPTIONS))
        plan = keyed_plan(keyed, schema, "IcebergSink.at()")
        opts = dict(options or {})
        props = catalog_properties(catalog, catalog_uri, warehouse, checkpoint, opts, "IcebergSink.at()", catalog_name)
        io = FileIO.for_url(props.get("warehouse") or ".", storage_options_from(opts, props.get("warehouse") or "."))
        sink = cls(props, identifier(table, "IcebergSink.at()"), uid, schema, tuple(partition_by), io,
                   rows_per_file=rows_per_file, target_file_size=target_file_size, retain_snapshots=retain_snapshots,
                   plan=plan, compact_every=compact_every)
        sink.info = sink.ensure_table(create_table, "IcebergSink.at()")
        sink.io = FileIO.for_url(sink.info.location, storage_options_from(opts, sink.info.location), what="table location")
        return sink

    # -- the table (driver) ------------------------------------------------------------------

    def catalog(self) -> Any:
        return load(self.catalog_properties)

    def _table_key(self) -> tuple[str, str, str]:
        return json.dumps(self.catalog_properties, sort_keys=True), self.identifier, self.uid

    def table(self, refresh: bool = True) -> Any:
        """The table: loaded from the catalog, or (``refresh=False``) as this process last saw it."""
        table = None if refresh else TableCache.get(self._table_key())
        if table is None:
            table = self.catalog().load_table(self.identifier)
            TableCache.put(self._table_key(), table)
        return table

    def _forget_table(self) -> None:
        TableCache.forget(self._table_key())

    def ensure_table(self, create: bool, component: str) -> TableInfo:
        """Validate the table against the query -- or create it -- before any task writes."""
        pyiceberg()
        plan = self.plan
        wanted = self.spark_schema if plan is None else keyed_table_schema(self.spark_schema, plan.table_schema.names)
        if plan is not None:
            self._check_key_types(iceberg_schema(wanted), component)
        table = ensure_table(self.catalog(), self.catalog_properties["name"], self.identifier, iceberg_schema(wanted),
                             self.partition_by, create, component,
                             keyed_properties(plan.merge_mode) if plan is not None else None)
        if plan is not None and plan.merge_mode == "mergeOnRead" and table.metadata.format_version < 2:
            raise TableMismatchError(
                f"{component}: mode '{plan.mode}' with mergeMode 'mergeOnRead' writes position delete files, which "
                f"need an Iceberg table of format version 2, but {self.identifier!r} has version "
                f"{table.metadata.format_version}. Upgrade it (pyiceberg: `with table.transaction() as tx: "
                "tx.upgrade_table_version(format_version=2)`; Spark: ALTER TABLE ... SET TBLPROPERTIES "
                "('format-version'='2')), or set mergeMode to copyOnWrite.")
        TableCache.put(self._table_key(), table)
        return info_of(table)

    def _check_key_types(self, wanted: Any, component: str) -> None:
        """A key column whose type changed gets its own error (the schema check would name every column)."""
        from pyiceberg.exceptions import NoSuchTableError

        assert self.plan is not None
        try:
            have = dict(shape(self.catalog().load_table(self.identifier).schema()))
        except NoSuchTableError:
            return
        want = dict(shape(wanted))
        changed = [f"{k!r} is {have[k]} in the table but {want[k]} in the query" for k in self.plan.key
                   if k in have and have[k] != want[k]]
        if changed:
            raise TableMismatchError(
                f"{component}: the key of the Iceberg table {self.identifier!r} changed type: {'; '.join(changed)}. "
                "A key's type cannot change in place: cast the column back in the query, or write to a new table.")

    # -- prepare (executors) -----------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> Committable | None:
        if self.info is None:
            raise RuntimeError("IcebergSink.prepare() before the table was resolved on the driver")
        if self.plan is not None:
            return prepare(self._target(), batches, ctx, f"flinkish.iceberg sink uid {self.uid!r}")
        files = write_data_files(self.io, self.info, self.uid, batches, ctx, self.partition_by,
                                 self.rows_per_file, self.target_file_size)
        return IcebergCommittable(tuple(files)) if files else None

    # -- commit / abort / cleanup (driver) ------------------------------------------------------

    def commit(self, committables: list[Committable], epoch: int) -> CommitOutcome:
        pyiceberg()
        from pyiceberg.exceptions import CommitFailedException

        keyed = [c for c in committables if isinstance(c, KeyedCommittable)]
        files = [f for c in committables if isinstance(c, IcebergCommittable) for f in c.files]
        cached = TableCache.get(self._table_key()) is not None
        table = self.table(refresh=False)
        marker = {UID_PROPERTY: self.uid, EPOCH_PROPERTY: str(epoch)}
        for attempt in range(10):
            # The check and the commit see the same table state: the commit asserts that
            # main still points where it pointed here, so a stale cached table can only
            # make the commit fail (and be re-checked), never apply an epoch twice.
            if committed_epoch(table, self.uid) >= epoch:
                if cached:
                    # ... but "already committed" from the cache is confirmed in the catalog: Spark reuses
                    # the commit worker across queries, and the table may have been dropped and created again.
                    cached = False
                    table = self.table(refresh=True)
                    continue
                return "ALREADY_COMMITTED"
            if self.plan is None and not files:
                return "COMMITTED"  # an empty append epoch adds no snapshot
            written: list[str] = []
            try:
                spec_id = self._spec_id(table)
                if self.plan is not None:
                    # The lookup reads the snapshot the commit asserts: positions are never stale.
                    plan = plan_epoch(self._target(), table, keyed, epoch)
                    written = plan.written
                    crash_point("iceberg.keyed.before_snapshot")  # delete files and copies written, no snapshot
                    commit_snapshot(self.catalog(), table, plan.changes, spec_id, marker,
                                    retain=self.retain_snapshots, protect_property=UID_PROPERTY,
                                    delete_files=self._delete_quietly)
                    every = self.compact_every
                    if every and self.plan.merge_mode == "mergeOnRead" and (epoch + 1) % every == 0:
                        try:
                            self.compact(table, epoch)
                        except Exception as exc:  # noqa: BLE001 - the epoch is in the table; the next one retries
                            log.warning("flinkish.iceberg: compaction after epoch %d failed: %s", epoch, exc)
                else:
                    append_snapshot(self.catalog(), table, [to_data_file(f, spec_id) for f in files], spec_id, marker,
                                    retain=self.retain_snapshots, protect_property=UID_PROPERTY,
                                    delete_files=self._delete_quietly)
                return "COMMITTED"
            except CommitFailedException:
                # Another writer committed first (or our own commit landed and its answer
                # was lost): re-read the table and check again -- and look the keys up again.
                self._delete_quietly(written)
                time.sleep(min(0.05 * 2 ** attempt, 2.0))
                table = self.table(refresh=True)
            except BaseException:
                self._forget_table()
                raise
        return "RETRY_LATER"

    def compact(self, table: Any, epoch: int) -> bool:
        """Rewrite the data files that have deletes, merge the small ones (:mod:`.compact`); the epoch is committed."""
        return compact(self._target(), self.catalog(), table, lambda: self.table(refresh=True), epoch,
                       {UID_PROPERTY: self.uid, EPOCH_PROPERTY: str(epoch)}, self.retain_snapshots, UID_PROPERTY,
                       self._delete_quietly)

    def _target(self) -> Target:
        if self.info is None:
            raise RuntimeError("IcebergSink.commit() before the table was resolved on the driver")
        assert self.plan is not None
        return Target(self.io, self.info, self.uid, self.plan, self.partition_by, self.rows_per_file,
                      self.target_file_size)

    def _delete_quietly(self, paths: list[str]) -> None:
        """Delete metadata files no snapshot needs any more, in one bulk request on S3 (pyarrow's
        file system lists the parent folder after each delete); a leftover file is harmless."""
        try:
            self.io.delete_many(paths)
        except Exception as exc:  # noqa: BLE001 - orphan cleanup (table maintenance) removes it
            log.warning("flinkish.iceberg: could not delete %d unused metadata files: %s", len(paths), exc)

    def _spec_id(self, table: Any) -> int:
        """The partition spec the epoch's files were prepared for."""
        if self.info is None:
            return int(table.metadata.default_spec_id)
        return int(json.loads(self.info.spec_json).get("spec-id", table.metadata.default_spec_id))

    def abort(self, committables: list[Committable], epoch: int) -> None:
        self.io.delete_many([p for c in committables for p in _paths(c)])

    def cleanup(self, epoch: int, keep: list[Committable]) -> None:
        """Delete what the epoch's folder holds beyond what the table (once it has the epoch) or the
        decided committables (before) name: failed task attempts, a crashed run's or refused attempt's files."""
        if self.info is None:
            return
        table = self.table()
        added = files_added_by(table, self.uid, epoch)
        if added is not None:
            wanted = {self.io.strip(p) for p in added}
        elif committed_epoch(table, self.uid) >= epoch:
            return  # the table has the epoch in an expired snapshot: its files are unknown, never delete by listing
        else:
            wanted = {self.io.strip(p) for c in keep for p in _paths(c)}
        folder = epoch_folder(self.info, self.uid, epoch)
        self.io.delete_many([self.io.url(p) for p in self.io.find(folder) if p not in wanted])
        self.io.remove_empty_dirs(folder)

    def last_committed_epoch(self) -> int:
        """The newest epoch of this uid in the table's snapshots (-1: none, or no table yet); read
        from the catalog, never from this process's cache of the table."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return committed_epoch(self.table(), self.uid)
        except NoSuchTableError:
            return -1


def _paths(c: Committable) -> list[str]:
    return c.paths() if isinstance(c, KeyedCommittable) else [f.path for f in c.files]


def keyed_plan(options: KeyedOptions, schema: StructType, component: str) -> ChangePlan | None:
    """The keyed plan for the query's schema (None in append mode)."""
    if not options.keyed:
        return None
    from pyspark.sql.pandas.types import to_arrow_schema

    return plan_changes(options, schema, to_arrow_schema(schema, timezone="UTC"), component)


class IcebergSinkDataSource(TwoPhaseCommitDataSource):
    """``df.writeStream.format("flinkish.iceberg")``."""

    KIND = "flinkish.iceberg"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ("table", "catalog", "catalogUri", "catalogName", "warehouse", "partitionBy",
                                                "createTable", "rowsPerFile", "targetFileSize", "retainSnapshots",
                                                *KEYED_SINK_OPTIONS, "compactEvery", "tableModes", TRACK, TRACK_EXCEPT,
                                                TRANSFORM_OPTION, *ROUTE_OPTIONS)

    def configure(self, opts: Options) -> None:
        component = f"{self.name()} sink"
        table = opts.required("table", "the Iceberg table as namespace.name, e.g. 'db.orders'")
        self.route = sink_routes(parse_route(table, "iceberg", "table", component) if is_routed(table) else None,
                                 opts.has, opts.get, component, "table")
        if self.route is not None:
            refuse_keyed_options(opts.has, component, "table")
        elif routing_only := [o for o in ("tableModes", TRACK, TRACK_EXCEPT) if opts.has(o)]:
            raise ConfigError(f"{component}: option '{routing_only[0]}' gives the tables of a routing sink their modes "
                              "('{table}' in 'table'); one table's sink has 'mode' and 'deletes'. Drop it.")
        self.modes = parse_table_modes(opts.get, component) if self.route is not None else TableModes()
        self.transforms = sink_transforms(opts.get, self.route is not None, component, "table")
        # A template is checked as a name it makes (each placeholder one part of a name).
        identifier(table.replace("{schema}", "s").replace("{table}", "t"), component)
        self.identifier = table
        raw = opts.get("partitionBy") or ""
        self.partition_by = tuple(c.strip() for c in raw.split(",") if c.strip())
        self.create_table = opts.boolean("createTable", True)
        self.rows_per_file = opts.integer("rowsPerFile", DEFAULT_ROWS_PER_FILE, minimum=1) or DEFAULT_ROWS_PER_FILE
        self.target_file_size = parse_size(opts, "targetFileSize", DEFAULT_TARGET_FILE_SIZE)
        retain = opts.integer("retainSnapshots", DEFAULT_RETAIN_SNAPSHOTS, minimum=0)
        self.retain_snapshots = DEFAULT_RETAIN_SNAPSHOTS if retain is None else retain
        self.catalog_props = catalog_properties(opts.get("catalog"), opts.get("catalogUri"), opts.get("warehouse"),
                                                self.checkpoint_root, self.raw_options, component,
                                                opts.get("catalogName"))
        warehouse = self.catalog_props.get("warehouse") or self.checkpoint_root
        self.data_io = FileIO.for_url(warehouse, storage_options_from(self.raw_options, warehouse), what="option 'warehouse'")
        self.data_io.check_writable_root(warehouse, "option 'warehouse'")
        self.keyed = (parse_keyed_options(opts) if self.route is None else
                      KeyedOptions("upsert", (), "true", opts.choice("mergeMode", ("mergeOnRead", "copyOnWrite"), "mergeOnRead")))
        self.compact_every = opts.integer("compactEvery", 0, minimum=0) or 0
        self.info: TableInfo | None = None

    def sink(self, schema: StructType) -> Any:
        if self.route is not None:
            check_stream(schema.fieldNames(), f"{self.name()} sink uid {self.uid!r}", "table")
            routed = RoutedIcebergSink(self.catalog_props, self.route, self.uid, self.raw_options, self.keyed.merge_mode,
                                       self.rows_per_file, self.target_file_size, self.retain_snapshots,
                                       self.create_table, self.io, self.decision_log().directory, self.compact_every,
                                       self.modes)
            routed.transforms = self.transforms
            return routed
        missing = [c for c in self.partition_by if c not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' names {missing}, which the query does not have ({schema.simpleString()})")
        plan = keyed_plan(self.keyed, schema, f"{self.name()} sink")
        return IcebergSink(self.catalog_props, self.identifier, self.uid, schema, self.partition_by, self.data_io,
                           self.info, self.rows_per_file, self.target_file_size, self.retain_snapshots, plan,
                           self.compact_every)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        # On the driver before any task: resolve (or create) the table; executors get its
        # location, schema and spec with the writer, never touching the catalog. (Routed targets
        # are checked and created in the commit: only the rows name them.)
        sink = self.sink(schema)
        if isinstance(sink, RoutedIcebergSink):
            return super().streamWriter(schema, overwrite)
        self.info = sink.ensure_table(self.create_table, f"{self.name()} sink")
        location = self.info.location
        self.data_io = FileIO.for_url(location, storage_options_from(self.raw_options, location), what="table location")
        return super().streamWriter(schema, overwrite)
