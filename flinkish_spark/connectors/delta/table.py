"""The Delta table a ``flinkish.delta`` sink writes: loading, validation, creation, per-process caches.

Validation runs on the driver before any task writes (``streamWriter``) and again when
another writer changed the table's metadata or protocol: a table that does not fit the
query raises :class:`TableMismatchError` and nothing is written. For the keyed modes
(``mode=upsert|history``) the table must also let this sink write what it writes: the
query's key with the table's key type, and in ``mergeOnRead`` deletion vectors (reader 3
/ writer 7 with the ``deletionVectors`` feature and ``delta.enableDeletionVectors``) --
tables the sink creates get them; an existing table is upgraded by its owner (the error
says how) -- and no feature whose rules a keyed writer would break (column mapping, row
tracking, change data feed, append-only, constraints).

The caches of a driver process (the delta-rs table, each uid's log head) belong to one
table: a folder deleted and created again at the same path (a notebook) is another table.
The head keeps a digest of the commit it stands on; :meth:`DeltaTarget.check_same_table`
compares it with the log (one GET) -- at a batch's start (:meth:`DeltaTarget.ensure_table`),
before an append commit, before the keyed state answers, in
:meth:`DeltaTarget.last_committed_epoch` -- and drops every cache of the table when it
differs (:meth:`DeltaTarget.forget_table`): the one mechanism for a recreated table.

What the table holds of a uid, for the framework (:mod:`flinkish_spark.sink.incarnation`):
:meth:`DeltaTarget.last_committed_epoch`, its txn version -- also the txn of a keyed epoch
that changed nothing -- and for cleanup the files the epoch's commit added
(:meth:`DeltaTarget.added_by_table`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flinkish_spark.connectors.delta.log import DeltaLog, LogHead, StaleHead, TableChanged, blind_append_supported
from flinkish_spark.connectors.lakehouse.changes import ChangePlan, key_type_changes
from flinkish_spark.connectors.lakehouse.files import (
    DEFAULT_ROWS_PER_FILE, DEFAULT_TARGET_FILE_SIZE, delta_storage_options, require,
)
from flinkish_spark.errors import StorageUnavailableError, TableMismatchError
from flinkish_spark.io.fileio import FileIO

DATA_PREFIX = "flinkish"
DEFAULT_CHECKPOINT_INTERVAL = 10
EXTRA = "delta"
DV_PROPERTY = "delta.enableDeletionVectors"
# What a keyed writer honours: features that constrain nothing it writes, or that it writes itself.
KEYED_READER_FEATURES = frozenset({"deletionVectors", "timestampNtz", "vacuumProtocolCheck", "variantType"})
KEYED_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "deletionVectors", "timestampNtz", "domainMetadata",
                                   "vacuumProtocolCheck", "variantType", "changeDataFeed"})

# Per driver process: the delta-rs table (loaded once, for validation and checkpoints)
# and, per sink uid, the head of the log that commits continue from.
_TABLES: dict[tuple[str, str], Any] = {}
_HEADS: dict[tuple[str, str, str], "Head"] = {}
_TABLES_LOCK = threading.Lock()


def deltalake() -> Any:
    return require("deltalake", EXTRA, "the flinkish.delta sink")


@dataclass
class Head:
    """A uid's view of the log, and whether blind appends may be used on the table."""

    log: LogHead
    blind_append: bool
    validated: tuple[str, tuple[str, ...]]  # (schema, partition columns) checked against the table


def committed_version(table: Any, uid: str) -> int:
    """The last epoch the table holds for ``uid`` (its txn version), -1 for none."""
    version = table.transaction_version(uid)
    return -1 if version is None else int(version)


def _type_names(schema: Any) -> list[tuple[str, str]]:
    """(name, type) per field of a deltalake Schema: what must agree for an append."""
    return [(f.name, str(f.type)) for f in schema.fields]


