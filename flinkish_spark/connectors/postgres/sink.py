"""``flinkish.postgres``: an exactly-once PostgreSQL sink with true two-phase commit.

Two commit modes (option ``commitMode``; ``auto`` picks ``prepared`` for append when the
server allows prepared transactions, ``staged`` otherwise):

``prepared`` (Flink's ``JdbcXaSinkFunction``)
    *Prepare* (executor): each task bulk-loads its rows (ADBC's binary COPY from Arrow)
    into the target in one transaction, adds a row (uid, epoch, gid) to
    ``flinkish_commits`` and ends with ``PREPARE TRANSACTION '<gid>'``; the gid
    ``flinkish/<uid>/<epoch>/<partition>/<attempt>/<run>`` is the committable. Before it
    writes, a task clears the way (:mod:`.prepared`): earlier runs' prepared transactions of
    the epoch are rolled back, an earlier attempt of the same task that prepared is adopted --
    their row locks would otherwise block it for ever -- and any other lock wait ends after
    ``lockTimeout``.
    *Commit* (driver): ``COMMIT PREPARED`` per gid. Idempotent: a gid that is no longer
    prepared but whose ``flinkish_commits`` row is visible was committed (the row became
    visible in the same commit); gone without the row is a terminal error naming the gid.
    *Abort / cleanup*: ``ROLLBACK PREPARED`` of every gid of the epoch that is not kept,
    found in ``pg_prepared_xacts`` by prefix, so crashed runs and failed attempts leave
    no prepared transaction (they hold locks and stop VACUUM until resolved).

``staged`` (no prepared transactions needed; the only mode for ``upsert``)
    *Prepare*: each task bulk-loads into the sink's staging table and commits normally.
    *Commit*: one driver transaction moves the epoch's kept staged rows into the target
    (``INSERT ... SELECT``, with ``DISTINCT ON (key)`` and ``ON CONFLICT (key) DO UPDATE``
    for upsert), records (uid, epoch) in ``flinkish_commits`` and deletes the epoch's staged
    rows. Idempotent: the record is checked first, in the same transaction.

Upsert cannot use prepared transactions: two tasks writing the same key in one epoch
would deadlock -- the second waits on the first's prepared row lock, which is released
only by the driver's ``COMMIT PREPARED``, which waits for the second task.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Iterator, Literal, Union

import numpy as np
import pyarrow as pa
from pyspark.sql.types import StructType

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.connectors.postgres.connection import (
    ConnectionInfo, adbc_connect, arrow_type_for, check_server_version, compatible, connect, parse_url, pg_type_for, qualified,
    quote_ident, require_psycopg, split_table,
)
from flinkish_spark.connectors.postgres.prepared import (
    GID_PREFIX, Gid, clear_the_way, epoch_prefix, is_lock_timeout, lock_timeout_error, prepared_gids,
)
from flinkish_spark.connectors.lakehouse.routing import check_stream, is_routed, refuse_keyed_options
from flinkish_spark.connectors.lakehouse.routes import ROUTE_OPTIONS, sink_routes
from flinkish_spark.connectors.lakehouse.table_modes import TRACK, TRACK_EXCEPT, TableModes, parse_table_modes
from flinkish_spark.connectors.lakehouse.transform.rules import TRANSFORM_OPTION, sink_transforms
from flinkish_spark.connectors.postgres.resnapshot import NOT_A_MARKER, apply_markers
from flinkish_spark.connectors.postgres.routed import RoutedPlan, RoutedPostgresSink, check_template, resolve_routed_plan
from flinkish_spark.connectors.postgres.staging import (
    Bookkeeping, S_ATTEMPT, S_EPOCH, S_PART, S_ROW, check_staged, chunks, clear_staged, create_commits_table, staging_table_name,
)
from flinkish_spark.errors import (
    CommitFailedError, ConfigError, DatabaseUnavailableError, TargetSchemaError, TargetWriteError,
)
from flinkish_spark.faults import crash_point, fail_point
from flinkish_spark.options import Options
from flinkish_spark.sink.datasource import TwoPhaseCommitDataSource
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

log = logging.getLogger(__name__)

Mode = Literal["append", "upsert"]
CommitMode = Literal["prepared", "staged"]
CommitModeOption = Literal["auto", "prepared", "staged"]

DEFAULT_LOCK_TIMEOUT_S = 60  # how long a task waits for a row or table lock before it fails with the holders named
#: Columns of a change stream (issue 11's CDC source) that are never written to the target.
CHANGE_COLUMNS = ("_op", "_lsn", "_commit_ts")
CHUNK_ROWS = 262_144  # rows per COPY inside one task transaction (bounds the task's memory)
TARGET_FILE = "_target.json"  # in the sink's metadata directory: what flinkish inspect shows
PREPARED_DEADLOCK = (
    "commitMode 'prepared' cannot be used with mode 'upsert': two tasks upserting the same key in one "
    "epoch would deadlock (the second waits on the first's prepared row lock, which only the driver's "
    "COMMIT PREPARED releases, and the driver waits for the second task). Use commitMode 'staged' (or 'auto')"
)


@dataclass(frozen=True)
class PreparedXact:
    """A prepared transaction holding one task attempt's rows."""

    gid: str
    rows: int


