"""``spark.readStream.format("flinkish.mysql")``: options, the server check, and the wiring to the CDC core.

The stream is the CDC core's multi-table stream (:func:`flinkish_spark.connectors.cdc.stream.stream_schema`):
one row per snapshot row or change of every table ``tables`` matches, with ``s`` rows carrying each table's
schema, routed by a sink's ``{schema}/{table}`` template. Before Spark plans anything the server is checked
(:func:`flinkish_spark.connectors.mysql.server.check_server`: the binary log on, ROW, FULL row image and
metadata -- only the log when startup=snapshot) and the patterns must match a table: one clear error each,
nothing written. Options: docs/mysql-source.md.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from flinkish_spark.connectors.cdc.datasource import CdcDataSource
from flinkish_spark.connectors.cdc.host import DEFAULT_SPLIT_SIZE, OnSlotLost, Startup
from flinkish_spark.connectors.cdc.patterns import TablePatterns, split_followable
from flinkish_spark.connectors.cdc.stream import stream_schema
from flinkish_spark.connectors.cdc.tables_reader import TablesReaderCore
from flinkish_spark.connectors.mysql.connection import ConnectionInfo, parse_url, session
from flinkish_spark.connectors.mysql.range_cuts import DEFAULT_MIN_CHANGES, MAX_READERS
from flinkish_spark.connectors.mysql.server import read_settings, setting_problems
from flinkish_spark.connectors.mysql.source.enumerator import MysqlEnumerator, mysql_dialect
from flinkish_spark.connectors.postgres.rows.packed import ROW_FORMATS, packed_schema, packing
from flinkish_spark.errors import ConfigError
from flinkish_spark.options import Options
from flinkish_spark.source.reader import SplitReader

DEFAULT_DISCOVERY_INTERVAL_S = 10.0
#: The first replica id the source's log readers take (each read its own, a random one above it): a server
#: ends a binary log dump when another starts with the same id, so two sources on one server need other ids.
DEFAULT_SERVER_ID = 0x5F000000


class MysqlSourceDataSource(CdcDataSource):
    """``spark.readStream.format("flinkish.mysql")`` (see the module docstring)."""

    KIND: ClassVar[str] = "flinkish.mysql"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = (
        "url", "passwordEnv", "table", "tables", "startup", "splitSize", "maxRowsPerTrigger", "snapshotRowsPerTrigger",
        "snapshotPartitions", "discoveryInterval", "serverId", "onSlotLost", "rowFormat", "changeReaders",
        "changeReaderMinChanges",
    )

    @property
    def component(self) -> str:
        return f"{self.KIND} source"

    def configure(self, opts: Options) -> None:
        url = opts.required("url", "mysql://user@host:3306/db (password via MYSQL_PWD or 'passwordEnv')")
        self.password_env = (opts.get("passwordEnv") or "").strip() or None
        self.conn_info: ConnectionInfo = parse_url(url, self.password_env, f"{self.component}: option 'url'")
        if opts.has("table"):
            raise ConfigError(
                f"{self.component}: option 'table' is not supported: the MySQL source reads 'tables' (names and "
                "patterns as database.table, e.g. 'shop.*, crm.customers'; one table is tables='shop.orders'), one "
                "stream of every table's rows that a sink routes by {schema}/{table}")
        tables = opts.required("tables", "names and patterns as database.table, e.g. 'shop.*, !shop.tmp_*'")
        self.patterns: TablePatterns | None = TablePatterns.parse(tables, f"{self.component}: option 'tables'")
        self.discovery_interval = (opts.number("discoveryInterval", DEFAULT_DISCOVERY_INTERVAL_S)
                                   or DEFAULT_DISCOVERY_INTERVAL_S)
        self.startup: Startup = opts.choice("startup", ("snapshot", "snapshotThenChanges", "changes"),
                                            "snapshotThenChanges")
        self.split_size = opts.integer("splitSize", DEFAULT_SPLIT_SIZE, minimum=1) or DEFAULT_SPLIT_SIZE
        self.max_rows_per_trigger = opts.integer("maxRowsPerTrigger", None, minimum=1)
        self.snapshot_rows_per_trigger = (opts.integer("snapshotRowsPerTrigger", None, minimum=1)
                                          or self.max_rows_per_trigger)
        self.snapshot_partitions = opts.integer("snapshotPartitions", None, minimum=1) or os.cpu_count() or 2
        self.server_id = opts.integer("serverId", DEFAULT_SERVER_ID, minimum=1) or DEFAULT_SERVER_ID
        if self.server_id >= 1 << 31:
            raise ConfigError(f"{self.component}: option 'serverId' must be below {1 << 31} (a replica id; each "
                              "log read takes a random one up to 2^24 above it)")
        self.on_slot_lost: OnSlotLost = opts.choice("onSlotLost", ("fail", "resnapshot"), "fail")
        # An epoch's change range read by up to this many tasks at once, cut at transaction boundaries when planned
        # (connectors/mysql/range_cuts.py); the cuts are in the checkpoint, so a replay reads the same pieces
        # whatever these options say then. Not part of the data's identity.
        self.change_readers = opts.integer("changeReaders", None, minimum=1) or min(os.cpu_count() or 2, 8)
        if self.change_readers > MAX_READERS:
            raise ConfigError(f"{self.component}: option 'changeReaders' must be at most {MAX_READERS} (tasks that "
                              "read one epoch's binary log range at once, each a connection of its own)")
        self.change_reader_min_changes = (opts.integer("changeReaderMinChanges", None, minimum=1)
                                          or DEFAULT_MIN_CHANGES)
        # json: the documented stream shape; arrow: a table's rows packed per run (docs/postgres-source.md "Packed
        # rows"), what the mirror uses for lakehouse targets. Not part of the data's identity: a restart may switch.
        self.row_format: str = opts.choice("rowFormat", ROW_FORMATS, "json")
        if self.startup == "snapshot" and any(opts.has(o) for o in ("onSlotLost", "serverId")):
            raise ConfigError(f"{self.component}: startup=snapshot reads no binary log; drop the options onSlotLost "
                              "and serverId")

    def config(self) -> dict[str, Any]:
        # What defines the data: never the URL (it may hold a password).
        assert self.patterns is not None
        return {"tables": self.patterns.text, "startup": self.startup, "splitSize": self.split_size}

    def check_server(self) -> None:
        """The server's binary log settings and the tables, before anything is written: one clear error each."""
        if getattr(self, "_server_checked", False):
            return
        assert self.patterns is not None
        dialect = mysql_dialect(self)
        with session(self.conn_info) as conn:
            version, settings = read_settings(conn)
            problems = setting_problems(self.conn_info, version, settings, self.startup != "snapshot")
            if problems:
                raise problems[0]
            found = dialect.find_tables(conn, self.patterns)
        if not found:
            raise ConfigError(
                f"{self.component}: no table matches 'tables' = {self.patterns.text!r} on the MySQL server at "
                f"{self.conn_info.masked} (base tables this user can see, as database.table). Check the names, or "
                "create the tables first")
        for table in split_followable(found)[0]:
            dialect.check_followable(table)
        self._server_checked = True

    def schema(self) -> StructType:
        self.setup_source()
        self.check_server()
        return packed_schema() if self.row_format == "arrow" else stream_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.setup_source()
        self.check_server()  # on the driver, before anything is written
        return super().streamReader(schema)

    def create_enumerator(self) -> MysqlEnumerator:
        return MysqlEnumerator(self)

    def create_reader(self, schema: StructType) -> SplitReader:
        dialect = mysql_dialect(self)
        dialect.packed_chunks = self.row_format == "arrow"  # the chunks' packs made from typed Arrow (packed_chunks)
        # A replayed range whose log was purged reads nothing; the planning after it starts a new generation
        # (MysqlEnumerator.on_checkpoint_complete). Under onSlotLost=fail it stays the clear error.
        dialect.skip_purged = self.on_slot_lost == "resnapshot"
        return TablesReaderCore(self, dialect, packing(self.row_format))
