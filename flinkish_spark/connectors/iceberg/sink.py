"""``flinkish.iceberg``: exactly-once appends to an Apache Iceberg table with pyiceberg (no JVM jar).

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
* **Abort / cleanup**: files of an epoch that no decided data file names (failed task
  attempts, a crashed run's prepare) are deleted by listing the epoch's folder -- never a
  file that the table's snapshot of the epoch added, whatever the decision says (read from
  its manifests, or known when this object committed it); when the table holds the epoch
  and its snapshot is gone (expired), nothing of the epoch is deleted.
* **The target's record** (:meth:`IcebergSink.last_committed_epoch`): the ancestry walk
  above, which the framework asks when the sink's metadata is missing or belongs to another
  Spark query (see :mod:`flinkish_spark.sink.incarnation`).

Catalog: ``catalog`` names a pyiceberg catalog (``.pyiceberg.yaml`` or
``PYICEBERG_CATALOG__<NAME>__*`` variables); or ``catalogUri`` (+ ``warehouse``) makes a
SQL catalog; without either, an embedded SQL catalog on SQLite lives in the sink's
checkpoint folder (``<checkpoint>/iceberg/catalog.db``, warehouse
``<checkpoint>/iceberg/warehouse``; local checkpoint folders only).

Options: ``uid``, ``table`` (``namespace.name``), ``catalog`` / ``catalogUri`` /
``warehouse``, ``partitionBy`` (identity partitions), ``createTable`` (default true),
``checkpoint``, ``rowsPerFile``, ``targetFileSize``, ``retainSnapshots`` (default 100: each
commit expires all but the newest N snapshots, never the newest of any flinkish uid -- its
idempotence record; 0 keeps all, and then the commit cost grows with the snapshot count),
storage options. Tables the sink creates get ``commit.manifest-merge.enabled`` and
``write.metadata.delete-after-commit.enabled``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.connectors.iceberg.commit import (
    DELETE_AFTER_COMMIT,
    MERGE_ENABLED,
    append_snapshot,
    supported,
)
from flinkish_spark.connectors.parquet_sink import parse_size
from flinkish_spark.connectors.lakehouse.files import (
    DEFAULT_ROWS_PER_FILE,
    DEFAULT_TARGET_FILE_SIZE,
    epoch_dir,
    iceberg_io_properties,
    require,
    write_files,
)
from flinkish_spark.errors import ConfigError, TableMismatchError
from flinkish_spark.io.fileio import FileIO, protocol_of, storage_options_from
from flinkish_spark.options import Options
from flinkish_spark.sink.datasource import TwoPhaseCommitDataSource
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

log = logging.getLogger(__name__)

DATA_PREFIX = "data/flinkish"
EXTRA = "iceberg"
UID_PROPERTY = "flinkish.uid"
EPOCH_PROPERTY = "flinkish.epoch"
PARTITION_FIELD_ID_START = 1000
# A long streaming job must not make every commit slower: keep the newest 100 snapshots
# (and each uid's newest, its idempotence record). 0 keeps all.
DEFAULT_RETAIN_SNAPSHOTS = 100
# Properties of tables the sink creates: merged manifests and no pile of old metadata
# files, for every writer of the table (Java Iceberg's defaults for streaming tables).
CREATED_TABLE_PROPERTIES = {MERGE_ENABLED: "true", DELETE_AFTER_COMMIT: "true"}


@dataclass(frozen=True)
class IcebergFile:
    """One prepared data file: everything the driver needs to build its manifest entry."""

    path: str
    size: int
    partition: tuple[Any, ...]  # Iceberg's internal values, in partition spec order
    statistics: tuple[tuple[str, Any], ...]  # DataFileStatistics.to_serialized_dict() items


@dataclass(frozen=True)
class IcebergCommittable:
    files: tuple[IcebergFile, ...]


@dataclass(frozen=True)
class TableInfo:
    """What executors need to write files for a table, without a catalog."""

    location: str
    schema_json: str
    spec_json: str
    properties: tuple[tuple[str, str], ...]


def _pyiceberg() -> Any:
    return require("pyiceberg", EXTRA, "the flinkish.iceberg sink")


# -- schema mapping -------------------------------------------------------------------------


def _primitive(dtype: T.DataType, name: str) -> Any:
    from pyiceberg import types as it

    mapping: list[tuple[type, Any]] = [
        (T.BooleanType, it.BooleanType()), (T.ByteType, it.IntegerType()), (T.ShortType, it.IntegerType()),
        (T.IntegerType, it.IntegerType()), (T.LongType, it.LongType()), (T.FloatType, it.FloatType()),
        (T.DoubleType, it.DoubleType()), (T.StringType, it.StringType()), (T.BinaryType, it.BinaryType()),
        (T.DateType, it.DateType()), (T.TimestampType, it.TimestamptzType()),
        (T.TimestampNTZType, it.TimestampType()),
    ]
    for spark_type, iceberg_type in mapping:
        if isinstance(dtype, spark_type):
            return iceberg_type
    if isinstance(dtype, T.DecimalType):
        return it.DecimalType(dtype.precision, dtype.scale)
    raise ConfigError(
        f"flinkish.iceberg sink: column {name!r} has the Spark type {dtype.simpleString()}, which this sink "
        "does not map to Iceberg (supported: boolean, tinyint..bigint, float, double, decimal, string, binary, "
        "date, timestamp, timestamp_ntz). Cast or drop the column."
    )


def iceberg_schema(schema: StructType) -> Any:
    """The Spark schema as an Iceberg schema, field ids 1..n in column order (all columns optional)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    fields = [NestedField(i, f.name, _primitive(f.dataType, f.name), required=False)
              for i, f in enumerate(schema.fields, start=1)]
    return Schema(*fields)