@dataclass(frozen=True)
class StagedRows:
    """One task attempt's rows in the staging table."""

    attempt_id: str
    rows: int


PostgresCommittable = Union[PreparedXact, StagedRows]


@dataclass(frozen=True)
class PostgresPlan(Bookkeeping):
    """What the driver resolved against the server; pickled into tasks (holds no password)."""

    conn: ConnectionInfo
    schema: str
    table: str
    mode: Mode
    key: tuple[str, ...]
    commit_mode: CommitMode
    columns: tuple[str, ...]  # target columns written, in DataFrame order
    arrow_schema: pa.Schema  # what each batch is cast to before the COPY
    deletes: bool
    staging_table: str

    @property
    def target(self) -> str:
        return qualified(self.schema, self.table)



def resolve_plan(
    conn: ConnectionInfo, table: str, uid: str, schema: StructType, mode: Mode = "append", key: tuple[str, ...] = (),
    create_table: bool = False, commit_mode: CommitModeOption = "auto", deletes: bool = False, component: str = "flinkish.postgres sink",
) -> PostgresPlan:
    """Check the target against the query's schema, create what is missing, pick the commit mode.

    Runs on the driver before any task writes: every error here leaves the database as it was
    (except ``createTable`` and the sink's own bookkeeping tables).
    """
    pg_schema, pg_table = split_table(table)
    if mode == "upsert" and not key:
        raise ConfigError(f"{component}: mode 'upsert' needs option 'key' (the comma-separated unique key columns)")
    if mode == "upsert" and commit_mode == "prepared":
        raise ConfigError(f"{component}: {PREPARED_DEADLOCK}")
    if deletes and mode != "upsert":
        raise ConfigError(f"{component}: option 'deletes' needs mode 'upsert' (a delete is applied by key)")
    names = schema.fieldNames()
    if deletes and "_op" not in names:
        raise ConfigError(f"{component}: option 'deletes' needs a column '_op' ('d' marks a delete); the query writes {schema.simpleString()}")
    fields = [f for f in schema.fields if not (deletes and f.name in CHANGE_COLUMNS)]
    missing_key = [k for k in key if k not in [f.name for f in fields]]
    if missing_key:
        raise ConfigError(f"{component}: option 'key' names {missing_key}, which the query does not write ({schema.simpleString()})")
    with connect(conn, autocommit=True) as c:
        check_server_version(c, conn, component)
        exists = c.execute("SELECT to_regclass(%s)", (qualified(pg_schema, pg_table),)).fetchone()[0]
        if exists is None:
            if not create_table:
                raise TargetSchemaError(
                    f"{component}: the table {pg_schema}.{pg_table} does not exist in {conn.masked}. Create it, "
                    "or set the option createTable=true to create it from the query's schema"
                    + (" with 'key' as primary key" if key else "")
                )
            cols = ", ".join(f"{quote_ident(f.name)} {pg_type_for(f.dataType)}" + (" NOT NULL" if f.name in key else "") for f in fields)
            pk = f", PRIMARY KEY ({', '.join(map(quote_ident, key))})" if key else ""
            c.execute(f"CREATE TABLE IF NOT EXISTS {qualified(pg_schema, pg_table)} ({cols}{pk})")
            log.info("%s: created table %s.%s", component, pg_schema, pg_table)
        target_types = dict(c.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (qualified(pg_schema, pg_table),),
        ).fetchall())
        arrow_fields = []
        for f in fields:
            pg_type = target_types.get(f.name)
            if pg_type is None:
                raise TargetSchemaError(
                    f"{component}: the table {pg_schema}.{pg_table} has no column {f.name!r} (it has "
                    f"{', '.join(target_types) or 'none'}). Add it (ALTER TABLE ... ADD COLUMN {quote_ident(f.name)} "
                    f"{pg_type_for(f.dataType)}) or drop it from the query"
                )
            if not compatible(f.dataType, pg_type):
                raise TargetSchemaError(
                    f"{component}: column {f.name!r} of {pg_schema}.{pg_table} is {pg_type}, which cannot hold the "
                    f"query's {f.dataType.simpleString()} without loss; cast the column in the query or change the "
                    f"table's type (e.g. {pg_type_for(f.dataType)})"
                )
            arrow_fields.append(pa.field(f.name, arrow_type_for(pg_type, f.dataType)))
        if mode == "upsert":
            _check_unique_key(c, pg_schema, pg_table, key, component)
        chosen = _choose_commit_mode(c, conn, mode, commit_mode, component)
        create_commits_table(c, pg_schema)
        staging = staging_table_name(uid, pg_table)
        if chosen == "staged":
            cols = ", ".join(f"{quote_ident(f.name)} {target_types[f.name]}" for f in fields)
            op = f", {quote_ident('_op')} text" if deletes else ""
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {qualified(pg_schema, staging)} ({S_EPOCH} bigint NOT NULL, {S_ATTEMPT} text NOT NULL, "
                f"{S_PART} integer NOT NULL, {S_ROW} bigint NOT NULL, {cols}{op})"
            )
            # No index: the table normally holds one epoch, which the commit reads whole; an index
            # would cost every bulk load (measured: staged append 3x slower than prepared with it).
            # Utility statements take no parameters; uid and names are plain identifiers (checked).
            c.execute(f"COMMENT ON TABLE {qualified(pg_schema, staging)} IS "
                      f"'flinkish.postgres staging for sink uid {uid} into {pg_schema}.{pg_table}'")
    return PostgresPlan(conn, pg_schema, pg_table, mode, tuple(key), chosen, tuple(f.name for f in fields),
                        pa.schema(arrow_fields), deletes, staging)


