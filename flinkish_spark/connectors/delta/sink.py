"""``flinkish.delta``: exactly-once appends to a Delta Lake table with delta-rs (no JVM jar).

* **Prepare** (executors): each task writes its rows as Parquet data files straight into
  the table folder, below ``<path>/flinkish/<uid>/e<epoch>/[k=v/]``, and returns their
  Delta add actions (path, size, partition values, statistics). No log entry names the
  files yet, so no Delta reader sees them.
* **Commit** (driver, after the decision is recorded): one Delta transaction per epoch
  with every add action of the epoch and the application transaction
  ``txn(appId = sink uid, version = epoch)`` -- what Spark's own Delta streaming sink
  writes. It is a *blind append* written by :mod:`flinkish_spark.connectors.delta.log`:
  put-if-absent of the next log version, O(1) per commit whatever the table's history
  (delta-rs's own commit rebuilds its list of every live file each time). Appends of
  other writers do not conflict with it; the commit reads theirs and takes the next
  version. Tables whose protocol needs more of a writer (constraints, generated or
  identity columns, column mapping, row tracking, ...) are committed through delta-rs.
* **Idempotence**: the driver knows the table's ``txn`` version of the uid (read with
  delta-rs once per process, then advanced by every commit it writes or reads); when it
  is already >= the epoch, the epoch is in the table and the commit answers
  ``ALREADY_COMMITTED`` without writing. The check and the txn action live in the same
  log, so a crash between the table commit and the sink's own ``done`` marker (or
  Spark's commit log) never appends an epoch twice; a commit of ours whose answer was
  lost is found in the log when the put-if-absent loses against it.
* **Abort / cleanup**: files of an epoch that no decided add action names (failed task
  attempts, a crashed run's prepare) are deleted by listing the epoch's folder -- never a
  file that the table's commit of the epoch added, whatever the decision says: when the
  table holds the epoch, that commit is read from the log (or known, when this object
  wrote it), and when it cannot be found nothing of the epoch is deleted.
* **The target's record** (:meth:`DeltaSink.last_committed_epoch`): the uid's txn version,
  which the framework asks when the sink's metadata is missing or belongs to another
  Spark query (see :mod:`flinkish_spark.sink.incarnation`).

Every ``checkpointInterval`` table versions (default 10) the driver writes a Delta
checkpoint, so a reader (or a restart) replays at most that many commits. A checkpoint
lists every live file: it costs O(live files) (delta-rs loads them all first).
``compactEvery`` (default 0: off) runs delta-rs's ``optimize.compact`` every N versions,
which bounds the live files (it adds versions of its own; removed files stay until a
``VACUUM``).

Options: ``uid``, ``path`` (local or ``s3://``), ``partitionBy``, ``createTable``
(default true), ``checkpoint``, ``checkpointInterval``, ``compactEvery``,
``rowsPerFile``, ``targetFileSize``, and the storage options ``endpointUrl``,
``region``, ``storageOptions``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Iterator

import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.connectors.delta.log import (
    DeltaLog,
    LogHead,
    StaleHead,
    TableChanged,
    add_action,
    blind_append_supported,
)
from flinkish_spark.connectors.parquet_sink import parse_size
from flinkish_spark.connectors.lakehouse.files import (
    DEFAULT_ROWS_PER_FILE,
    DEFAULT_TARGET_FILE_SIZE,
    WrittenFile,
    delta_storage_options,
    epoch_dir,
    require,
    write_files,
)
from flinkish_spark.errors import ConfigError, StorageUnavailableError, TableMismatchError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.options import Options
from flinkish_spark.sink.datasource import TwoPhaseCommitDataSource
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

log = logging.getLogger(__name__)

DATA_PREFIX = "flinkish"
DEFAULT_CHECKPOINT_INTERVAL = 10
EXTRA = "delta"


@dataclass(frozen=True)
class DeltaFile:
    """One prepared data file, as its Delta add action will name it."""

    path: str  # relative to the table root
    size: int
    rows: int
    partition_values: tuple[tuple[str, str | None], ...]
    stats: str


@dataclass(frozen=True)
class DeltaCommittable:
    files: tuple[DeltaFile, ...]


def _deltalake() -> Any:
    return require("deltalake", EXTRA, "the flinkish.delta sink")


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark hands timestamps over in UTC; the zone only tells Delta/Iceberg "with time zone".
    return to_arrow_schema(schema, timezone="UTC")


def _type_names(schema: Any) -> list[tuple[str, str]]:
    """(name, type) per field of a deltalake Schema: what must agree for an append."""
    return [(f.name, str(f.type)) for f in schema.fields]


# Per driver process: the delta-rs table (loaded once, for validation and checkpoints)
# and, per sink uid, the head of the log that blind appends continue from.
_TABLES: dict[tuple[str, str], Any] = {}
_HEADS: dict[tuple[str, str, str], "_Head"] = {}
_TABLES_LOCK = threading.Lock()


@dataclass
class _Head:
    """A uid's view of the log, and whether blind appends may be used on the table."""

    log: LogHead
    blind_append: bool
    validated: tuple[str, tuple[str, ...]]  # (schema, partition columns) checked against the table


