"""MySQL/MariaDB as a dialect of the CDC core (:class:`..cdc.dialect.SourceDialect`): catalog, change log and reader.

What it answers, from :mod:`.catalog`, :mod:`.snapshot`, :mod:`.changes` and ``information_schema``:

* **Tables** (:meth:`MysqlDialect.find_tables`): :func:`.catalog.find_tables` (the one listing, shared with the
  mirror's preflight): base tables outside the system databases as ``database.table`` against the ``tables``
  patterns. A table without a primary key is left out with a warning (its changes could not be applied by key);
  a table of an engine without transactions is refused (:meth:`MysqlDialect.check_followable`). The table's id is
  a stable hash of its name: MySQL has no catalog id that survives a restart and is readable without PROCESS.
* **Signatures** (:meth:`MysqlDialect.signatures`): the columns as ``[name, COLUMN_TYPE, has a default]``, for
  the statements that change rows without row events in the log, which the core answers with a re-snapshot
  (:meth:`MysqlDialect.signature_change`): a column whose stream type changes other than by widening (``MODIFY``
  rewrites its values), a renamed column (its values would be null under the new name), an added column with a
  default (the existing rows hold it). ``DROP``/``RENAME TABLE`` are the catalog poll's; ``TRUNCATE`` is a ``t``
  row of the change stream (:mod:`.change_stream`).
* **Positions**: a file position as an integer, :func:`.changes.position_key` (``binlog.000042`` at 1234 is
  ``42 << 32 | 1234``); :meth:`MysqlDialect.format_position` gives ``binlog.000042:1234`` back (the base name
  from the server's ``SHOW BINARY LOGS``).
* **Joining**: the binary log carries every table from the start (no publication): a table's chunks wait for
  nothing (``after_xid = None``), except -- under a name followed before -- for the changes before the join to be
  committed downstream (:meth:`MysqlDialect.unread_before`, from the positions :meth:`MysqlDialect.release` was
  given: a restarted source waits for its first completed epoch).
* **Chunks** (:meth:`MysqlDialect.plan_chunks`): :func:`.snapshot.plan_chunks`' primary key ranges, their bounds as
  JSON (:func:`bound_to_json`); :meth:`MysqlDialect.read_chunk` reads one in a consistent snapshot of its own
  (``START TRANSACTION WITH CONSISTENT SNAPSHOT``) as an ``s`` row and ``r`` rows (:mod:`.stream_rows`), the ``r``
  rows packed from the typed Arrow when the source's ``rowFormat`` is ``arrow`` (:mod:`.packed_chunks`).
* **Change ranges** (:meth:`MysqlDialect.change_target`, :meth:`MysqlDialect.read_changes`): ``[start, end)`` with
  ``end`` a transaction boundary at or before the log's end when planned, so every read of it (a replay) is the
  same transactions (:func:`.changes.read_range`); a purged start is :class:`.changes.BinlogPurgedError`, at
  every planning (:meth:`MysqlDialect.position_lost`) and at every read.
* **Pieces** (:meth:`MysqlDialect.range_cuts`): the planning's read of a range also notes its transaction
  boundaries, and cuts it into up to :attr:`MysqlDialect.readers` pieces of about equal changes
  (:mod:`.range_cuts`), which the CDC core reads in as many tasks at once (:mod:`..cdc.change_split`).

No slot: the position lives in the source's checkpoint, :meth:`MysqlDialect.release` frees nothing on the
server (the server's expiry is the retention, which :meth:`MysqlDialect.position_lost` watches). docs/mysql-source.md.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping

import pyarrow as pa

from flinkish_spark.connectors.cdc.dialect import JoinMark, TableChunks
from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns
from flinkish_spark.connectors.cdc.registry import TableEntry
from flinkish_spark.connectors.mysql import catalog, ddl
from flinkish_spark.connectors.mysql.change_stream import change_batches
from flinkish_spark.connectors.mysql.chunk_rows import (  # noqa: F401 (bound_*: their old home)
    bound_of_json, bound_to_json, read_chunk_arrow, read_chunk_rows,
)
from flinkish_spark.connectors.mysql.changes import (
    BinlogPurgedError, LogEnd, check_start, current_end, position_key, position_of_key, read_range,
)
from flinkish_spark.connectors.mysql.connection import ConnectionInfo, connect, lost_sessions_retryable, session
from flinkish_spark.connectors.mysql.ddl import SchemaChange
from flinkish_spark.connectors.mysql.position import FilePosition
from flinkish_spark.connectors.mysql.planning import ACTED_ON, DdlSeen, RangeRecord, redacted
from flinkish_spark.connectors.mysql.range_cuts import CHANGE_BYTES, DEFAULT_MIN_CHANGES, CutPlanner
from flinkish_spark.connectors.mysql.range_scan import scan_range
from flinkish_spark.connectors.mysql.row_count import RowCounter
from flinkish_spark.connectors.mysql.row_images import ImageDecoder
from flinkish_spark.connectors.mysql.row_values import RowDecoder
from flinkish_spark.connectors.mysql.server import binary_logs, collation_charsets
from flinkish_spark.connectors.mysql.snapshot import plan_chunks, table_info
from flinkish_spark.connectors.mysql.stream_rows import column, schema_of_info
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.errors import TerminalError

if TYPE_CHECKING:
    from flinkish_spark.connectors.cdc.dialect import SourceDialect

log = logging.getLogger(__name__)

#: Databases never followed.
SYSTEM_DATABASES = catalog.SYSTEM_DATABASES
#: Stream types a column may change between without its stored values changing (PostgreSQL base type names).
WIDENINGS = frozenset({("int2", "int4"), ("int2", "int8"), ("int4", "int8"), ("float4", "float8"), ("text", "text"),
                       ("bytea", "bytea")})


def table_id(name: str) -> int:
    """The registry's id of the table ``database.table``: a stable 63-bit hash of its name (see the module)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> 1