def _check_unique_key(c: Any, schema: str, table: str, key: tuple[str, ...], component: str) -> None:
    # ON CONFLICT (key) needs a unique index on exactly these columns (not a superset).
    rows = c.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid",
        (qualified(schema, table),),
    ).fetchall()
    if sorted(key) not in [sorted(r[0]) for r in rows]:
        raise TargetSchemaError(
            f"{component}: mode 'upsert' needs a unique key on ({', '.join(key)}) in {schema}.{table}, which has none "
            f"(an upsert finds the row to update by it). Add one: ALTER TABLE {schema}.{table} ADD PRIMARY KEY "
            f"({', '.join(key)}) -- or a UNIQUE constraint"
        )


def _choose_commit_mode(c: Any, conn: ConnectionInfo, mode: Mode, wanted: CommitModeOption, component: str) -> CommitMode:
    allowed = int(c.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()[0])
    if wanted == "prepared":
        if allowed == 0:
            raise ConfigError(
                f"{component}: commitMode 'prepared' needs prepared transactions, but the server at {conn.masked} has "
                "max_prepared_transactions = 0. Set it above the number of Spark tasks per batch (ALTER SYSTEM SET "
                "max_prepared_transactions = 64, then restart the server), or use commitMode 'staged'"
            )
        return "prepared"
    if wanted == "staged":
        return "staged"
    chosen: CommitMode = "prepared" if mode == "append" and allowed > 0 else "staged"
    why = ("append on a server with prepared transactions" if chosen == "prepared"
           else "upsert" if mode == "upsert" else "max_prepared_transactions = 0 on the server")
    log.warning("%s: commitMode auto chose '%s' (%s)", component, chosen, why)
    return chosen


