"""``flinkish.postgres`` with ``{schema}``/``{table}`` in ``table``: the multi-table stream, one keyed PostgreSQL table per source table.

* **Prepare** (executors): a task bulk-loads its rows (ADBC's COPY) into the sink's one staging
  table (``flinkish_staging_<uid>_<hash>`` in the bookkeeping schema, :func:`bookkeeping_schema`)
  and commits: per row the source table, ``_op``, ``_lsn``, ``_seq`` and the row as JSON whose
  values are PostgreSQL's input text for the column's type (:func:`pg_text_row`: numbers with
  every digit, bytea as ``\\x`` hex, arrays as array literals) and ``_commit_ts``. The committable names the task
  attempt and, per source table, the schemas its rows used (:class:`RoutedStaged`).
* **Commit** (driver, after the decision): **one transaction** for the whole epoch. It first
  checks ``flinkish_commits`` for the epoch (a replay or a crash after the commit: done). Then
  per source table (sorted by name): the target is created or evolved
  (:mod:`.routed_schema`: ``CREATE TABLE`` with the source's types and primary key, ``ADD
  COLUMN``, ``ALTER COLUMN ... TYPE`` to widen; :class:`~flinkish_spark.errors.SchemaChangeError`
  for what it cannot follow), its rows are applied in the table's mode (:class:`RoutedPlan.modes
  <flinkish_spark.connectors.lakehouse.table_modes.TableModes>`, :mod:`.routed_apply`: by default a
  truncate empties it and the epoch's last change per key is applied -- delete, or ``INSERT ... ON
  CONFLICT (key) DO UPDATE`` of every column; soft deletes and history versions otherwise), a
  re-snapshot's end retires the keys it did not deliver (:mod:`.resnapshot`), and a row ``(uid,
  epoch, target)`` goes into ``flinkish_commits``. Then the epoch's staged rows are deleted, and
  the transaction commits.
* **Exactly once across tables**: PostgreSQL's DDL is transactional, so the schema changes, every
  table's rows and every commit row become visible together or not at all. A kill anywhere in
  the commit (crash point ``sink.between_tables``: the first table done inside the open
  transaction) leaves nothing; the restart commits the decided epoch once. A refused schema
  change leaves nothing of the epoch either, and the restart after the user's fix commits it.
* **Cost**: only the tables in the epoch's rows are touched (a few catalog queries and one
  statement each); the staging table is truncated with each commit.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.figures import Figures, epoch_figures, figures_by_table
from flinkish_spark.connectors.lakehouse.routed_modes import close_time_us
from flinkish_spark.connectors.lakehouse.routing import Route, TableEpoch, TablePart, require_key, tables_of
from flinkish_spark.connectors.lakehouse.table_modes import TableModes
from flinkish_spark.connectors.lakehouse.transform.hooks import transform_stream
from flinkish_spark.connectors.lakehouse.transform.rules import Transforms
from flinkish_spark.connectors.postgres.connection import (
    ConnectionInfo, adbc_connect, check_server_version, connect, qualified, quote_ident, require_psycopg, split_table,
)
from flinkish_spark.connectors.postgres import routed_shards
from flinkish_spark.connectors.postgres.resnapshot import apply_markers
from flinkish_spark.connectors.postgres.routed_apply import (
    JSON, Position, history_statements, literal, retire_sql, segments, truncate_sql, upsert_sql,
)
from flinkish_spark.connectors.postgres.routed_schema import check_shape, evolve, read_target
from flinkish_spark.connectors.postgres.rows import UNCHANGED_FIELD, Column, TableSchema
from flinkish_spark.connectors.postgres.rows.packed import is_packed, unpack_json
from flinkish_spark.connectors.postgres.staging import (
    Bookkeeping, S_ATTEMPT, S_EPOCH, S_PART, S_ROW, check_staged, chunks, clear_staged, create_commits_table, staging_table_name,
)
from flinkish_spark.errors import ConfigError, DatabaseUnavailableError, TargetWriteError
from flinkish_spark.faults import crash_point, fail_point
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

log = logging.getLogger(__name__)

COMMIT_MODE = "routed"  # flinkish_commits.commit_mode of a routed epoch's rows (one per target)
CHUNK_ROWS = 100_000
_DATA_OPS = ("r", "c", "u", "d")
_UNCHANGED_TEXT = json.dumps(UNCHANGED_FIELD)  # how the field's name appears in a row's JSON text


def bookkeeping_schema(template: str) -> str:
    """Where ``flinkish_commits`` and the staging table live: the template's schema when it is fixed
    (``mirror.{table}`` -> ``mirror``), otherwise ``public``."""
    if "." not in template:
        return "public"
    head = template.split(".", 1)[0]
    return "public" if "{" in head else head


def check_template(template: str, component: str) -> Route:
    """The route of a ``table`` option with placeholders; refused unless every target is ``schema.table``."""
    from flinkish_spark.connectors.lakehouse.routing import parse_route

    route = parse_route(template, "postgres", "table", component)
    split_table(template.replace("{schema}", "s").replace("{table}", "t"), f"{component}: option 'table'")
    return route


@dataclass(frozen=True)
class RoutedPart(TablePart):
    """One table's rows of one task under one schema (the rows themselves are staged, by attempt)."""

    rows: int = 0
    keyed: None = None  # the parts' rows are in the staging table, not in files
    unchanged: tuple[str, ...] = ()  # columns some of its rows did not carry (unchanged TOASTed values)