def _shape(schema: Any) -> list[tuple[str, str]]:
    return [(f.name, str(f.field_type)) for f in schema.fields]


def _committed_epoch(table: Any, uid: str) -> int:
    """The newest epoch ``uid`` committed, walking the ancestry only back to it (-1: none)."""
    from pyiceberg.table.snapshots import ancestors_of

    def epoch_of(snapshot: Any) -> int | None:
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        return int(props.get(EPOCH_PROPERTY, -1)) if props.get(UID_PROPERTY) == uid else None

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        found = epoch_of(snapshot)
        if found is not None:
            return found
    # The chain can end early where expiry removed other writers' snapshots (retainSnapshots
    # keeps each uid's newest one, but not the links to it): look at every snapshot.
    return max((e for e in map(epoch_of, table.snapshots()) if e is not None), default=-1)


def _data_file(f: "IcebergFile", spec_id: int) -> Any:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=f.path, file_format=FileFormat.PARQUET, partition=Record(*f.partition),
        file_size_in_bytes=f.size, sort_order_id=None, spec_id=spec_id, equality_ids=None, key_metadata=None,
        **dict(f.statistics))


_CATALOGS: dict[str, Any] = {}
_CATALOGS_LOCK = threading.Lock()
# The table as this process last committed or read it, per (catalog, table, uid): a commit
# starts from it instead of loading the metadata again; when another writer moved the
# table, the commit's requirement fails and the table is loaded afresh.
_TABLES: dict[tuple[str, str, str], Any] = {}