class PostgresSink(TwoPhaseCommitSink[PostgresCommittable]):
    """The sink; :meth:`create` for ``transactional(...)`` (foreachBatch), options as the format's."""

    def __init__(self, plan: PostgresPlan, uid: str, run: str, lock_timeout_s: int = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self.plan = plan
        self.uid = uid
        self.run = run  # names this run's prepared transactions (attempt numbers restart at 0 on restart)
        self.lock_timeout_s = lock_timeout_s  # 0: wait for ever

    @classmethod
    def create(cls, url: str, table: str, uid: str, schema: StructType, mode: Mode = "append", key: tuple[str, ...] | str = (),
               create_table: bool = False, commit_mode: CommitModeOption = "auto", deletes: bool = False,
               password_env: str | None = None, lock_timeout: int = DEFAULT_LOCK_TIMEOUT_S) -> "PostgresSink":
        keys = tuple(k.strip() for k in key.split(",") if k.strip()) if isinstance(key, str) else tuple(key)
        conn = parse_url(url, password_env, what="PostgresSink.create(): url")
        if lock_timeout < 0:
            raise ConfigError(f"PostgresSink.create(): lock_timeout must be >= 0 seconds (0 waits for ever), got {lock_timeout}")
        plan = resolve_plan(conn, table, uid, schema, mode, keys, create_table, commit_mode, deletes, component="PostgresSink")
        return cls(plan, uid, uuid.uuid4().hex[:8], lock_timeout)

    @property
    def commit_mode(self) -> CommitMode:
        return self.plan.commit_mode

    def epoch_prefix(self, epoch: int) -> str:
        return epoch_prefix(self.uid, epoch)

    # -- prepare (executors) ---------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> PostgresCommittable | None:
        plan = self.plan
        staged = plan.commit_mode == "staged"
        me = Gid(self.uid, ctx.epoch, ctx.partition_id, ctx.attempt, self.run)
        gid = str(me)
        attempt_id = f"{ctx.partition_id}/{ctx.attempt}/{self.run}/{uuid.uuid4().hex[:8]}"
        conn = None
        rows = 0
        try:
            if not staged:
                earlier = clear_the_way(plan.conn, me)
                if earlier is not None:  # this task's earlier attempt prepared these rows: report it
                    return PreparedXact(earlier, sum(b.num_rows for b in batches))  # (the input is drained)
            for chunk in chunks(batches, CHUNK_ROWS):
                table = self._shape(chunk, ctx, attempt_id, rows) if staged else self._cast(chunk)
                if conn is None:
                    conn = adbc_connect(plan.conn)
                    with conn.cursor() as cur:  # a lock nobody releases must not hang the task (and the epoch)
                        cur.execute(f"SET lock_timeout = {int(self.lock_timeout_s * 1000)}")
                with conn.cursor() as cur:
                    cur.adbc_ingest(plan.staging_table if staged else plan.table, table, mode="append",
                                    db_schema_name=plan.schema)
                rows += table.num_rows
                fail_point("sink.write", attempt=ctx.attempt)  # rows loaded, transaction still open
            if conn is None:
                return None
            with conn.cursor() as cur:
                if staged:
                    conn.commit()
                    return StagedRows(attempt_id, rows)
                cur.execute(
                    f"INSERT INTO {plan.commits} (sink_uid, epoch, part, target, commit_mode, rows) VALUES ($1, $2, $3, $4, $5, $6)",
                    parameters=(self.uid, ctx.epoch, gid, f"{plan.schema}.{plan.table}", "prepared", rows),
                )
                cur.execute(f"PREPARE TRANSACTION '{gid}'")  # uid and run are [A-Za-z0-9_.-]: no quoting needed
            fail_point("sink.after_prepare", attempt=ctx.attempt)  # prepared; Spark never gets the message
            return PreparedXact(gid, rows)
        except Exception as e:
            raise self._write_error(e, ctx) from None
        finally:
            if conn is not None:
                try:
                    conn.close()  # an unprepared transaction is rolled back by the server
                except Exception:
                    pass

    def _cast(self, batch: pa.Table) -> pa.Table:
        return batch.select(list(self.plan.columns)).cast(self.plan.arrow_schema)

    def _shape(self, batch: pa.Table, ctx: PrepareContext, attempt_id: str, start: int) -> pa.Table:
        n = batch.num_rows
        out = self._cast(batch)
        # Built in Arrow, not from Python lists: this runs for every chunk of every task.
        extra = [
            (S_EPOCH, pa.repeat(pa.scalar(ctx.epoch, pa.int64()), n)),
            (S_ATTEMPT, pa.repeat(pa.scalar(attempt_id, pa.string()), n)),
            (S_PART, pa.repeat(pa.scalar(ctx.partition_id, pa.int32()), n)),
            (S_ROW, pa.array(np.arange(start, start + n, dtype=np.int64))),
        ]
        for i, (name, arr) in enumerate(extra):
            out = out.add_column(i, name, arr)
        if self.plan.deletes:
            out = out.append_column("_op", batch.column("_op").cast(pa.string()))
        return out

    def _write_error(self, e: Exception, ctx: PrepareContext) -> Exception:
        if isinstance(e, (DatabaseUnavailableError, ConfigError)) or type(e).__name__ == "InjectedFailure":
            return e
        if is_lock_timeout(e):
            me = Gid(self.uid, ctx.epoch, ctx.partition_id, ctx.attempt, self.run)
            return TargetWriteError(lock_timeout_error(self.plan.conn, self.uid, me, f"{self.plan.schema}.{self.plan.table}",
                                                       self.lock_timeout_s))
        text = self.plan.conn.mask(str(e).strip())
        return TargetWriteError(
            f"flinkish.postgres sink uid {self.uid!r}: PostgreSQL rejected the rows of epoch {ctx.epoch}, partition "
            f"{ctx.partition_id} (attempt {ctx.attempt}) for {self.plan.schema}.{self.plan.table}: {text}. Nothing of the "
            "epoch becomes visible; fix the data or the table's constraints and restart"
        )

    # -- commit / abort (driver) -------------------------------------------------------------

    def commit(self, committables: list[PostgresCommittable], epoch: int) -> CommitOutcome:
        psycopg = require_psycopg()
        try:
            if self.plan.commit_mode == "staged":
                return self._commit_staged([c for c in committables if isinstance(c, StagedRows)], epoch)
            return self._commit_prepared([c for c in committables if isinstance(c, PreparedXact)], epoch)
        except (DatabaseUnavailableError, psycopg.OperationalError) as e:
            # The server restarts or the network dropped: prepared transactions and staged rows
            # survive that, and the committer calls commit again after a pause.
            log.warning("flinkish.postgres sink uid %r: commit of epoch %d will be retried: %s", self.uid, epoch,
                        self.plan.conn.mask(str(e)))
            return "RETRY_LATER"

    def _commit_prepared(self, xacts: list[PreparedXact], epoch: int) -> CommitOutcome:
        with connect(self.plan.conn, autocommit=True) as c:
            present = prepared_gids(c, self.epoch_prefix(epoch))
            for i, x in enumerate(xacts):
                if x.gid in present:
                    c.execute(f"COMMIT PREPARED '{x.gid}'")
                elif not c.execute(f"SELECT 1 FROM {self.plan.commits} WHERE sink_uid = %s AND epoch = %s AND part = %s",
                                   (self.uid, epoch, x.gid)).fetchone():
                    raise CommitFailedError(
                        f"epoch {epoch} of sink uid {self.uid!r}: the prepared transaction {x.gid!r} is gone and "
                        f"{self.plan.commits} has no record of its commit: it was rolled back by hand (ROLLBACK PREPARED) "
                        "or the server lost it. Its rows are lost from the sink and must be rewritten"
                    )
                if i == 0 and len(xacts) > 1:
                    crash_point("sink.mid_commit")  # one partition's rows visible, the others' not yet
        return "COMMITTED"

    def _commit_staged(self, staged: list[StagedRows], epoch: int) -> CommitOutcome:
        plan = self.plan
        ids = [s.attempt_id for s in staged]
        with connect(plan.conn) as c:
            with c.transaction():
                done = c.execute(f"SELECT 1 FROM {plan.commits} WHERE sink_uid = %s AND epoch = %s AND part = 'staged'",
                                 (self.uid, epoch)).fetchone()
                if done:
                    self._clear_staged(c, epoch)
                    return "ALREADY_COMMITTED"
                want = sum(s.rows for s in staged)
                check_staged(c, plan, self.uid, epoch, ids, want)
                psycopg = require_psycopg()
                try:
                    c.execute(self._move_sql(), (epoch, ids))
                    if plan.deletes:  # a re-snapshot of the source after a lost slot: its deletes
                        apply_markers(c, plan.schema, plan.target, plan.staging, plan.staging_table, plan.key,
                                      f"{S_EPOCH} = %s AND {S_ATTEMPT} = ANY(%s)", (epoch, ids))
                except psycopg.errors.IntegrityError as e:
                    raise TargetWriteError(
                        f"flinkish.postgres sink uid {self.uid!r}: epoch {epoch} violates a constraint of "
                        f"{plan.schema}.{plan.table}: {plan.conn.mask(str(e).strip())}. Nothing of the epoch is visible; its rows "
                        f"stay in {plan.schema}.{plan.staging_table} and a restart retries the commit once the table accepts them"
                    ) from None
                c.execute(
                    f"INSERT INTO {plan.commits} (sink_uid, epoch, part, target, commit_mode, rows) VALUES (%s, %s, 'staged', %s, 'staged', %s)",
                    (self.uid, epoch, f"{plan.schema}.{plan.table}", want),
                )
                crash_point("sink.mid_commit")  # rows moved inside the open transaction, nothing visible yet
                self._clear_staged(c, epoch)
        return "COMMITTED"

    def _clear_staged(self, c: Any, epoch: int) -> None:
        clear_staged(c, self.plan.staging, epoch)

    def _move_sql(self) -> str:
        plan = self.plan
        cols = ", ".join(quote_ident(c) for c in plan.columns)
        where = f"{S_EPOCH} = %s AND {S_ATTEMPT} = ANY(%s)"
        if plan.mode == "append":
            # No ORDER BY: a table has no row order, and sorting an epoch's rows spills to disk.
            return f"INSERT INTO {plan.target} ({cols}) SELECT {cols} FROM {plan.staging} WHERE {where}"
        keys = ", ".join(quote_ident(k) for k in plan.key)
        # ON CONFLICT cannot touch a row twice in one statement: keep the last row per key
        # (highest partition, then highest row number -- the order Spark produced them in).
        op = ", _op" if plan.deletes else ""
        data = f" AND {NOT_A_MARKER}" if plan.deletes else ""
        last = (f"SELECT DISTINCT ON ({keys}) {cols}{op} FROM {plan.staging} WHERE {where}{data} "
                f"ORDER BY {keys}, {S_PART} DESC, {S_ROW} DESC")
        others = [c for c in plan.columns if c not in plan.key]
        update = ("DO UPDATE SET " + ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in others)) if others else "DO NOTHING"
        if not plan.deletes:
            return f"INSERT INTO {plan.target} ({cols}) {last} ON CONFLICT ({keys}) {update}"
        match = " AND ".join(f"t.{quote_ident(k)} = l.{quote_ident(k)}" for k in plan.key)
        return (f"WITH l AS ({last}), gone AS (DELETE FROM {plan.target} t USING l WHERE l._op = 'd' AND {match}) "
                f"INSERT INTO {plan.target} ({cols}) SELECT {cols} FROM l WHERE l._op IS DISTINCT FROM 'd' "
                f"ON CONFLICT ({keys}) {update}")

    def abort(self, committables: list[PostgresCommittable], epoch: int) -> None:
        with connect(self.plan.conn, autocommit=True) as c:
            if self.plan.commit_mode == "staged":
                ids = [x.attempt_id for x in committables if isinstance(x, StagedRows)]
                if ids:
                    c.execute(f"DELETE FROM {self.plan.staging} WHERE {S_EPOCH} = %s AND {S_ATTEMPT} = ANY(%s)", (epoch, ids))
                return
            present = prepared_gids(c, self.epoch_prefix(epoch))
            for x in committables:
                if isinstance(x, PreparedXact) and x.gid in present:
                    c.execute(f"ROLLBACK PREPARED '{x.gid}'")

    def cleanup(self, epoch: int, keep: list[PostgresCommittable]) -> None:
        """Roll back / delete what no kept committable names: this epoch's, and any older epoch's
        that ``flinkish_commits`` shows committed (so nothing there can still be committed)."""
        with connect(self.plan.conn, autocommit=True) as c:
            committed = {int(r[0]) for r in c.execute(
                f"SELECT DISTINCT epoch FROM {self.plan.commits} WHERE sink_uid = %s AND epoch < %s", (self.uid, epoch)).fetchall()}
            if self.plan.commit_mode == "staged":
                ids = [x.attempt_id for x in keep if isinstance(x, StagedRows)]
                c.execute(f"DELETE FROM {self.plan.staging} WHERE ({S_EPOCH} = %s AND NOT ({S_ATTEMPT} = ANY(%s))) "
                          f"OR {S_EPOCH} = ANY(%s)", (epoch, ids, sorted(committed)))
                return
            kept = {x.gid for x in keep if isinstance(x, PreparedXact)}
            for gid in prepared_gids(c, f"{GID_PREFIX}/{self.uid}/"):
                parsed = Gid.parse(gid)
                if gid in kept or parsed is None:
                    continue
                if parsed.epoch == epoch or parsed.epoch in committed:
                    c.execute(f"ROLLBACK PREPARED '{gid}'")

    def last_committed_epoch(self) -> int:
        """The newest epoch ``flinkish_commits`` records for this uid and target (-1: none): what a
        reset checkpointLocation is checked against (see :mod:`flinkish_spark.sink.incarnation`)."""
        with connect(self.plan.conn, autocommit=True) as c:
            row = c.execute(f"SELECT max(epoch) FROM {self.plan.commits} WHERE sink_uid = %s AND target = %s",
                            (self.uid, f"{self.plan.schema}.{self.plan.table}")).fetchone()
        return -1 if row is None or row[0] is None else int(row[0])

    def encode(self, committable: PostgresCommittable) -> bytes:
        kind = "prepared" if isinstance(committable, PreparedXact) else "staged"
        return json.dumps({"kind": kind, **asdict(committable)}, sort_keys=True).encode()

    def decode(self, data: bytes) -> PostgresCommittable:
        return decode_committable(data)


