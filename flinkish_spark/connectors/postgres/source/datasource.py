"""``spark.readStream.format("flinkish.postgres")``: options, table info, and the wiring to the split framework."""

from __future__ import annotations

import os
import re
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from flinkish_spark.connectors.cdc.datasource import CdcDataSource
from flinkish_spark.connectors.cdc.host import DEFAULT_SPLIT_SIZE, Startup
from flinkish_spark.connectors.cdc.patterns import TablePatterns, split_followable
from flinkish_spark.connectors.cdc.tables_reader import TablesReaderCore
from flinkish_spark.connectors.postgres import publication as publications
from flinkish_spark.connectors.postgres import slot as slots
from flinkish_spark.connectors.postgres.connection import ConnectionInfo, check_server_version, connect, parse_url
from flinkish_spark.connectors.postgres.rows import stream_schema
from flinkish_spark.connectors.postgres.rows.packed import DECODE_IN, ROW_FORMATS, packed_schema
from flinkish_spark.connectors.postgres.source.catalog import table_columns
from flinkish_spark.connectors.postgres.source.changes import has_peeked
from flinkish_spark.connectors.postgres.source.columns import SourceColumns, source_columns
from flinkish_spark.connectors.postgres.source.dialect import PostgresDialect
from flinkish_spark.connectors.postgres.source.discovery import followable_tables
from flinkish_spark.connectors.postgres.source.enumerator import PostgresEnumerator
from flinkish_spark.connectors.postgres.source.host import OnSlotLost
from flinkish_spark.connectors.postgres.source.reader import PostgresReader
from flinkish_spark.connectors.postgres.source.tables import TableInfo, load_table_info
from flinkish_spark.connectors.postgres.source.tables_enumerator import TablesEnumerator
from flinkish_spark.errors import ConfigError, PostgresSourceError
from flinkish_spark.options import Options
from flinkish_spark.source.planning import ReadRange
from flinkish_spark.source.reader import SplitReader

DEFAULT_DISCOVERY_INTERVAL_S = 10.0
DEFAULT_HEARTBEAT_INTERVAL_S = 30.0  # as Flink CDC's heartbeat.interval