class IcebergSink(TwoPhaseCommitSink[IcebergCommittable]):
    def __init__(self, catalog_properties: dict[str, str], identifier: str, uid: str, schema: StructType,
                 partition_by: tuple[str, ...], io: FileIO, info: TableInfo | None = None,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
                 retain_snapshots: int = DEFAULT_RETAIN_SNAPSHOTS) -> None:
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
        # The epoch this object last made visible, with its data files (cleanup spares them).
        self._committed_here: dict[int, frozenset[str]] = {}

    @classmethod
    def at(cls, table: str, uid: str, schema: StructType, checkpoint: str | None = None, catalog: str | None = None,
           catalog_uri: str | None = None, warehouse: str | None = None, partition_by: tuple[str, ...] = (),
           create_table: bool = True, rows_per_file: int = DEFAULT_ROWS_PER_FILE,
           target_file_size: int = DEFAULT_TARGET_FILE_SIZE, retain_snapshots: int = DEFAULT_RETAIN_SNAPSHOTS,
           options: dict[str, str] | None = None) -> "IcebergSink":
        """A sink for :func:`flinkish_spark.transactional` (foreachBatch); checks or creates the table now.

        Without ``catalog``/``catalog_uri`` the embedded SQLite catalog lives in ``checkpoint``.
        """
        opts = dict(options or {})
        props = catalog_properties(catalog, catalog_uri, warehouse, checkpoint, opts, "IcebergSink.at()")
        io = FileIO.for_url(props.get("warehouse") or ".", storage_options_from(opts, props.get("warehouse") or "."))
        sink = cls(props, _identifier(table, "IcebergSink.at()"), uid, schema, tuple(partition_by), io,
                   rows_per_file=rows_per_file, target_file_size=target_file_size, retain_snapshots=retain_snapshots)
        sink.info = sink.ensure_table(create_table, "IcebergSink.at()")
        sink.io = FileIO.for_url(sink.info.location, storage_options_from(opts, sink.info.location), what="table location")
        return sink

    # -- the table (driver) ------------------------------------------------------------------

    def catalog(self) -> Any:
        """The catalog, made once per process: a SQL catalog builds an engine, a REST one logs in."""
        _pyiceberg()
        from pyiceberg.catalog import load_catalog

        key = json.dumps(self.catalog_properties, sort_keys=True)
        with _CATALOGS_LOCK:
            catalog = _CATALOGS.get(key)
            if catalog is None:
                props = dict(self.catalog_properties)
                name = props.pop("name")
                catalog = _CATALOGS[key] = load_catalog(name, **props)
            return catalog

    def _table_key(self) -> tuple[str, str, str]:
        return json.dumps(self.catalog_properties, sort_keys=True), self.identifier, self.uid

    def table(self, refresh: bool = True) -> Any:
        """The table: loaded from the catalog, or (``refresh=False``) as this process last saw it."""
        key = self._table_key()
        with _CATALOGS_LOCK:
            table = None if refresh else _TABLES.get(key)
        if table is None:
            table = self.catalog().load_table(self.identifier)
            with _CATALOGS_LOCK:
                _TABLES[key] = table
        return table

    def _forget_table(self) -> None:
        with _CATALOGS_LOCK:
            _TABLES.pop(self._table_key(), None)

    def ensure_table(self, create: bool, component: str) -> TableInfo:
        """Validate the table against the query -- or create it -- before any task writes."""
        _pyiceberg()
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.transforms import IdentityTransform

        catalog = self.catalog()
        wanted = iceberg_schema(self.spark_schema)
        try:
            table = self.table()
        except NoSuchTableError:
            if not create:
                raise TableMismatchError(
                    f"{component}: the Iceberg table {self.identifier!r} does not exist in the catalog "
                    f"{self.catalog_properties['name']!r} and createTable is false; create it first or set createTable to true"
                ) from None
            spec = PartitionSpec(*[
                PartitionField(wanted.find_field(c).field_id, PARTITION_FIELD_ID_START + i, IdentityTransform(), c)
                for i, c in enumerate(self.partition_by)
            ])
            namespace = self.identifier.rsplit(".", 1)[0]
            try:
                catalog.create_namespace(namespace)
            except NamespaceAlreadyExistsError:
                pass
            try:
                catalog.create_table(self.identifier, schema=wanted, partition_spec=spec,
                                     properties=CREATED_TABLE_PROPERTIES)
            except TableAlreadyExistsError:  # another query created it at the same moment
                pass
            table = self.table()
        if not supported(table):
            raise TableMismatchError(
                f"{component}: the Iceberg table {self.identifier!r} has format version "
                f"{table.metadata.format_version}; pyiceberg writes manifests for versions 1 and 2 only"
            )
        have = table.schema()
        if _shape(have) != _shape(wanted):
            raise TableMismatchError(
                f"{component}: the Iceberg table {self.identifier!r} has the schema {_shape(have)}, but the query "
                f"writes {_shape(wanted)}. Write to a new table, or select and cast the columns to the table's schema."
            )
        parts = []
        for field in table.spec().fields:
            if str(field.transform) != "identity":
                parts.append(f"{field.transform}({have.find_column_name(field.source_id)})")
            else:
                parts.append(have.find_column_name(field.source_id))
        if tuple(parts) != self.partition_by:
            raise TableMismatchError(
                f"{component}: the Iceberg table {self.identifier!r} is partitioned by {parts}, but the option "
                f"'partitionBy' asks for {list(self.partition_by)}. Use the table's identity partition columns."
            )
        return TableInfo(table.location(), have.model_dump_json(), table.spec().model_dump_json(),
                         tuple(sorted(table.properties.items())))

    # -- prepare (executors) -----------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> IcebergCommittable | None:
        from pyiceberg.io.pyarrow import (
            compute_statistics_plan,
            data_file_statistics_from_parquet_metadata,
            parquet_path_to_id_mapping,
            schema_to_pyarrow,
        )
        from pyiceberg.partitioning import PartitionSpec
        from pyiceberg.schema import Schema

        if self.info is None:
            raise RuntimeError("IcebergSink.prepare() before the table was resolved on the driver")
        schema = Schema.model_validate_json(self.info.schema_json)
        spec = PartitionSpec.model_validate_json(self.info.spec_json)
        target = schema_to_pyarrow(schema)  # carries the field ids readers resolve columns by

        def with_field_ids(table: pa.Table) -> pa.Table:
            return table.select(target.names).cast(target)

        folder = epoch_dir(self.info.location.rstrip("/"), DATA_PREFIX, self.uid, ctx.epoch)
        written = write_files(self.io, folder, batches, ctx, self.partition_by, drop_partition_columns=False,
                              rows_per_file=self.rows_per_file, target_file_size=self.target_file_size,
                              prepare_table=with_field_ids)
        if not written:
            return None
        properties = dict(self.info.properties)
        files = []
        for f in written:
            stats = data_file_statistics_from_parquet_metadata(
                parquet_metadata=f.metadata, stats_columns=compute_statistics_plan(schema, properties),
                parquet_column_mapping=parquet_path_to_id_mapping(schema))
            record = stats.partition(spec, schema)
            partition = tuple(record[i] for i in range(len(record))) if spec.fields else ()
            files.append(IcebergFile(f.url, f.size, partition, tuple(stats.to_serialized_dict().items())))
        return IcebergCommittable(tuple(files))

    # -- commit / abort / cleanup (driver) ------------------------------------------------------

    def commit(self, committables: list[IcebergCommittable], epoch: int) -> CommitOutcome:
        _pyiceberg()
        from pyiceberg.exceptions import CommitFailedException

        files = [f for c in committables for f in c.files]
        table = self.table(refresh=False)
        for attempt in range(10):
            # The check and the commit see the same table state: the commit asserts that
            # main still points where it pointed here, so a stale cached table can only
            # make the commit fail (and be re-checked), never append an epoch twice.
            if _committed_epoch(table, self.uid) >= epoch:
                return "ALREADY_COMMITTED"
            if not files:
                self._committed_here = {epoch: frozenset()}
                return "COMMITTED"  # an empty epoch adds no snapshot
            try:
                spec_id = self._spec_id(table)
                append_snapshot(self.catalog(), table, [_data_file(f, spec_id) for f in files], spec_id,
                                {UID_PROPERTY: self.uid, EPOCH_PROPERTY: str(epoch)},
                                retain=self.retain_snapshots, protect_property=UID_PROPERTY,
                                delete_files=self._delete_quietly)
                self._committed_here = {epoch: frozenset(f.path for f in files)}
                return "COMMITTED"
            except CommitFailedException:
                # Another writer committed first (or our own commit landed and its answer
                # was lost): re-read the table and check again.
                time.sleep(min(0.05 * 2 ** attempt, 2.0))
                table = self.table(refresh=True)
            except BaseException:
                self._forget_table()
                raise
        return "RETRY_LATER"

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

    def abort(self, committables: list[IcebergCommittable], epoch: int) -> None:
        self.io.delete_many([f.path for c in committables for f in c.files])

    def cleanup(self, epoch: int, keep: list[IcebergCommittable]) -> None:
        if self.info is None:
            return
        named = self._added_by_table(epoch)
        if named is None:
            return  # the table has the epoch, its files are no longer known: never delete by listing
        wanted = {self.io.strip(p) for p in named} | {self.io.strip(f.path) for c in keep for f in c.files}
        folder = epoch_dir(self.info.location.rstrip("/"), DATA_PREFIX, self.uid, epoch)
        self.io.delete_many([self.io.url(p) for p in self.io.find(folder) if p not in wanted])
        self.io.remove_empty_dirs(folder)


    def _added_by_table(self, epoch: int) -> set[str] | None:
        """The data files the table's snapshot of ``epoch`` added: none when the table does not
        hold the epoch, None when it does but the snapshot is gone (expired by another tool)."""
        if epoch in self._committed_here:
            return set(self._committed_here[epoch])
        table = self.table()
        if _committed_epoch(table, self.uid) < epoch:
            return set()
        return _added_files(table, self.uid, epoch)

    def last_committed_epoch(self) -> int:
        """The newest epoch of this uid in the table's snapshots (-1: none, or no table yet)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return _committed_epoch(self.table(), self.uid)
        except NoSuchTableError:
            return -1


def _added_files(table: Any, uid: str, epoch: int) -> set[str] | None:
    """The data files that the snapshot of (``uid``, ``epoch``) added, from its own manifests."""
    from pyiceberg.manifest import ManifestEntryStatus

    snapshot = next((s for s in table.snapshots() if s.summary is not None
                     and s.summary.additional_properties.get(UID_PROPERTY) == uid
                     and s.summary.additional_properties.get(EPOCH_PROPERTY) == str(epoch)), None)
    if snapshot is None:
        return None
    added: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id:
                added.add(entry.data_file.file_path)
    return added


def _identifier(table: str | None, component: str) -> str:
    if not table or "." not in table.strip(".") or any(not part for part in table.split(".")):
        raise ConfigError(f"{component}: 'table' must be namespace.name (e.g. 'db.orders'), got {table!r}")
    return table


def catalog_properties(catalog: str | None, catalog_uri: str | None, warehouse: str | None, checkpoint: str | None,
                       options: dict[str, str], component: str) -> dict[str, str]:
    """pyiceberg catalog properties for the options, with the storage options in pyiceberg's form."""
    _pyiceberg()
    from pyiceberg.utils.config import Config

    if catalog and catalog_uri:
        raise ConfigError(f"{component}: set either 'catalog' or 'catalogUri', not both")
    if catalog:
        config = Config()
        if config.get_catalog_config(catalog) is None:
            known = config.get_known_catalogs()
            raise ConfigError(
                f"{component}: unknown Iceberg catalog {catalog!r}: no entry in .pyiceberg.yaml or "
                f"PYICEBERG_CATALOG__{catalog.upper()}__* variables (known: {known or 'none'}). Configure it, or "
                "use 'catalogUri' and 'warehouse' for a SQL catalog."
            )
        props: dict[str, str] = {"name": catalog}
        if warehouse:
            props["warehouse"] = warehouse
    elif catalog_uri:
        if not warehouse:
            raise ConfigError(f"{component}: 'catalogUri' needs 'warehouse' (where the table data goes)")
        props = {"name": "flinkish", "type": "sql", "uri": catalog_uri, "warehouse": warehouse}
    else:
        if not checkpoint or protocol_of(checkpoint) not in ("file", "local"):
            raise ConfigError(
                f"{component}: the embedded Iceberg catalog (SQLite) needs a local checkpoint folder, got "
                f"{checkpoint!r}; set 'catalog' or 'catalogUri' + 'warehouse' for tables on S3"
            )
        root = checkpoint[len("file://"):] if checkpoint.startswith("file://") else checkpoint
        folder = os.path.abspath(join(root, "iceberg"))
        os.makedirs(folder, exist_ok=True)
        props = {"name": "flinkish", "type": "sql", "uri": f"sqlite:///{folder}/catalog.db",
                 "warehouse": warehouse or f"file://{folder}/warehouse"}
    where = props.get("warehouse")
    if where and protocol_of(where) == "s3":
        props.update(iceberg_io_properties(storage_options_from(options, where)))
    return props