class DeltaSink(TwoPhaseCommitSink[DeltaCommittable]):
    def __init__(self, io: FileIO, path: str, uid: str, schema: pa.Schema, partition_by: tuple[str, ...],
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL, compact_every: int = 0,
                 rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE) -> None:
        self.io = io
        self.path = path.rstrip("/")
        self.uid = uid
        self.schema = schema
        self.partition_by = partition_by
        self.checkpoint_interval = checkpoint_interval
        self.compact_every = compact_every
        self.rows_per_file = rows_per_file
        self.target_file_size = target_file_size
        self.storage_options = delta_storage_options(io.storage_options) if io.protocol == "s3" else {}
        # The epoch this object last made visible, with the files its commit added (cleanup spares them).
        self._committed_here: dict[int, frozenset[str]] = {}

    @classmethod
    def at(cls, path: str, uid: str, schema: StructType, partition_by: tuple[str, ...] = (), create_table: bool = True,
           checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL, compact_every: int = 0,
           rows_per_file: int = DEFAULT_ROWS_PER_FILE, target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
           options: dict[str, str] | None = None) -> "DeltaSink":
        """A sink for :func:`flinkish_spark.transactional` (foreachBatch); checks or creates the table now."""
        io = FileIO.for_url(path, storage_options_from(options or {}, path), what="path")
        io.check_writable_root(path, "path")
        sink = cls(io, path, uid, arrow_schema(schema), tuple(partition_by), checkpoint_interval, compact_every,
                   rows_per_file, target_file_size)
        sink.ensure_table(create_table, "DeltaSink.at()")
        return sink

    @property
    def table_uri(self) -> str:
        return self.io.url(self.io.strip(self.path)) if self.io.protocol == "s3" else self.io.strip(self.path)

    # -- the table (driver) ------------------------------------------------------------------

    def _key(self) -> tuple[str, str]:
        return self.table_uri, json.dumps(self.storage_options, sort_keys=True)

    def table(self, refresh: bool = True) -> Any:
        """The delta-rs table, loaded once per driver process and brought up to date incrementally.

        Loading and updating cost O(live files) (delta-rs materialises the file list):
        used at start, for validation after another writer changed the table, and for
        checkpoints -- never on the per-epoch path of a blind append.
        """
        deltalake = _deltalake()
        key = self._key()
        with _TABLES_LOCK:
            table = _TABLES.get(key)
            if table is None:
                table = deltalake.DeltaTable(self.table_uri, storage_options=self.storage_options or None)
                _TABLES[key] = table
            elif refresh:
                table.update_incremental()
            return table

    def _head_key(self) -> tuple[str, str, str]:
        return self.table_uri, json.dumps(self.storage_options, sort_keys=True), self.uid

    def _head(self) -> _Head | None:
        with _TABLES_LOCK:
            return _HEADS.get(self._head_key())

    def _forget_head(self, table_too: bool = False) -> None:
        """Drop the uid's head; ``table_too``: and the delta-rs table (another table at this path)."""
        with _TABLES_LOCK:
            _HEADS.pop(self._head_key(), None)
            if table_too:
                _TABLES.pop(self._key(), None)
                for key in [k for k in _HEADS if k[:2] == self._key()]:
                    _HEADS.pop(key)

    def ensure_table(self, create: bool, component: str) -> None:
        """Validate the table against the query -- or create it -- before any task writes.

        Raises TableMismatchError for a folder that is not a Delta table, another schema or
        other partition columns; nothing is written then. Once validated in this process,
        a later call only checks that the head's commit is still there (one GET: a table
        deleted and created again is reloaded) and reads the commits other writers added
        since (O(their number)), and validates again only if one of them changed the
        metadata or protocol.
        """
        wanted_shape = (self.schema.to_string(), self.partition_by)
        head = self._head()
        if head is not None and not DeltaLog(self.io, self.path).same_table(head.log):
            self._forget_head(table_too=True)  # deleted and created again: another table
            head = None
        if head is not None and head.validated == wanted_shape:
            try:
                if head.blind_append:
                    DeltaLog(self.io, self.path).catch_up(head.log, self.uid)
                return
            except (TableChanged, StaleHead):
                self._forget_head()
        table = self._validate(create, component)
        self._set_head(table, wanted_shape)

    def _set_head(self, table: Any, validated: tuple[str, tuple[str, ...]]) -> _Head:
        head = _Head(LogHead(table.version(), committed_version(table, self.uid)),
                     blind_append_supported(table.protocol(), table.schema()), validated)
        with _TABLES_LOCK:
            _HEADS[self._head_key()] = head
        return head

    def _validate(self, create: bool, component: str) -> Any:
        deltalake = _deltalake()
        try:
            table = self.table()
        except deltalake.exceptions.TableNotFoundError:
            table = None
        except OSError as exc:
            raise StorageUnavailableError(f"{component}: the Delta table {self.path!r} could not be read: {exc}") from None
        if table is None:
            others = [n for n in self.io.list_names(self.path) if n != DATA_PREFIX]
            if others:
                raise TableMismatchError(
                    f"{component}: {self.path!r} is not a Delta table (no _delta_log) but holds other files "
                    f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}). Point 'path' at a Delta "
                    "table or at an empty or new folder."
                )
            if not create:
                raise TableMismatchError(
                    f"{component}: there is no Delta table at {self.path!r} and createTable is false; "
                    "create the table first or set createTable to true"
                )
            try:
                deltalake.DeltaTable.create(self.table_uri, self.schema, mode="ignore", partition_by=list(self.partition_by) or None,
                                            storage_options=self.storage_options or None)
            except deltalake.exceptions.DeltaError:
                pass  # another query created it at the same moment: validated below like any table
            table = self.table()
        wanted = _type_names(deltalake.Schema.from_arrow(self.schema))
        have = _type_names(table.schema())
        if wanted != have:
            raise TableMismatchError(
                f"{component}: the Delta table {self.path!r} has the schema {have}, but the query writes {wanted}. "
                "Write to a new table, or select and cast the columns to the table's schema."
            )
        parts = tuple(table.metadata().partition_columns)
        if parts != self.partition_by:
            raise TableMismatchError(
                f"{component}: the Delta table {self.path!r} is partitioned by {list(parts)}, but the option "
                f"'partitionBy' asks for {list(self.partition_by)}. Use the table's partition columns."
            )
        return table

    # -- prepare (executors) -----------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> DeltaCommittable | None:
        folder = epoch_dir(self.path, DATA_PREFIX, self.uid, ctx.epoch)
        written = write_files(self.io, folder, batches, ctx, self.partition_by, drop_partition_columns=True,
                              rows_per_file=self.rows_per_file, target_file_size=self.target_file_size)
        if not written:
            return None
        root = self.io.strip(self.path).rstrip("/") + "/"
        files = tuple(
            DeltaFile(self.io.strip(f.url)[len(root):], f.size, f.rows,
                      tuple((c, _partition_value(v)) for c, v in f.partition), delta_stats(f))
            for f in written
        )
        return DeltaCommittable(files)

    # -- commit / abort / cleanup (driver) ------------------------------------------------------

    def commit(self, committables: list[DeltaCommittable], epoch: int) -> CommitOutcome:
        files = [f for c in committables for f in c.files]
        for _ in range(3):
            head = self._head()
            if head is None:
                # First commit in this process, or the table changed: read the table once.
                head = self._set_head(self._validate(False, "flinkish.delta commit"),
                                      (self.schema.to_string(), self.partition_by))
            if head.log.txn >= epoch:
                return "ALREADY_COMMITTED"
            if not files:
                self._committed_here = {epoch: frozenset()}
                return "COMMITTED"  # an empty epoch adds no version
            if not head.blind_append:
                return self._commit_with_delta_rs(files, epoch)
            now = int(time.time() * 1000)
            actions = [add_action(f.path, f.size, dict(f.partition_values), f.stats, now) for f in files]
            try:
                outcome = DeltaLog(self.io, self.path).append(
                    head.log, self.uid, epoch, actions, {"flinkish.uid": self.uid, "flinkish.epoch": epoch})
            except (TableChanged, StaleHead):
                self._forget_head()  # re-validate against the changed table, then append again
                continue
            except StorageUnavailableError:
                self._forget_head()  # the put may have landed: the next attempt re-reads the log
                return "RETRY_LATER"
            if outcome == "COMMITTED":
                self._committed_here = {epoch: frozenset(f.path for f in files)}
                self._after_commit(head.log.version)
            return outcome
        return "RETRY_LATER"

    def _after_commit(self, version: int) -> None:
        """Table maintenance on the versions that are multiples of its interval (O(live files) each).

        The epoch is committed already: a failure here is logged, not raised (the next
        interval tries again; readers only replay more commits meanwhile).
        """
        from deltalake.transaction import PostCommitHookProperties

        try:
            if self.checkpoint_interval and version % self.checkpoint_interval == 0:
                self.table().create_checkpoint()
            if self.compact_every and version % self.compact_every == 0:
                self.table().optimize.compact(post_commithook_properties=PostCommitHookProperties(create_checkpoint=False))
        except Exception as exc:  # noqa: BLE001 - see above
            log.warning("flinkish.delta: table maintenance after version %d of %s failed: %s", version, self.path, exc)

    def _commit_with_delta_rs(self, files: list[DeltaFile], epoch: int) -> CommitOutcome:
        """The commit for tables whose protocol asks more of a writer than a blind append gives."""
        deltalake = _deltalake()
        from deltalake.transaction import AddAction, CommitProperties, PostCommitHookProperties, Transaction

        table = self.table()
        if committed_version(table, self.uid) >= epoch:
            return "ALREADY_COMMITTED"
        now = int(time.time() * 1000)
        actions = [AddAction(f.path, f.size, dict(f.partition_values), now, True, f.stats) for f in files]
        try:
            table.create_write_transaction(
                actions, "append", self.schema, list(self.partition_by) or None,
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(self.uid, epoch)],
                    custom_metadata={"flinkish.uid": self.uid, "flinkish.epoch": epoch},
                    max_commit_retries=20),
                # Checkpoints are ours (checkpointInterval): delta-rs's default interval is 100.
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False),
            )
        except deltalake.exceptions.CommitFailedError:
            # A commit of ours whose answer was lost, or conflicts beyond the retries:
            # the table's txn says which.
            self._forget_head()
            if committed_version(self.table(), self.uid) >= epoch:
                return "ALREADY_COMMITTED"
            return "RETRY_LATER"
        self._committed_here = {epoch: frozenset(f.path for f in files)}
        table.update_incremental()
        self._forget_head()  # re-read with the table at the next commit
        self._after_commit(table.version())
        return "COMMITTED"

    def abort(self, committables: list[DeltaCommittable], epoch: int) -> None:
        self.io.delete_many([self._url(f.path) for c in committables for f in c.files])

    def cleanup(self, epoch: int, keep: list[DeltaCommittable]) -> None:
        named = self._added_by_table(epoch)
        if named is None:
            # The table holds the epoch but its commit cannot be read (log cleanup): deleting
            # by listing could remove committed data. Leave the folder.
            return
        wanted = {self.io.strip(self._url(p)) for p in named} | {self.io.strip(self._url(f.path)) for c in keep for f in c.files}
        folder = epoch_dir(self.path, DATA_PREFIX, self.uid, epoch)
        self.io.delete_many([self.io.url(p) for p in self.io.find(folder) if p not in wanted])
        self.io.remove_empty_dirs(folder)

    def _added_by_table(self, epoch: int) -> set[str] | None:
        """The files (relative paths) the table's commit of ``epoch`` added: none when the table
        does not hold the epoch, None when it does but its commit cannot be read."""
        if epoch in self._committed_here:
            return set(self._committed_here[epoch])
        if self.last_committed_epoch() < epoch:
            return set()
        head = self._head()
        newest = head.log.version if head is not None else int(self.table().version())
        return DeltaLog(self.io, self.path).added_by(self.uid, epoch, newest)

    def last_committed_epoch(self) -> int:
        """The table's txn version of this uid, read from the log's newest state (-1: none, or no table)."""
        head = self._head()
        if head is not None and not DeltaLog(self.io, self.path).same_table(head.log):
            self._forget_head(table_too=True)
            head = None
        if head is not None and head.blind_append:
            try:
                DeltaLog(self.io, self.path).catch_up(head.log, self.uid)
                return head.log.txn
            except (TableChanged, StaleHead):
                self._forget_head()
        deltalake = _deltalake()
        try:
            return committed_version(self.table(), self.uid)
        except deltalake.exceptions.TableNotFoundError:
            return -1

    def _url(self, relative: str) -> str:
        return f"{self.path}/{relative}"

    def encode(self, committable: DeltaCommittable) -> bytes:
        return json.dumps([[f.path, f.size, f.rows, [list(p) for p in f.partition_values], f.stats]
                           for f in committable.files]).encode()

    def decode(self, data: bytes) -> DeltaCommittable:
        return DeltaCommittable(tuple(DeltaFile(p, s, r, tuple((c, v) for c, v in pv), st)
                                      for p, s, r, pv, st in json.loads(data)))