class PostgresSourceDataSource(CdcDataSource):
    """``spark.readStream.format("flinkish.postgres")``.

    Options are validated lazily -- in :meth:`schema` and :meth:`streamReader`, not in
    ``__init__`` -- so that a class serving ``writeStream`` under the same format name can
    inherit from this one and never have its sink options checked as source options.
    """

    KIND: ClassVar[str] = "flinkish.postgres"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = (
        "url", "passwordEnv", "table", "tables", "startup", "splitSize", "splitColumn", "maxRowsPerTrigger",
        "snapshotRowsPerTrigger", "slotName", "publication", "onSlotLost", "snapshotPartitions", "discoveryInterval",
        "heartbeatInterval", "rowFormat", "decodeIn", "transforms", "spreadChanges",
    )

    def __init__(self, options: Any) -> None:
        DataSource.__init__(self, options)

    @property
    def component(self) -> str:
        return f"{self.KIND} source"

    def configure(self, opts: Options) -> None:
        url = opts.required("url", "a libpq URI, e.g. postgresql://user@host:5432/db (password via PGPASSWORD or 'passwordEnv')")
        self.password_env = (opts.get("passwordEnv") or "").strip() or None
        self.conn_info: ConnectionInfo = parse_url(url, self.password_env, f"{self.component}: option 'url'")
        if opts.has("table") == opts.has("tables"):
            raise ConfigError(
                f"{self.component}: give either 'table' (one table: its own columns) or 'tables' (names and patterns, "
                "e.g. 'public.*, sales.order_*': one stream of rows of every table, see docs/postgres-source.md)"
                + (", not both" if opts.has("table") else "")
            )
        self.table = (opts.get("table") or "").strip()
        tables = opts.get("tables")
        self.patterns: TablePatterns | None = (
            None if tables is None else TablePatterns.parse(tables, f"{self.component}: option 'tables'"))
        self.discovery_interval = opts.number("discoveryInterval", DEFAULT_DISCOVERY_INTERVAL_S) or DEFAULT_DISCOVERY_INTERVAL_S
        if self.patterns is None and opts.has("discoveryInterval"):
            raise ConfigError(f"{self.component}: option 'discoveryInterval' applies to 'tables' only")
        self.heartbeat_interval = opts.number("heartbeatInterval", DEFAULT_HEARTBEAT_INTERVAL_S) or DEFAULT_HEARTBEAT_INTERVAL_S
        self.startup: Startup = opts.choice("startup", ("snapshot", "snapshotThenChanges", "changes"), "snapshotThenChanges")
        self.split_size = opts.integer("splitSize", DEFAULT_SPLIT_SIZE, minimum=1) or DEFAULT_SPLIT_SIZE
        self.split_column = (opts.get("splitColumn") or "").strip() or None
        self.max_rows_per_trigger = opts.integer("maxRowsPerTrigger", None, minimum=1)
        # The snapshot's own bound (chunks are read whole, in parallel tasks: an epoch of them may be larger than one
        # of changes, which one task reads); maxRowsPerTrigger when not given.
        self.snapshot_rows_per_trigger = opts.integer("snapshotRowsPerTrigger", None, minimum=1) or self.max_rows_per_trigger
        self.snapshot_partitions = opts.integer("snapshotPartitions", None, minimum=1) or os.cpu_count() or 2
        self.on_slot_lost: OnSlotLost = opts.choice("onSlotLost", ("fail", "resnapshot"), "fail")
        default_name = "flinkish_" + re.sub(r"[^a-z0-9_]", "_", self.uid.lower())
        self.slot_name = (opts.get("slotName") or "").strip() or default_name[:63]
        if not re.fullmatch(r"[a-z0-9_]{1,63}", self.slot_name):
            raise ConfigError(f"{self.component}: option 'slotName' may only hold a-z, 0-9 and _ (at most 63), got {self.slot_name!r}")
        given = (opts.get("publication") or "").strip()
        self.publication_given = bool(given)
        self.publication = given or default_name[:63]
        if self.patterns is not None and self.split_column is not None:
            raise ConfigError(f"{self.component}: option 'splitColumn' applies to 'table' only; with 'tables' every "
                              "table is split by its primary key")
        if self.startup == "snapshot" and any(opts.has(o) for o in ("slotName", "publication", "onSlotLost", "heartbeatInterval")):
            raise ConfigError(f"{self.component}: startup=snapshot uses no replication slot; drop the options slotName, "
                              "publication, onSlotLost and heartbeatInterval")
        # The stream's row shape with 'tables' (rows.packed): not part of config(), a restart may switch it (the
        # routing sinks read both).
        self.row_format: str = opts.choice("rowFormat", ROW_FORMATS, "json")
        if self.patterns is None and opts.has("rowFormat"):
            raise ConfigError(f"{self.component}: option 'rowFormat' applies to 'tables' only")
        # Where a change's values are typed when rowFormat=arrow (rows.packed): 'source', the one task reading the
        # slot; 'sink', the sink tasks (w and j packs, source.wire_rows) -- not part of config() either.
        self.decode_in: str = opts.choice("decodeIn", DECODE_IN, "source")
        if opts.has("decodeIn") and self.row_format != "arrow":
            raise ConfigError(f"{self.component}: option 'decodeIn' applies to rowFormat=arrow only (the JSON shape's "
                              "rows are always typed by the sink); set rowFormat=arrow or drop decodeIn")
        # An epoch's changes read in the driver and spread by table over this many tasks (source.spread_read): not
        # part of config() either (a replay of an epoch gives the same rows whichever way it is read).
        self.spread_changes = opts.integer("spreadChanges", 1, minimum=1) or 1
        if self.patterns is None and opts.has("spreadChanges"):
            raise ConfigError(f"{self.component}: option 'spreadChanges' applies to 'tables' only (one table's changes "
                              "are one table's work)")
        if self.spread_changes > 1 and self.max_rows_per_trigger is None:
            raise ConfigError(f"{self.component}: option 'spreadChanges' needs 'maxRowsPerTrigger' (the driver reads "
                              "an epoch's changes whole, from the messages it fetched to bound the range: set a bound, "
                              "e.g. maxRowsPerTrigger=200000)")
        # The columns never read (the routing sinks' rules, their column part: source.columns).
        self.source_columns: SourceColumns = source_columns(opts.get, self.component)
        if self.source_columns and self.patterns is None:
            raise ConfigError(f"{self.component}: option 'transforms' applies to 'tables' only (a source of one table "
                              "reads the columns its query selects)")
        self._table_info: TableInfo | None = None

    def config(self) -> dict[str, Any]:
        # What defines the data: never the URL (it may hold a password).
        if self.patterns is not None:
            return {"tables": self.patterns.text, "startup": self.startup, "splitSize": self.split_size,
                    "slotName": self.slot_name if self.startup != "snapshot" else None}
        return {"table": self.table, "startup": self.startup, "splitSize": self.split_size,
                "splitColumn": self.split_column, "slotName": self.slot_name if self.startup != "snapshot" else None}

    def table_info(self) -> TableInfo:
        if self._table_info is None:
            with connect(self.conn_info, autocommit=True) as conn:
                check_server_version(conn, self.conn_info, self.component)
                info = load_table_info(conn, self.table, self.split_column, self.component)
                if self.startup != "snapshot":
                    slots.check_logical_replication(conn, self.component)
                    # At every start, not only the first: a publication can be altered while stopped.
                    # (One of this name that is neither given nor ours is refused when the slot is made.)
                    owned = slots.Ownership.read(self.io, self.checkpoint_store().directory)
                    if self.publication_given or (owned is not None and owned.publication_created):
                        publications.check(conn, self.publication, (info.schema, info.name),
                                           [c.name for c in info.columns], self.component)
                    if not info.key:
                        raise PostgresSourceError(
                            f"{self.component}: table {info.display} has no primary key, so its changes carry no key "
                            "(and the server refuses its updates and deletes once it is published). Add a primary key, "
                            "or use startup=snapshot with 'splitColumn'"
                        )
            self._table_info = info
        return self._table_info

    def check_tables(self) -> None:
        """With 'tables': the server can stream changes and every matching table can be followed (else one clear error)."""
        if getattr(self, "_tables_checked", False):
            return
        assert self.patterns is not None
        with connect(self.conn_info, autocommit=True) as conn:
            check_server_version(conn, self.conn_info, self.component)
            if self.startup != "snapshot":
                slots.check_logical_replication(conn, self.component)
            # Tables without a usable key are left out (the enumerator warns): only the others must be published.
            found = split_followable(followable_tables(conn, self.patterns, self.component, self.startup != "snapshot"))[0]
            if self.startup != "snapshot":
                # At every start: a publication can be altered while stopped. One the user gave must
                # publish every matching table; the source's own, the ones it already holds.
                owned = slots.Ownership.read(self.io, self.checkpoint_store().directory)
                if self.publication_given or (owned is not None and owned.publication_created):
                    members = publications.published(conn, self.publication)
                    checked = [t for t in found if self.publication_given or (t.schema, t.table) in members]
                    columns = table_columns(conn, [t.oid for t in checked])
                    # The kept columns must be published (a given publication's column list may leave the others
                    # out). A column list of the source's own publication is the source's to keep (its catalog poll,
                    # which snapshots a table again whose list lacked a kept column): not checked here.
                    kept = PostgresDialect(self).kept_columns(conn, checked)
                    for t in checked:
                        name = (t.schema, t.table)
                        publications.check(conn, self.publication, name, kept.get(name) or columns[t.oid]
                                           if self.publication_given else (), self.component)
        self._tables_checked = True

    def schema(self) -> StructType:
        self.setup_source()
        if self.patterns is not None:
            self.check_tables()
            return packed_schema() if self.row_format == "arrow" else stream_schema()
        return self.table_info().spark_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.setup_source()
        # On the driver, before anything is written; the table info is pickled to the executors with the reader.
        if self.patterns is not None:
            self.check_tables()
        else:
            self.table_info()
        return super().streamReader(schema)

    def spread(self, r: ReadRange) -> tuple[int, str] | None:
        """With ``spreadChanges``: the change range read in the driver and spread by table
        (:mod:`flinkish_spark.source.spread_read`) -- only the range whose messages this process fetched to bound it
        (the epoch just planned): a replayed epoch, a range capped by ``Trigger.AvailableNow`` or one too big to keep
        is read by one task, never peeked again in the driver (the server would decode it a third time). Here, not
        in the CDC core: a range cut into pieces (MySQL's ``changeReaders``) would put a table in two pieces' tasks;
        a slot's range is never cut."""
        if self.spread_changes <= 1 or r.split_id.startswith("snapshot-"):
            return None
        return (self.spread_changes, "_table") if has_peeked(self.slot_name, r.end) else None

    def create_enumerator(self) -> PostgresEnumerator:
        return PostgresEnumerator(self) if self.patterns is None else TablesEnumerator(self)

    def create_reader(self, schema: StructType) -> SplitReader:
        if self.patterns is None:
            return PostgresReader(self, schema)
        from flinkish_spark.connectors.postgres.rows.packed import packing

        return TablesReaderCore(self, PostgresDialect(self), packing(self.row_format, self.decode_in == "sink"))