@dataclass(frozen=True)
class RoutedStaged:
    attempt_id: str
    rows: int
    parts: tuple[RoutedPart, ...]


@dataclass(frozen=True)
class RoutedPlan(Bookkeeping):
    """What the driver resolved; pickled into tasks (no password)."""

    conn: ConnectionInfo
    route: Route
    schema: str  # bookkeeping schema
    staging_table: str
    create_table: bool
    modes: TableModes = TableModes()  # each source table's mode and deletes (upsert, deletes applied: all)



def resolve_routed_plan(conn: ConnectionInfo, route: Route, uid: str, create_table: bool, component: str,
                        modes: TableModes = TableModes()) -> RoutedPlan:
    """Create the bookkeeping tables (the targets are created by the commits that first have their rows)."""
    schema = bookkeeping_schema(route.template)
    staging = staging_table_name(uid, route.template)
    with connect(conn, autocommit=True) as c:
        check_server_version(c, conn, component)
        if c.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
            c.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        create_commits_table(c, schema)
        c.execute(
            f"CREATE TABLE IF NOT EXISTS {qualified(schema, staging)} ({S_EPOCH} bigint NOT NULL, {S_ATTEMPT} text NOT NULL, "
            f"{S_PART} integer NOT NULL, {S_ROW} bigint NOT NULL, _table text NOT NULL, _op text NOT NULL, "
            "_lsn bigint, _seq integer, _row text, _commit_ts timestamptz)"
        )
        # A staging table of an earlier version lacks _commit_ts (history's times): its rows get none.
        c.execute(f"ALTER TABLE {qualified(schema, staging)} ADD COLUMN IF NOT EXISTS _commit_ts timestamptz")
        c.execute(f"COMMENT ON TABLE {qualified(schema, staging)} IS "
                  f"'flinkish.postgres staging for sink uid {uid} routing to {route.template}'")
    return RoutedPlan(conn, route, schema, staging, create_table, modes)


# -- rows as PostgreSQL input text ---------------------------------------------------------------


def pg_text_row(text: str, schema: TableSchema) -> str:
    """A stream row (JSON, :mod:`flinkish_spark.connectors.postgres.rows.schema`'s encoding) as JSON whose values
    are each column's PostgreSQL input text (or null): ``(row->>'c')::<type>`` reads it back exactly."""
    values = json.loads(text, parse_float=str, parse_int=str, parse_constant=str)  # every digit kept, NaN as text
    out: dict[str, str | None] = {}
    for col in schema.columns:
        if col.name in values:
            v = values[col.name]
            out[col.name] = None if v is None else _input_text(v, col)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def _input_text(v: Any, col: Column) -> str:
    if col.encoding == "bool":
        return "true" if v is True else "false"
    if col.encoding == "base64":
        return "\\x" + base64.b64decode(v).hex()
    if col.encoding == "array":
        return _array_literal(v)
    return str(v)


def _array_literal(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, list):
        return "{" + ",".join(_array_literal(x) for x in v) + "}"
    if v is True or v is False:
        return "t" if v else "f"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