def committed_version(table: Any, uid: str) -> int:
    """The last epoch the table holds for ``uid`` (its txn version), -1 for none."""
    version = table.transaction_version(uid)
    return -1 if version is None else int(version)


def _partition_value(value: Any) -> str | None:
    """Delta's partition value serialisation (protocol: "Partition Value Serialization")."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _stat_value(value: Any) -> Any:
    """A min/max statistic as Delta stores it, or None when it is safer to leave it out.

    Timestamps are left out: Delta keeps them in milliseconds, and a truncated maximum
    would make readers skip files that hold matching rows.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal) or isinstance(value, dt.datetime):
        return None
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return value if len(value) <= 32 else None
    return None


def delta_stats(f: WrittenFile) -> str:
    """numRecords, nullCount and (where exact) minValues/maxValues from the Parquet footer."""
    md = f.metadata
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    if md is not None:
        schema = md.schema
        for j in range(md.num_columns):
            column = schema.column(j)
            if "." in column.path:
                continue  # nested fields: no statistics
            name = column.path
            lo: Any = None
            hi: Any = None
            null_count = 0
            exact = True
            for i in range(md.num_row_groups):
                st = md.row_group(i).column(j).statistics
                if st is None or not st.has_null_count:
                    exact = False
                    break
                null_count += st.null_count
                if st.has_min_max:
                    a, b = _stat_value(st.min), _stat_value(st.max)
                    if a is None or b is None:
                        exact = False
                        continue
                    lo = a if lo is None or a < lo else lo
                    hi = b if hi is None or b > hi else hi
            if not exact and lo is None:
                continue
            nulls[name] = null_count
            if exact and lo is not None:
                mins[name], maxs[name] = lo, hi
    return json.dumps({"numRecords": f.rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


class DeltaSinkDataSource(TwoPhaseCommitDataSource):
    """``df.writeStream.format("flinkish.delta")``."""

    KIND = "flinkish.delta"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ("partitionBy", "createTable", "checkpointInterval", "compactEvery",
                                                "rowsPerFile", "targetFileSize")

    def configure(self, opts: Options) -> None:
        self.path = opts.required("path", "the Delta table's folder, e.g. .option('path', 's3://b/tables/orders')").rstrip("/")
        raw = opts.get("partitionBy") or ""
        self.partition_by = tuple(c.strip() for c in raw.split(",") if c.strip())
        self.create_table = opts.boolean("createTable", True)
        self.checkpoint_interval = opts.integer("checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL, minimum=0)
        self.compact_every = opts.integer("compactEvery", 0, minimum=0) or 0
        self.rows_per_file = opts.integer("rowsPerFile", DEFAULT_ROWS_PER_FILE, minimum=1) or DEFAULT_ROWS_PER_FILE
        self.target_file_size = parse_size(opts, "targetFileSize", DEFAULT_TARGET_FILE_SIZE)
        self.data_io = FileIO.for_url(self.path, storage_options_from(self.raw_options, self.path), what="option 'path'")
        self.data_io.check_writable_root(self.path, "option 'path'")
        _deltalake()  # a missing package fails at start(), not in the first batch

    def sink(self, schema: StructType) -> DeltaSink:
        missing = [c for c in self.partition_by if c not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' names {missing}, which the query does not have ({schema.simpleString()})")
        if self.partition_by and len(self.partition_by) == len(schema.fieldNames()):
            raise ConfigError(f"{self.name()} sink: option 'partitionBy' cannot name every column")
        return DeltaSink(self.data_io, self.path, self.uid, arrow_schema(schema), self.partition_by,
                         DEFAULT_CHECKPOINT_INTERVAL if self.checkpoint_interval is None else self.checkpoint_interval,
                         self.compact_every, self.rows_per_file, self.target_file_size)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        # On the driver before any task of the batch: a wrong table fails with nothing written.
        self.sink(schema).ensure_table(self.create_table, f"{self.name()} sink")
        return super().streamWriter(schema, overwrite)