class MysqlDialect:
    """A MySQL/MariaDB source's dialect (see the module docstring). ``patterns``: the tables a change range
    carries (the reader's half needs them; the catalog half is given them per call). ``server_id``: the first
    of the replica ids its log readers take (each read takes one of its own: a server ends a dump when another
    starts with the same id)."""

    def __init__(self, info: ConnectionInfo, component: str = "flinkish.mysql source",
                 patterns: TablePatterns | None = None, server_id: int = 0x5F000000) -> None:
        self.info = info
        #: ``rowFormat=arrow``: chunks and change ranges come as packs of typed values (:mod:`.packed_chunks`,
        #: :mod:`.packed_changes`)
        self.packed_chunks = False
        #: ``onSlotLost=resnapshot``: a change range whose log was purged reads no rows (:meth:`read_changes`)
        self.skip_purged = False
        #: packed change reads decode row images column by column (:mod:`.image_columns`); False: from the decoder's
        #: values (the same packs: the tests compare both ways)
        self.row_images = True
        self._component = component
        self.patterns = patterns
        self.server_id = server_id
        self._files: list[str] = []  # the server's binary log files, as last read (for their base name)
        self._mariadb: bool | None = None
        self._released = -1  # the greatest position release() was given in this process
        self._needed: int | None = None  # where the next change range starts (position_lost checks it)
        self._idle: tuple[int, int] | None = None  # (start, end): no change of ours in it (change_target)
        self._engine_problems: dict[str, str] = {}
        self._log_end: LogEnd | None = None
        #: the newest range change_target planned (the enumerator keeps it in its state: the checkpoint's record)
        self.planned: RangeRecord | None = None
        #: statements change_target found that the enumerator must act on (ACTED_ON); it takes them
        self.ddl_seen: list[DdlSeen] = []
        #: ``changeReaders``: the most pieces change_target cuts a range into (1: one task reads it)
        self.readers = 1
        #: ``changeReaderMinChanges``: the least changes of a piece (range_cuts.DEFAULT_MIN_CHANGES)
        self.min_changes_per_reader = DEFAULT_MIN_CHANGES
        self._cuts: tuple[int, ...] = ()  # of the range in `planned`

    @property
    def component(self) -> str:
        return self._component

    def error(self, message: str) -> TerminalError:
        return TerminalError(message)

    def connect(self) -> ContextManager[Any]:
        return session(self.info)

    # catalog -----------------------------------------------------------------------------------------

    def find_tables(self, conn: Any, patterns: TablePatterns) -> list[FoundTable]:
        found = []
        for t in catalog.find_tables(conn, patterns):
            problem = t.engine_problem(self.component)
            if problem is not None:
                self._engine_problems[t.name] = problem
            found.append(FoundTable(table_id(t.name), t.name, t.database, t.table, True,
                                    None if t.has_key else "it has no primary key",
                                    f"ALTER TABLE `{t.database}`.`{t.table}` ADD PRIMARY KEY (...)"))
        return found

    def check_followable(self, table: FoundTable) -> None:
        if not table.readable:
            raise self.error(f"{self.component}: table {table.name} matches 'tables' but this user may not read it")
        if table.name in self._engine_problems:
            raise self.error(self._engine_problems[table.name])

    def follow(self, conn: Any, tables: list[FoundTable]) -> None:
        pass  # the binary log carries every table

    def unfollow(self, conn: Any, oid: int) -> None:
        pass

    def _names(self, conn: Any, oids: list[int]) -> dict[int, tuple[str, str]]:
        """(database, table) of the tables ``oids`` that exist (ids are name hashes: the names are looked up)."""
        wanted = set(oids)
        marks = ", ".join(["%s"] * len(SYSTEM_DATABASES))
        with conn.cursor() as cur:
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
                        f"AND TABLE_SCHEMA NOT IN ({marks})", SYSTEM_DATABASES)
            named = {table_id(f"{d}.{t}"): (str(d), str(t)) for d, t in cur.fetchall()}
        return {o: n for o, n in named.items() if o in wanted}

    def primary_keys(self, conn: Any, oids: list[int]) -> dict[int, tuple[str, ...]]:
        out: dict[int, tuple[str, ...]] = {}
        with conn.cursor() as cur:
            for oid, (db, table) in self._names(conn, oids).items():
                cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND "
                            "TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX", (db, table))
                key = tuple(str(r[0]) for r in cur.fetchall())
                if key:
                    out[oid] = key
        return out

    def signatures(self, conn: Any, oids: list[int]) -> dict[int, Any]:
        """Per table: its columns as ``[name, COLUMN_TYPE, has a default]`` in order (see the module docstring)."""
        out: dict[int, Any] = {}
        with conn.cursor() as cur:
            for oid, (db, table) in self._names(conn, oids).items():
                cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, COLUMN_DEFAULT IS NOT NULL AND COLUMN_DEFAULT <> 'NULL' "
                            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                            "ORDER BY ORDINAL_POSITION", (db, table))
                out[oid] = [[str(n), str(t), bool(d)] for n, t, d in cur.fetchall()]
        return out

    def signature_change(self, conn: Any, old: Any, new: Any) -> str | None:
        before = {c[0]: c for c in old}
        after = {c[0]: c for c in new}
        for name, (_, was, _) in before.items():
            if name in after and after[name][1] != was:
                a, b = column(name, was), column(name, after[name][1])
                if a.type != b.type and (a.pg_type, b.pg_type) not in WIDENINGS:
                    return f"column {name!r} changed type from {was} to {after[name][1]} (its values were rewritten)"
        gone = [n for n in before if n not in after]
        added = [n for n in after if n not in before]
        if gone and added:
            return f"column {gone[0]!r} was renamed (or replaced by {added[0]!r}): its values are not in the log"
        with_default = [n for n in added if after[n][2]]
        if with_default:
            return f"column {with_default[0]!r} was added with a default, which the existing rows hold"
        return None

    def table_name(self, conn: Any, oid: int) -> str | None:
        found = self._names(conn, [oid]).get(oid)
        return None if found is None else f"{found[0]}.{found[1]}"

    # positions -------------------------------------------------------------------------------------------

    def _is_mariadb(self, conn: Any) -> bool:
        if self._mariadb is None:
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                self._mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        return self._mariadb

    def _end(self, conn: Any) -> FilePosition:
        self._log_end = current_end(conn, self._is_mariadb(conn))
        self._files = binary_logs(conn)
        return self._log_end.file

    def _position(self, key: int, conn: Any | None = None) -> FilePosition:
        if not self._files:
            if conn is None:
                with session(self.info) as own:
                    self._files = binary_logs(own)
            else:
                self._files = binary_logs(conn)
        return position_of_key(key, self._files)

    def current_position(self, conn: Any) -> int:
        return position_key(self._end(conn))

    def join_mark(self, conn: Any) -> JoinMark:
        return JoinMark(None, self.current_position(conn))

    def transaction_horizon(self, conn: Any) -> int:
        return 0  # no join waits for transactions (after_xid is None)

    def unread_before(self, conn: Any, positions: list[int]) -> int:
        return max((p for p in positions if p <= self._released), default=-1)

    def release(self, position: int) -> None:
        """An epoch up to ``position`` is committed. Nothing to free on the server: there is no slot, the position
        is the checkpoint's and the server keeps its logs by its own expiry; what is kept here is for
        :meth:`unread_before` (a join under a name followed before waits for the changes before it)."""
        self._released = max(self._released, position)

    def format_position(self, position: int) -> str:
        return str(self._position(position))

    def parse_position(self, text: str) -> int:
        return position_key(FilePosition.parse(text))

    # the change log (driver) --------------------------------------------------------------------------------

    def continues_from(self, position: int) -> None:
        """The change split continues at ``position`` (a checkpoint's; 0: no change split of this generation yet,
        nothing to check): :meth:`position_lost` checks it until a planning names the next range's start."""
        self._needed = position or None

    def position_lost(self) -> TerminalError | None:
        """The purged-log error when the server no longer has the log from where the next range starts."""
        if self._needed is None:
            return None
        with session(self.info) as conn:
            try:
                check_start(conn, self.info, self._position(self._needed, conn))
            except BinlogPurgedError as e:
                return e
        return None

    def _follows(self, name: str) -> bool:
        return self.patterns is not None and catalog.matches(self.patterns, name)

    def _decoder(self, conn: Any, counting: bool = False, images: bool = False) -> RowDecoder:
        """The reader's decoder; ``counting``: the planning's, whose rows carry no values (:mod:`.row_count`);
        ``images``: the packed reads', whose rows are row images cut into columns when packed (:mod:`.row_images`)."""
        info = self.info

        def column_types(database: str, table: str) -> dict[str, str]:
            with session(info) as c, c.cursor() as cur:
                cur.execute("SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
                            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (database, table))
                return {str(n): str(t) for n, t in cur.fetchall()}

        kind = RowCounter if counting else ImageDecoder if images else RowDecoder
        return kind(collation_charsets(conn), self._is_mariadb(conn), column_types=column_types)

    def _reader_id(self) -> int:
        return self.server_id + random.randrange(1, 1 << 24)

    def change_target(self, position: int, limit: int | None) -> int:
        """The end of the next range from ``position``: the log's end now, or -- with ``limit`` -- the end of the first
        transaction at which the range holds ``limit`` changes of followed tables. Each end is a transaction
        boundary at or before the log's end when planned, so every read of the range reads the same transactions.

        The range is walked here, whole (the binary log has no index by table): to find the statements of
        :data:`ACTED_ON` on followed tables (:attr:`ddl_seen`: each counts as a change, so an epoch ends after it),
        its transaction boundaries (the cuts, :mod:`.range_cuts`) and whether it holds a change of ours at all.
        Without ``limit`` by the events' headers alone (:mod:`.range_scan`: row events and their bytes, no row
        counted; the pieces are cut by bytes); with ``limit`` the rows are counted (:mod:`.row_count`, no value
        decoded), the count being what ends the range. Kept in :attr:`planned` with the GTID state at its end. With
        no change of ours before the end: no epoch (``position``), and the stretch read is remembered (the next
        planning from the same position reads on from its end) -- unless the log moved to a newer file since
        ``position``: then the range ends at the log's end all the same, an epoch without rows, so that a source
        whose tables are idle does not hold a file the server's expiry would purge (there is no slot;
        ``position_lost`` would stop it)."""
        self._needed = position
        with session(self.info) as conn:
            end = self._end(conn)
            start = self._position(position, conn)
            decoder = self._decoder(conn, counting=True) if limit is not None else None
            mariadb = self._is_mariadb(conn)
        if start >= end:
            return position
        scan = start
        if self._idle is not None and self._idle[0] == position and self._idle[1] <= position_key(end):
            scan = self._position(self._idle[1])  # nothing of ours before it (read at an earlier planning)
        log_end = self._log_end
        at_end = None if log_end is None else log_end.gtid
        if decoder is None:
            seen, size, cuts = self._scan(scan, end)
            if seen or end.key[:2] != start.key[:2]:
                return self._planned(position, end, None, at_end, cuts, seen, size)
            self._idle = (position, position_key(end))
            return position
        seen = 0
        cuts = CutPlanner()
        txns = read_range(self.info, scan, end, decoder, self._reader_id(), mariadb=mariadb)
        try:
            for txn in txns:
                seen += sum(1 for c in txn.changes if self._follows(f"{c.table.database}.{c.table.table}"))
                for st in txn.statements:
                    seen += self._statement(st.sql, st.position, st.changes, cuts)
                if seen and limit is not None and seen >= limit:
                    # MariaDB: the GTID state once the transaction is read; MySQL's executed set is known at the
                    # log's end only (its GTID events are not read here)
                    gtid = at_end if txn.end >= end else None
                    return self._planned(position, txn.end, seen, gtid or txn.gtid_after, cuts)
                cuts.boundary(txn.end, seen)
        finally:
            txns.close()  # type: ignore[attr-defined]
        if seen or end.key[:2] != start.key[:2]:
            return self._planned(position, end, seen, at_end, cuts)
        self._idle = (position, position_key(end))
        return position

    def _scan(self, start: FilePosition, end: FilePosition) -> tuple[int, int, CutPlanner]:
        """The range walked by its events' headers (:mod:`.range_scan`): (row events and statements of followed
        tables, their bytes -- a statement weighs :data:`.range_cuts.CHANGE_BYTES` --, the boundaries by bytes)."""
        seen = size = 0
        cuts = CutPlanner()
        txns = scan_range(self.info, start, end, self._reader_id(), self._follows)
        try:
            for txn in txns:
                seen += txn.events
                size += txn.size
                for st in txn.statements:
                    counted = self._statement(st.sql, st.position, ddl.parse(st.sql, st.database), cuts)
                    seen += counted
                    size += counted * CHANGE_BYTES
                cuts.boundary(txn.end, size)
        finally:
            txns.close()  # type: ignore[attr-defined]
        return seen, size, cuts

    def _statement(self, sql: str, position: FilePosition, changes: tuple[SchemaChange, ...], cuts: CutPlanner) -> int:
        """A statement of the range: the changes of followed tables it counts as (a TRUNCATE, which also fences the
        cuts; a statement of :data:`ACTED_ON`, kept in :attr:`ddl_seen`)."""
        counted = 0
        for sc in changes:
            if sc.kind == "truncate" and self._follows(f"{sc.database}.{sc.table}"):
                counted += 1
                cuts.truncate()
            elif sc.kind in ACTED_ON and (sc.table is None or self._follows(f"{sc.database}.{sc.table}")):
                counted += 1  # an epoch ends after it: the enumerator acts on it (ddl_seen)
                self.ddl_seen.append(DdlSeen(None if sc.table is None else f"{sc.database}.{sc.table}",
                                             sc.kind, redacted(sql), str(position)))
        return counted

    def _planned(self, start: int, end: FilePosition, changes: int | None, gtid: object | None, cuts: CutPlanner,
                 events: int | None = None, size: int | None = None) -> int:
        """Keep the range in :attr:`planned` and its cuts: by changes (``changes`` counted), else by bytes."""
        key = position_key(end)
        self.planned = RangeRecord(start, key, changes, None if gtid is None else str(gtid) or None, events, size)
        if changes is not None:
            self._cuts = cuts.cuts(start, key, changes, self.readers, self.min_changes_per_reader)
        else:
            self._cuts = cuts.cuts(start, key, size or 0, self.readers, self.min_changes_per_reader * CHANGE_BYTES)
        return key

    def range_cuts(self, start: int, end: int) -> tuple[int, ...]:
        """The transaction boundaries at which the range change_target just planned is cut (:mod:`.range_cuts`)."""
        planned = self.planned
        return self._cuts if planned is not None and (planned.start, planned.end) == (start, end) else ()

    def plan_chunks(self, conn: Any, entry: TableEntry, split_size: int) -> TableChunks:
        info = table_info(conn, entry.schema, entry.table)
        chunks = plan_chunks(conn, info, split_size)
        rows = None
        if len(chunks) == 1:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {info.qualified} LIMIT %s) s", (split_size,))
                rows = int(cur.fetchone()[0])
        bounds = [(None if c.lo is None else [bound_to_json(v) for v in c.lo],
                   None if c.hi is None else [bound_to_json(v) for v in c.hi]) for c in chunks]
        return TableChunks(bounds, {"database": entry.schema, "name": entry.table, "key": list(info.key)}, rows)

    # the reader (executors) ---------------------------------------------------------------------------------

    def chunk_connection(self) -> Any:
        return connect(self.info)

    def read_chunk_arrow(self, chunk: dict[str, Any], conn: Any) -> Iterator[pa.RecordBatch]:
        """The chunk as Arrow typed by :mod:`.types` (:func:`.chunk_rows.read_chunk_arrow`)."""
        return lost_sessions_retryable(self.info, read_chunk_arrow(chunk, conn))

    def read_chunk(self, chunk: dict[str, Any], conn: Any) -> Iterator[pa.RecordBatch]:
        """The chunk as an ``s`` row and its ``r`` rows, ``B``/``E`` for a re-snapshot (:func:`.chunk_rows.read_chunk_rows`);
        the ``r`` rows already packed when :attr:`packed_chunks`."""
        return lost_sessions_retryable(self.info, read_chunk_rows(chunk, conn, self.packed_chunks))

    def read_changes(self, start: int, end: int,
                     planned_keys: Callable[[], Mapping[int, tuple[str, ...]]] | None) -> Iterator[pa.RecordBatch]:
        """The changes of the followed tables in ``[start, end)`` as stream rows (:mod:`.change_stream`).

        A purged log is :class:`.changes.BinlogPurgedError` -- unless :attr:`skip_purged` (``onSlotLost=resnapshot``):
        then the read ends there, with the rows it gave (none when the start was purged, the usual case: a range
        replayed after the server purged its log). The enumerator does not go on from the range's end: the planning
        after the epoch checks the range's *start* (:meth:`MysqlEnumerator.on_checkpoint_complete
        <flinkish_spark.connectors.mysql.source.enumerator.MysqlEnumerator.on_checkpoint_complete>`), which a purge
        that stopped this read has taken too (a purge removes the oldest files first), and starts a new generation."""
        if start >= end:
            return
        with session(self.info) as conn:
            first, last = self._position(start, conn), self._position(end, conn)
            decoder = self._decoder(conn, images=self.packed_chunks and self.row_images)
            mariadb = self._is_mariadb(conn)
        planned = None if planned_keys is None else functools.cache(planned_keys)  # read once, when first needed

        def planned_key(name: str) -> tuple[str, ...] | None:
            return None if planned is None else planned().get(table_id(name))

        def catalog_schema(database: str, table: str) -> TableSchema | None:
            with session(self.info) as c:
                try:
                    return schema_of_info(table_info(c, database, table))
                except Exception:  # gone, or without a key now: no 't' row to give
                    return None

        txns = read_range(self.info, first, last, decoder, self._reader_id(), mariadb=mariadb)
        try:
            yield from change_batches(txns, self._follows, planned_key, catalog_schema, decoder.text_types,
                                      packed=self.packed_chunks)
        except BinlogPurgedError as e:
            if not self.skip_purged:
                raise
            log.warning("%s: the changes %s..%s are no longer in the server's binary log (%s); under "
                        "onSlotLost=resnapshot the next planning snapshots every table again", self._component,
                        first, last, e)


if TYPE_CHECKING:
    def _conforms(dialect: MysqlDialect) -> SourceDialect:
        return dialect  # mypy holds MysqlDialect to the core's protocol, as PostgresDialect