#: Stream rows turned into Python values at once by :func:`stage_rows`.
STAGE_SLICE_ROWS = 65_536


def stage_rows(table: pa.Table, ctx: PrepareContext, attempt_id: str) -> tuple[pa.Table, tuple[RoutedPart, ...]]:
    """A task's stream rows as staging rows, and per table what the commit needs to know: the task's newest
    schema of it (the one its target is evolved to, as the lakehouse routing sinks do: rows of an older schema
    in the same task fit it -- a change in between widened it, or was refused), the largest ``_lsn``, the rows
    and the truncate / re-snapshot markers."""
    schemas: dict[str, TableSchema] = {}
    for r in table.filter(pc.equal(table.column("_op"), "s")).to_pylist():
        s = TableSchema.from_json(r["row"])
        schemas[s.schema_id] = s
    cols: dict[str, list[Any]] = {k: [] for k in ("_table", "_op", "_lsn", "_seq", "_commit_ts", "_row")}
    newest: dict[str, tuple[tuple[int, int, int], str]] = {}  # table -> (position, schema id) of its newest schema
    by_change: dict[str, list[tuple[tuple[int, int, int], str]]] = {}  # table -> its schemas the changes announced
    info: dict[str, dict[str, Any]] = {}
    # A slice at a time: the task's rows as Python dicts all at once were most of the task's memory (a big
    # transaction's epoch: 1.2 GiB at 1 M rows); one slice of them, and the staging columns, suffice.
    for r in (r for batch in table.to_batches(max_chunksize=STAGE_SLICE_ROWS) for r in batch.to_pylist()):
        op, lsn, seq = r["_op"], r["_lsn"], r["_seq"]
        position = (0, 0, 0) if lsn is None else (1, int(lsn), int(seq or 0))
        if op == "s":
            sid = TableSchema.from_json(r["row"]).schema_id
            name = schemas[sid].table
        else:
            sid, name = r["_schema_id"], r["_table"]
        t = info.setdefault(name, {"lsn": -1, "rows": 0, "ops": set(), "unchanged": set()})
        if sid and sid in schemas and (name not in newest or position >= newest[name][0]):
            newest[name] = (position, sid)
        if op == "s":
            if lsn is not None:
                by_change.setdefault(name, []).append((position, sid))
            continue
        row = None
        if op in _DATA_OPS:
            schema = schemas.get(sid)
            if schema is None:
                raise ValueError(f"a row of {name} names schema {sid} without an 's' row in the same task")
            row = pg_text_row(r["row"], schema)  # without the columns the change did not carry
            if _UNCHANGED_TEXT in r["row"]:
                t["unchanged"].update(json.loads(r["row"]).get(UNCHANGED_FIELD) or ())
            t["rows"] += 1
        else:
            t["ops"].add(op)
        if lsn is not None:
            t["lsn"] = max(t["lsn"], int(lsn))
        for k, v in (("_table", name), ("_op", op), ("_lsn", lsn), ("_seq", seq), ("_commit_ts", r["_commit_ts"]),
                     ("_row", row)):
            cols[k].append(v)
    n = len(cols["_op"])
    staged = pa.table({
        S_EPOCH: pa.array([ctx.epoch] * n, pa.int64()), S_ATTEMPT: pa.array([attempt_id] * n, pa.string()),
        S_PART: pa.array([ctx.partition_id] * n, pa.int32()), S_ROW: pa.array(range(n), pa.int64()),
        "_table": pa.array(cols["_table"], pa.string()), "_op": pa.array(cols["_op"], pa.string()),
        "_lsn": pa.array(cols["_lsn"], pa.int64()), "_seq": pa.array(cols["_seq"], pa.int32()),
        "_row": pa.array(cols["_row"], pa.string()),
        # last, as an earlier version's staging table has it (added by ALTER TABLE)
        "_commit_ts": pa.array(cols["_commit_ts"], pa.timestamp("us", tz="UTC")),
    })

    def earlier(name: str) -> tuple[str, ...]:
        """The older schemas the task's changes announced (see TablePart.earlier), oldest first."""
        order = [sid for _, sid in sorted(by_change.get(name, []))]
        last = newest[name][1] if name in newest else None
        return tuple(schemas[sid].to_json() for i, sid in enumerate(order) if sid != last and sid not in order[i + 1:])

    figures = figures_by_table(table)
    parts = tuple(RoutedPart(name, schemas[newest[name][1]].to_json() if name in newest else "", t["lsn"],
                             "t" in t["ops"], "B" in t["ops"], "E" in t["ops"], t["rows"], earlier=earlier(name),
                             unchanged=tuple(sorted(t["unchanged"])), figures=figures.get(name, Figures()))
                  for name, t in sorted(info.items()))
    return staged, parts