class DeltaTarget:
    """Where a sink's table is, what it must look like and how it is written; the table and head
    caches of this process. The sink, and every module that commits for it, work on this."""

    def __init__(self, io: FileIO, path: str, uid: str, schema: pa.Schema, partition_by: tuple[str, ...],
                 plan: ChangePlan | None = None, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
                 compact_every: int = 0, rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                 target_file_size: int = DEFAULT_TARGET_FILE_SIZE) -> None:
        self.io = io
        self.path = path.rstrip("/")
        self.uid = uid
        self.schema = schema  # the table's columns (for keyed modes: the plan's table schema)
        self.partition_by = partition_by
        self.plan = plan
        self.checkpoint_interval = checkpoint_interval
        # A checkpoint at the versions v with (v + offset) % interval == 0. 0 for one table; a routed
        # target's own (checkpoint_offset below), so tables changing together do not all checkpoint in one epoch.
        self.checkpoint_offset = 0
        self.compact_every = compact_every
        # compactEvery counted in epochs (None: one table, every epoch commits a version) or -- a routed
        # target, set by the routed sink -- in the table's own versions at this offset: a table that changes
        # in few epochs is still compacted after N of its commits, and tables changing together spread
        # their compactions over N epochs instead of all compacting in the same one.
        self.compact_offset: int | None = None
        self.rows_per_file = rows_per_file
        self.target_file_size = target_file_size
        self.storage_options = delta_storage_options(io.storage_options) if io.protocol == "s3" else {}
        # The epoch this object last made visible, with the files its commit named (cleanup spares them).
        self._committed_here: dict[int, frozenset[str]] = {}
        # False: the keyed commit's version file is not followed by an fsync of its folder -- the sink syncs
        # the file system once per epoch before the epoch is done (a routed sink on a local disk: io.local_disk).
        self.sync_version_folder = True

    def checkpoint_due(self, version: int) -> bool:
        """Whether ``version`` gets a checkpoint: every ``checkpoint_interval`` versions, at the target's offset."""
        return bool(self.checkpoint_interval) and (version + self.checkpoint_offset) % self.checkpoint_interval == 0

    def compaction_due(self, version: int, epoch: int) -> bool:
        """Whether the keyed commit of ``epoch`` (table version ``version``) is followed by a compaction."""
        if not self.compact_every:
            return False
        if self.compact_offset is None:
            return (epoch + 1) % self.compact_every == 0
        return (version + self.compact_offset) % self.compact_every == 0

    @property
    def table_uri(self) -> str:
        return self.io.url(self.io.strip(self.path)) if self.io.protocol == "s3" else self.io.strip(self.path)

    def url(self, relative: str) -> str:
        return f"{self.path}/{relative}"

    def log(self) -> DeltaLog:
        return DeltaLog(self.io, self.path)

    def _key(self) -> tuple[str, str]:
        return self.table_uri, json.dumps(self.storage_options, sort_keys=True)

    def table(self, refresh: bool = True) -> Any:
        """The delta-rs table, loaded once per driver process and brought up to date incrementally.

        Loading and updating cost O(live files) (delta-rs materialises the file list):
        used at start, for validation after another writer changed the table, and for
        checkpoints -- never on the per-epoch path of a commit.
        """
        key = self._key()
        with _TABLES_LOCK:
            table = _TABLES.get(key)
            if table is None:
                table = deltalake().DeltaTable(self.table_uri, storage_options=self.storage_options or None)
                _TABLES[key] = table
            elif refresh:
                table.update_incremental()
            return table

    def _head_key(self) -> tuple[str, str, str]:
        return self.table_uri, json.dumps(self.storage_options, sort_keys=True), self.uid

    def _head(self) -> Head | None:
        with _TABLES_LOCK:
            return _HEADS.get(self._head_key())

    def _forget_head(self, table_too: bool = False) -> None:
        """Drop this uid's head; ``table_too``: also the delta-rs table and every uid's head (another table at this path)."""
        with _TABLES_LOCK:
            _HEADS.pop(self._head_key(), None)
            if table_too:
                _TABLES.pop(self._key(), None)
                for key in [k for k in _HEADS if k[:2] == self._key()]:
                    _HEADS.pop(key)

    def forget_table(self) -> None:
        """Drop every cache of this process for the table at this path: another table is there now."""
        self._forget_head(table_too=True)

    def check_same_table(self) -> bool:
        """Whether this process's caches of the table may still answer for the folder (one GET).

        Spark reuses the driver's Python workers across queries, and a notebook deletes a table and
        writes it again: a cache filled before describes another table then -- its txn would call
        the new table's epochs committed, the next version written would leave a gap in the new
        log, and names the sink writes deterministically would be looked up in the old files'
        indexes. The head keeps a digest of the commit it stands on; when the log no longer holds
        that commit byte for byte (deleted, created again -- with any number of versions -- or
        log cleanup passed it), every cache of the table is dropped (:meth:`forget_table`) and
        False returned: the caller reads the table afresh. True without a head (nothing cached).
        """
        head = self._head()
        if head is None or self.log().same_table(head.log):
            return True
        self.forget_table()
        return False

    def shape(self) -> tuple[str, tuple[str, ...]]:
        return self.schema.to_string(), self.partition_by

    def ensure_table(self, create: bool, component: str) -> None:
        """Validate the table against the query -- or create it -- before any task writes.

        Raises TableMismatchError for a folder that is not a Delta table, another schema or
        other partition columns; nothing is written then. Once validated in this process,
        a later call only checks that the head's commit is still there (one GET: a table
        deleted and created again is reloaded, with every cache of the old one dropped) and
        reads the commits other writers added since (O(their number)), and validates again
        only if one of them changed the metadata or protocol.
        """
        head = self._head()
        if head is not None and head.validated == self.shape() and self.check_same_table():
            try:
                if head.blind_append:
                    self.log().catch_up(head.log, self.uid)
                return
            except (TableChanged, StaleHead):
                self._forget_head()
        table = self.validate(create, component)
        self.set_head(table)

    def set_head(self, table: Any) -> Head:
        blind = self.plan is None and blind_append_supported(table.protocol(), table.schema())
        # The digest now: a keyed head stays at this version for the life of the process, and
        # must tell the table it was validated on from one created again later.
        version = int(table.version())
        head = Head(LogHead(version, committed_version(table, self.uid), self.log().digest(version)), blind, self.shape())
        with _TABLES_LOCK:
            _HEADS[self._head_key()] = head
        return head

    def validate(self, create: bool, component: str) -> Any:
        dl = deltalake()
        try:
            table = self.table()
        except dl.exceptions.TableNotFoundError:
            table = None
        except OSError as exc:
            raise StorageUnavailableError(f"{component}: the Delta table {self.path!r} could not be read: {exc}") from None
        if table is None:
            table = self._create(create, component)
        self.check_table(table, component)
        return table

    def check_table(self, table: Any, component: str) -> None:
        """Raise TableMismatchError if the table (delta-rs's, or the keyed state's
        :class:`~flinkish_spark.connectors.delta.state_table.StateTable`) does not fit the query."""
        dl = deltalake()
        if self.plan is not None:
            changed = key_type_changes(self.plan, pa.schema(table.schema().to_arrow()))
            if changed:
                raise TableMismatchError(
                    f"{component}: the key's type changed: {'; '.join(changed)}. A key's type cannot change in "
                    "place: write to a new table, or cast the key column to the table's type."
                )
        wanted = _type_names(dl.Schema.from_arrow(self.schema))
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
        if self.plan is not None:
            self._check_keyed(table, component)

    def _create(self, create: bool, component: str) -> Any:
        dl = deltalake()
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
        configuration = ({DV_PROPERTY: "true"}
                         if self.plan is not None and self.plan.merge_mode == "mergeOnRead" else None)
        try:
            dl.DeltaTable.create(self.table_uri, self.schema, mode="ignore", partition_by=list(self.partition_by) or None,
                                 configuration=configuration, storage_options=self.storage_options or None)
        except dl.exceptions.DeltaError:
            pass  # another query created it at the same moment: validated below like any table
        return self.table()

    def _check_keyed(self, table: Any, component: str) -> None:
        assert self.plan is not None
        protocol = table.protocol()
        config = dict(table.metadata().configuration or {})
        reader = set(protocol.reader_features or ())
        writer = set(protocol.writer_features or ())
        where = f"{component}: the Delta table {self.path!r}"
        if int(protocol.min_reader_version) == 2 or int(protocol.min_writer_version) in (5, 6) \
                or "columnMapping" in reader:
            raise TableMismatchError(f"{where} uses column mapping, which the keyed modes do not write; "
                                     "write to a new table (the sink creates one without it)")
        unknown = sorted((reader - KEYED_READER_FEATURES) | (writer - KEYED_WRITER_FEATURES))
        if int(protocol.min_writer_version) in (3, 4) or unknown:
            raise TableMismatchError(
                f"{where} has the table features {unknown or ['writer version ' + str(protocol.min_writer_version)]}, "
                "whose rules the keyed modes do not follow (constraints, generated or identity columns, row "
                "tracking, ...). Use mode 'append', or write to a new table."
            )
        for prop, meaning in (("delta.appendOnly", "append-only"), ("delta.enableChangeDataFeed", "change data feed")):
            if str(config.get(prop, "false")).lower() == "true":
                raise TableMismatchError(f"{where} has {prop}=true ({meaning}); the keyed modes replace and "
                                         f"delete rows{' without writing change data files' if 'Change' in prop else ''}. "
                                         "Use mode 'append' or a new table.")
        if any("delta.invariants" in (f.metadata or {}) for f in table.schema().fields):
            raise TableMismatchError(f"{where} has column invariants, which the keyed modes do not check; "
                                     "use mode 'append' or a new table")
        if self.plan.merge_mode == "mergeOnRead":
            supported = "deletionVectors" in reader and "deletionVectors" in writer
            if not supported or str(config.get(DV_PROPERTY, "false")).lower() != "true":
                raise TableMismatchError(
                    f"{where} does not have deletion vectors enabled (needed by mergeMode 'mergeOnRead', "
                    "the default). Enable them once -- with delta-rs: "
                    f"deltalake.DeltaTable({self.table_uri!r}).alter.set_table_properties("
                    f"{{'{DV_PROPERTY}': 'true'}}); with Spark SQL: ALTER TABLE ... SET TBLPROPERTIES "
                    f"('{DV_PROPERTY}' = true) -- or set .option('mergeMode', 'copyOnWrite') to rewrite files instead."
                )

    def committed(self, epoch: int) -> bool:
        """Whether the table holds ``epoch`` of this uid, read from the log's newest state."""
        return self.last_committed_epoch() >= epoch

    def last_committed_epoch(self) -> int:
        """The table's txn version of this uid, read from the log's newest state (-1: none, or no table).

        Keyed tables included: an epoch that changed nothing still wrote its txn."""
        self.check_same_table()
        head = self._head()
        if head is not None and head.blind_append:
            try:
                self.log().catch_up(head.log, self.uid)
                return head.log.txn
            except (TableChanged, StaleHead):
                self._forget_head()
        try:
            return committed_version(self.table(), self.uid)
        except deltalake().exceptions.TableNotFoundError:
            return -1

    def newest_version(self) -> int:
        """The newest version of the log this process knows (after :meth:`committed` brought it up to date)."""
        head = self._head()
        return head.log.version if head is not None and head.blind_append else int(self.table().version())

    def added_by_table(self, epoch: int) -> set[str] | None:
        """The files (relative, decoded) the table's commit of ``epoch`` added -- data and deletion
        vector files, with the epoch's compactions: none when the table does not hold the epoch,
        None when it does but its commit cannot be read (then nothing of the epoch may be deleted)."""
        if epoch in self._committed_here:
            return set(self._committed_here[epoch])
        if not self.committed(epoch):
            return set()
        return self.log().added_by(self.uid, epoch, self.newest_version())