def decode_committable(data: bytes) -> PostgresCommittable:
    d = json.loads(data)
    kind = d.pop("kind")
    return PreparedXact(**d) if kind == "prepared" else StagedRows(**d)


class PostgresSinkDataSource(TwoPhaseCommitDataSource):
    """``df.writeStream.format("flinkish.postgres")``."""

    KIND = "flinkish.postgres"
    EXTRA_OPTIONS: ClassVar[tuple[str, ...]] = ("url", "table", "mode", "key", "createTable", "commitMode", "deletes", "passwordEnv",
                                                "lockTimeout", "tableModes", TRACK, TRACK_EXCEPT, TRANSFORM_OPTION,
                                                *ROUTE_OPTIONS)

    def configure(self, opts: Options) -> None:
        self.conn = parse_url(opts.required("url", "a libpq URI such as postgresql://user@host:5432/db"), opts.get("passwordEnv"))
        self.table = opts.required("table", "the target table, 'schema.table'")
        self.route = sink_routes(check_template(self.table, opts.component) if is_routed(self.table) else None,
                                 opts.has, opts.get, opts.component, "table")
        self._routed: RoutedPlan | None = None
        self.modes = TableModes()
        if self.route is not None:
            # mode / deletes / tableModes: each table's shape (upsert or history, deletes applied, soft or not);
            # key and partitionBy stay refused (every table is keyed by its primary key)
            refuse_keyed_options(opts.has, opts.component, "table")
            self.modes = parse_table_modes(opts.get, opts.component)
            self.modes.refuse_partitions(opts.component, "postgres")
            if opts.get("commitMode") == "prepared":
                raise ConfigError(f"{opts.component}: commitMode 'prepared' cannot be used with routing ('{{table}}' in "
                                  "'table'): every epoch commits in one driver transaction (staged). Drop the option")
        else:
            split_table(self.table)
        routed = self.route is not None
        self.transforms = sink_transforms(opts.get, routed, opts.component, "table")
        # routed: mode / deletes are each table's (self.modes); these are the single-target sink's
        self.mode: Mode = "append" if routed else opts.choice("mode", ("append", "upsert"), "append")
        raw_key = opts.get("key") or ""
        self.key = tuple(k.strip() for k in raw_key.split(",") if k.strip())
        self.create_table = _flag(opts, "createTable", "true" if routed else "false")
        self.deletes = False if routed else _flag(opts, "deletes")
        self.commit_mode_option: CommitModeOption = opts.choice("commitMode", ("auto", "prepared", "staged"), "auto")
        self.lock_timeout_s = opts.integer("lockTimeout", DEFAULT_LOCK_TIMEOUT_S, minimum=0)
        if self.mode == "upsert" and self.commit_mode_option == "prepared":
            raise ConfigError(f"{opts.component}: {PREPARED_DEADLOCK}")
        if self.mode == "upsert" and not self.key:
            raise ConfigError(f"{opts.component}: mode 'upsert' needs option 'key' (the comma-separated unique key columns)")
        self._plans: dict[str, PostgresPlan] = {}

    def plan(self, schema: StructType) -> PostgresPlan:
        cached = self._plans.get(schema.json())
        if cached is None:
            cached = resolve_plan(self.conn, self.table, self.uid, schema, self.mode, self.key, self.create_table,
                                  self.commit_mode_option, self.deletes, component=f"{self.name()} sink uid {self.uid!r}")
            self._plans[schema.json()] = cached
        return cached

    def routed_plan(self, schema: StructType) -> RoutedPlan:
        assert self.route is not None
        if self._routed is None:
            component = f"{self.name()} sink uid {self.uid!r}"
            check_stream(schema.fieldNames(), component, "table")
            self._routed = resolve_routed_plan(self.conn, self.route, self.uid, self.create_table, component, self.modes)
        return self._routed

    def sink(self, schema: StructType) -> Any:
        if self.route is not None:
            routed = RoutedPostgresSink(self.routed_plan(schema), self.uid, self.lock_timeout_s or 0)
            routed.transforms = self.transforms
            return routed
        return PostgresSink(self.plan(schema), self.uid, self.run_id[:8], self.lock_timeout_s or 0)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        record: dict[str, Any]
        if self.route is not None:
            routed = self.routed_plan(schema)  # on the driver: the input and the bookkeeping tables before any task runs
            record = {"sink": self.KIND, "url": self.conn.masked, "table": self.route.template, "mode": "routed",
                      "commitMode": "staged", "stagingTable": f"{routed.schema}.{routed.staging_table}"}
        else:
            plan = self.plan(schema)  # on the driver: check the target before any task runs
            record = {"sink": self.KIND, "url": self.conn.masked, "table": f"{plan.schema}.{plan.table}", "mode": plan.mode,
                      "key": list(plan.key), "commitMode": plan.commit_mode, "commitModeOption": self.commit_mode_option,
                      "stagingTable": f"{plan.schema}.{plan.staging_table}" if plan.commit_mode == "staged" else None}
        path = join(self.decision_log().directory, TARGET_FILE)
        self.io.write_bytes(path, json.dumps(record).encode())
        return super().streamWriter(schema, overwrite)


def _flag(opts: Options, name: str, default: str = "false") -> bool:
    return opts.choice(name, ("true", "false"), default) == "true"