ROUTED_PREFIX = b'{"kind":"routed"'  # how a routed committable's encoding starts (flinkish orphans tells them apart)


def encode_staged(c: RoutedStaged) -> bytes:
    parts = [{"table": p.table, "schema": p.schema, "lsn": p.lsn, "truncate": p.truncate, "begin": p.begin,
              "end": p.end, "rows": p.rows, "unchanged": list(p.unchanged), "n": p.figures.to_json(),
              **({"earlier": list(p.earlier)} if p.earlier else {})} for p in c.parts]
    return json.dumps({"kind": "routed", "attempt_id": c.attempt_id, "rows": c.rows, "parts": parts},
                      separators=(",", ":")).encode()


def decode_staged(data: bytes) -> RoutedStaged:
    d = json.loads(data)
    return RoutedStaged(str(d["attempt_id"]), int(d["rows"]), tuple(
        RoutedPart(p["table"], p["schema"], int(p["lsn"]), bool(p["truncate"]), bool(p["begin"]), bool(p["end"]),
                   int(p["rows"]), earlier=tuple(p.get("earlier", ())), unchanged=tuple(p.get("unchanged") or ()),
                   figures=Figures.from_json(p.get("n")))
                   for p in d["parts"]))


class RoutedPostgresSink(TwoPhaseCommitSink[RoutedStaged]):
    #: Columns and rows chosen per table (option ``transforms``), applied to each task's rows before they are staged.
    transforms: Transforms = Transforms()

    def __init__(self, plan: RoutedPlan, uid: str, lock_timeout_s: int) -> None:
        self.plan, self.uid, self.lock_timeout_s = plan, uid, lock_timeout_s

    # -- prepare (executors) -----------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> RoutedStaged | None:
        plan = self.plan
        attempt_id = f"{ctx.partition_id}/{ctx.attempt}/{uuid.uuid4().hex[:8]}"
        got = [b for b in batches if b.num_rows]
        if not got:
            return None
        stream = pa.Table.from_batches(got)
        if is_packed(stream.column_names):  # rowFormat=arrow: back to JSON rows, which staging holds
            stream = unpack_json(stream)
        stream = transform_stream(self.transforms, stream)  # columns and rows chosen: before anything is staged
        staged, parts = routed_shards.tag_shards(plan.route, *stage_rows(stream, ctx, attempt_id))
        if not parts:
            return None
        for part in parts:  # a name no target can have: refused before the epoch's decision is recorded
            plan.route.target(part.table)
        conn = adbc_connect(plan.conn)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET lock_timeout = {int(self.lock_timeout_s * 1000)}")
            for chunk in chunks(iter(staged.to_batches()), CHUNK_ROWS):
                with conn.cursor() as cur:
                    cur.adbc_ingest(plan.staging_table, chunk, mode="append", db_schema_name=plan.schema)
                fail_point("sink.write", attempt=ctx.attempt)
            conn.commit()
        except Exception as e:
            if isinstance(e, (DatabaseUnavailableError, ConfigError)) or type(e).__name__ == "InjectedFailure":
                raise
            raise TargetWriteError(f"flinkish.postgres sink uid {self.uid!r}: staging the rows of epoch {ctx.epoch}, "
                                   f"partition {ctx.partition_id} failed: {plan.conn.mask(str(e).strip())}") from None
        finally:
            conn.close()
        return RoutedStaged(attempt_id, staged.num_rows, parts)

    # -- commit (driver) -------------------------------------------------------------------------

    def commit(self, committables: list[RoutedStaged], epoch: int) -> CommitOutcome:
        psycopg = require_psycopg()
        try:
            return self._commit(committables, epoch)
        except (DatabaseUnavailableError, psycopg.OperationalError) as e:
            log.warning("flinkish.postgres sink uid %r: commit of epoch %d will be retried: %s", self.uid, epoch,
                        self.plan.conn.mask(str(e)))
            return "RETRY_LATER"

    def _commit(self, committables: list[RoutedStaged], epoch: int) -> CommitOutcome:
        plan = self.plan
        ids = [s.attempt_id for s in committables]
        with connect(plan.conn) as c:
            with c.transaction():
                c.execute(f"SET LOCAL lock_timeout = {int(self.lock_timeout_s * 1000)}")
                done = c.execute(f"SELECT 1 FROM {plan.commits} WHERE sink_uid = %s AND epoch = %s AND commit_mode = %s "
                                 "LIMIT 1", (self.uid, epoch, COMMIT_MODE)).fetchone()
                if done:
                    clear_staged(c, plan.staging, epoch)
                    return "ALREADY_COMMITTED"
                want = sum(s.rows for s in committables)
                check_staged(c, plan, self.uid, epoch, ids, want)
                tables = tables_of((p for s in committables for p in s.parts), plan.route, "table")
                routed_shards.check_keys(plan.route, tables, lambda target: self._target_key(c, target))
                for i, t in enumerate(tables):
                    if i:
                        crash_point("sink.between_tables")  # earlier tables applied in the open transaction
                    self._commit_table(c, t, epoch, ids)
                clear_staged(c, plan.staging, epoch)
        return "COMMITTED"

    def _commit_table(self, c: Any, t: TableEpoch[RoutedPart], epoch: int, ids: list[str]) -> None:
        plan = self.plan
        mode = plan.modes.of(t.table)
        target = plan.route.target(t.table)
        schema, name = split_table(target, f"the target of {t.table}")
        steps = routed_shards.steps(plan.route, t.table, TableEpoch(t.table, [p for p in t.parts if p.schema]).steps())
        shard = routed_shards.scope(plan.route, t.table)  # merged shards: what takes rows away takes only this one's
        announced = [(s.schema, s.announced) for s in steps if not s.passing]
        if announced:
            if plan.create_table and c.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
                c.execute(f"CREATE SCHEMA {quote_ident(schema)}")
            columns = evolve(c, schema, name, t.table, steps, plan.create_table, mode)
        else:
            found = read_target(c, schema, name)
            if found is None:
                return  # a truncate or markers for a target never created: nothing to do
            check_shape(found, None, mode, t.table, f"{schema}.{name}")
            columns = found
        key = require_key(t.table, announced[-1][0]).key if announced else (columns.key or ())
        data = {n: ty for n, ty in columns.columns.items() if n not in mode.extra_columns}  # the source's columns
        qualified_target = qualified(schema, name)
        truncates = [Position(*r) for r in c.execute(
            f"SELECT _lsn, _seq, _commit_ts FROM {plan.staging} WHERE {S_EPOCH} = %s AND {S_ATTEMPT} = ANY(%s) "
            "AND _table = %s AND _op = 't' ORDER BY _lsn, _seq", (epoch, ids, t.table)).fetchall()] if t.truncate else []
        psycopg = require_psycopg()
        params: tuple[Any, ...] = (epoch, ids, t.table)
        unchanged = sorted({n for p in t.parts for n in p.unchanged if n in data and n not in key})
        # History: when a re-snapshot's changed row starts its version and its end closes the keys it did not deliver
        # (no commit time is known for either): the epoch's newest change of the table, else now -- as the routed
        # Delta and Iceberg sinks. With a truncate in the epoch every snapshot row is a version (without times).
        close_us = close_time_us(t.parts, False)
        snapshot_at = close_us if not truncates else None
        source = {c.name for c in announced[-1][0].columns} if announced else set(data)
        compared = [n for n in data if n in source]  # a column the source dropped (the target keeps it) is not compared
        tracked = mode.tracked(list(data), tuple(key), t.table)  # trackHistoryColumns (None: every column)
        try:
            for after, upto in segments(truncates, mode):
                if after is not None and (mode.mode, mode.deletes) == ("upsert", "true"):
                    c.execute(f"DELETE FROM {qualified_target} t WHERE TRUE{shard}")  # the last truncate empties it, then the rows after it
                if mode.mode == "history":
                    for sql, takes in history_statements(plan.staging, qualified_target, data, key, mode, unchanged,
                                                         after, upto, snapshot_at, compared, tracked):
                        c.execute(sql, params if takes else None)
                else:
                    c.execute(upsert_sql(plan.staging, qualified_target, data, key, mode, unchanged, after, upto), params)
                gone = truncate_sql(qualified_target, mode) if upto is not None else None
                if gone is not None and upto is not None:
                    c.execute(gone + shard, (upto.ts,) if mode.mode == "history" else None)
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as e:
            raise TargetWriteError(
                f"flinkish.postgres sink uid {self.uid!r}: epoch {epoch}'s rows of source table {t.table} do not fit its "
                f"target {schema}.{name}: {plan.conn.mask(str(e).strip())}. Nothing of the epoch is visible; the rows stay "
                f"staged and a restart retries the commit once the target accepts them") from None
        retire = retire_sql(qualified_target, mode, close_us)
        if retire is not None:  # deletes=false: a re-snapshot removes nothing, so it need not remember keys
            keys = ", ".join(f"({JSON}->>{literal(k)})::{columns.columns[k]} AS {quote_ident(k)}" for k in key)
            staged = (f"(SELECT {keys}, _op FROM (SELECT _row::jsonb AS {JSON}, _op FROM {plan.staging} WHERE {S_EPOCH} = %s "
                      f"AND {S_ATTEMPT} = ANY(%s) AND _table = %s) j) AS staged")
            apply_markers(c, schema, qualified_target, staged,
                          staging_table_name(self.uid, routed_shards.seen_name(plan.route, target, t.table)), key, "TRUE",
                          (epoch, ids, t.table), retire + shard[len(" AND"):] + (" AND" if shard else ""))
        # One row per target and epoch: a merged target's shards add theirs up.
        c.execute(f"INSERT INTO {plan.commits} (sink_uid, epoch, part, target, commit_mode, rows) VALUES (%s, %s, %s, %s, %s, %s) "
                  "ON CONFLICT (sink_uid, epoch, part) DO UPDATE SET rows = EXCLUDED.rows + " + plan.commits + ".rows",
                  (self.uid, epoch, target, target, COMMIT_MODE, sum(p.rows for p in t.parts)))

    def _target_key(self, c: Any, target: str) -> tuple[str, ...] | None:
        found = read_target(c, *split_table(target, "a merged target"))
        return None if found is None else found.key

    # -- abort / cleanup (driver) ------------------------------------------------------------------

    def abort(self, committables: list[RoutedStaged], epoch: int) -> None:
        ids = [s.attempt_id for s in committables]
        if ids:
            with connect(self.plan.conn, autocommit=True) as c:
                c.execute(f"DELETE FROM {self.plan.staging} WHERE {S_EPOCH} = %s AND {S_ATTEMPT} = ANY(%s)", (epoch, ids))

    def cleanup(self, epoch: int, keep: list[RoutedStaged]) -> None:
        """Delete staged rows no kept committable names, and any older epoch's that ``flinkish_commits`` shows committed."""
        with connect(self.plan.conn, autocommit=True) as c:
            committed = [int(r[0]) for r in c.execute(
                f"SELECT DISTINCT epoch FROM {self.plan.commits} WHERE sink_uid = %s AND commit_mode = %s AND epoch < %s",
                (self.uid, COMMIT_MODE, epoch)).fetchall()]
            c.execute(f"DELETE FROM {self.plan.staging} WHERE ({S_EPOCH} = %s AND NOT ({S_ATTEMPT} = ANY(%s))) "
                      f"OR {S_EPOCH} = ANY(%s)", (epoch, [s.attempt_id for s in keep], committed))

    def last_committed_epoch(self) -> int:
        """The newest epoch ``flinkish_commits`` records for this uid's routed targets (-1: none)."""
        with connect(self.plan.conn, autocommit=True) as c:
            row = c.execute(f"SELECT max(epoch) FROM {self.plan.commits} WHERE sink_uid = %s AND commit_mode = %s",
                            (self.uid, COMMIT_MODE)).fetchone()
        return -1 if row is None or row[0] is None else int(row[0])

    def figures(self, committables: list[RoutedStaged]) -> dict[str, Any]:
        return epoch_figures(p for c in committables for p in c.parts)

    def encode(self, committable: RoutedStaged) -> bytes:
        return encode_staged(committable)

    def decode(self, data: bytes) -> RoutedStaged:
        return decode_staged(data)