class IcebergSinkDataSource(TwoPhaseCommitDataSource):
    """``df.writeStream.format("flinkish.iceberg")``."""

    KIND = "flinkish.iceberg"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ("table", "catalog", "catalogUri", "warehouse", "partitionBy",
                                                "createTable", "rowsPerFile", "targetFileSize", "retainSnapshots")

    def configure(self, opts: Options) -> None:
        component = f"{self.name()} sink"
        self.identifier = _identifier(opts.required("table", "the Iceberg table as namespace.name, e.g. 'db.orders'"), component)
        raw = opts.get("partitionBy") or ""
        self.partition_by = tuple(c.strip() for c in raw.split(",") if c.strip())
        self.create_table = opts.boolean("createTable", True)
        self.rows_per_file = opts.integer("rowsPerFile", DEFAULT_ROWS_PER_FILE, minimum=1) or DEFAULT_ROWS_PER_FILE
        self.target_file_size = parse_size(opts, "targetFileSize", DEFAULT_TARGET_FILE_SIZE)
        retain = opts.integer("retainSnapshots", DEFAULT_RETAIN_SNAPSHOTS, minimum=0)
        self.retain_snapshots = DEFAULT_RETAIN_SNAPSHOTS if retain is None else retain
        self.catalog_props = catalog_properties(opts.get("catalog"), opts.get("catalogUri"), opts.get("warehouse"),
                                                self.checkpoint_root, self.raw_options, component)
        warehouse = self.catalog_props.get("warehouse") or self.checkpoint_root
        self.data_io = FileIO.for_url(warehouse, storage_options_from(self.raw_options, warehouse), what="option 'warehouse'")
        self.data_io.check_writable_root(warehouse, "option 'warehouse'")
        self.info: TableInfo | None = None

    def sink(self, schema: StructType) -> IcebergSink:
        missing = [c for c in self.partition_by if c not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' names {missing}, which the query does not have ({schema.simpleString()})")
        return IcebergSink(self.catalog_props, self.identifier, self.uid, schema, self.partition_by, self.data_io,
                           self.info, self.rows_per_file, self.target_file_size, self.retain_snapshots)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        # On the driver before any task: resolve (or create) the table; executors get its
        # location, schema and spec with the writer, never touching the catalog.
        self.info = self.sink(schema).ensure_table(self.create_table, f"{self.name()} sink")
        location = self.info.location
        self.data_io = FileIO.for_url(location, storage_options_from(self.raw_options, location), what="table location")
        return super().streamWriter(schema, overwrite)
