"""Routing the multi-table stream: one target per source table, keyed by the table's primary key.

Format-independent (``flinkish.delta``, ``flinkish.iceberg`` and ``flinkish.postgres`` use it):

* :class:`Route` -- a target name with ``{schema}`` / ``{table}`` placeholders, and the target
  of each source table (a path holds every name: :func:`path_part`; names an Iceberg or
  PostgreSQL target cannot hold are refused, naming the table);
* :func:`check_stream` -- the input must be the multi-table stream
  (:data:`flinkish_spark.connectors.postgres.rows.STREAM_DDL`);
* :func:`table_input` -- one table's rows of a task as a keyed change input (the table's columns,
  ``_op``, ``_lsn``) plus what is not a row change: a truncate (rows before it dropped) and the
  re-snapshot markers ``B`` / ``E``;
* :func:`table_plan` -- the :class:`ChangePlan` of one table: by its primary key, in the table's
  :class:`~flinkish_spark.connectors.lakehouse.table_modes.TableMode` (upsert or history, deletes
  applied, soft or ignored);
* :func:`tables_of` / :class:`TableEpoch` -- a decided epoch's parts per source table (what the
  commit applies to each target), two tables routed to one target refused -- unless a merging route rule
  makes them shards of it (:mod:`.routes`, :mod:`.shards`).

The guarantee it serves: applying a table's rows by key in stream order -- snapshot rows
first, then changes in ``(_lsn, _seq)`` order, a truncate emptying the target -- leaves the
target equal to the table (docs/postgres-source.md, "Why the result is exact").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generic, Iterable, NamedTuple, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.changes import (
    COMMIT_TS, LSN, OP, TIMESTAMP, UNCHANGED, ChangePlan, MergeMode, mode_fields,
)
from flinkish_spark.connectors.lakehouse.figures import Figures
from flinkish_spark.connectors.lakehouse.packed import PackedDecode
from flinkish_spark.connectors.lakehouse.table_modes import UPSERT, TableMode
from flinkish_spark.connectors.lakehouse.task_decode import TaskDecode
from flinkish_spark.connectors.postgres.rows.packed import is_packed
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.connectors.postgres.rows.decode import ROW_META
from flinkish_spark.errors import ConfigError, SchemaChangeError

PLACEHOLDERS = ("{schema}", "{table}")
STREAM_COLUMNS = ("_table", "_op", "_lsn", "_seq", "_commit_ts", "_schema_id", "row")
#: The options a routing sink refuses: it is always keyed by each table's primary key, unpartitioned (its
#: ``mode`` / ``deletes`` are per table: :mod:`~flinkish_spark.connectors.lakehouse.table_modes`).
NOT_WITH_ROUTING = ("key", "partitionBy")
#: A name part a path holds as it is: letters and digits (any script), '_', '.', '$', '-'; not only dots.
_PATH_AS_IS = re.compile(r"^[\w.$-]+$")
#: What :func:`path_part` makes of any name.
_PATH_PART = r"(?:[\w.$-]|~[0-9a-f]{2})+"


def path_part(part: str) -> str:
    """A source schema or table name as one segment of a path, on every storage (local, S3, the
    readers of Delta tables): as it is when it holds only letters, digits, ``_ . $ -``; otherwise
    each other character (a space, ``/``, ``%``, ``~`` ...) becomes ``~`` and its UTF-8 bytes in hex
    (``m b`` -> ``m~20b``), and a name of dots only has its dots escaped (``.`` and ``..`` are no
    folders). Injective (``~`` is escaped too, and no name as it is holds one), so two tables never
    share a target; and the names a path held before stay the same."""
    if _PATH_AS_IS.match(part) and part.strip("."):
        return part
    return "".join(ch if re.match(r"[\w$-]", ch) or (ch == "." and part.strip(".")) else
                   "".join(f"~{b:02x}" for b in ch.encode()) for ch in part)


def is_routed(value: str | None) -> bool:
    """Whether a target option asks for routing (holds ``{table}``)."""
    return value is not None and "{table}" in value


@dataclass(frozen=True)
class Route:
    """A target template: ``template.format(schema=..., table=...)`` per source table."""

    template: str
    kind: str  # "path" | "postgres" | "iceberg": what a resolved name must be valid as

    def target(self, source_table: str) -> str:
        schema, _, table = source_table.partition(".")
        if self.kind == "path":
            schema, table = path_part(schema), path_part(table)
        for part in (schema, table):
            bad = self._invalid(part)
            if bad:
                raise ConfigError(
                    f"source table {source_table!r} cannot be routed to {self.template!r}: {bad}. Exclude it in the "
                    f"source's 'tables' option (!{source_table}), or mirror it with a sink of its own"
                )
        name = self.template.replace("{schema}", schema).replace("{table}", table)
        if self.kind == "postgres" and any(len(p.encode()) > 63 for p in name.split(".")):
            raise ConfigError(f"source table {source_table!r} routes to {name!r}, whose name is longer than "
                              "PostgreSQL's 63 bytes; use a shorter 'table' template, or exclude it in the source's "
                              f"'tables' option (!{source_table})")
        return name

    def matches(self, name: str) -> bool:
        """Whether ``name`` is a target this route can name (some schema and table put in): how a sink
        finds its targets without the source's table list (e.g. the last epoch any of them holds)."""
        part = {"path": _PATH_PART, "iceberg": "[^.]+"}.get(self.kind, ".+")
        regex = "".join(part if piece in PLACEHOLDERS else re.escape(piece)
                        for piece in re.split("(\\{schema\\}|\\{table\\})", self.template))
        return re.fullmatch(regex, name) is not None

    def merged(self, source_table: str) -> Any:
        """The rule merging ``source_table`` with other shards into one target (:mod:`.routes`); None here."""
        return None

    def _invalid(self, part: str) -> str | None:
        if self.kind == "iceberg" and "." in part:
            return f"{part!r} holds a '.', which would be another Iceberg namespace level"
        return None


def parse_route(template: str, kind: str, option: str, component: str) -> Route:
    if "{table}" not in template:
        raise ConfigError(f"{component}: option {option!r} needs '{{table}}' to route tables ({template!r})")
    rest = template.replace("{schema}", "").replace("{table}", "")
    if "{" in rest or "}" in rest:
        raise ConfigError(f"{component}: option {option!r} = {template!r} has a placeholder other than "
                          "{schema} and {table}")
    return Route(template, kind)


def refuse_keyed_options(has: Callable[[str], bool], component: str, option: str) -> None:
    """Refuse :data:`NOT_WITH_ROUTING` with routing (``mode``/``deletes`` are taken per table)."""
    given = [o for o in NOT_WITH_ROUTING if has(o)]
    if given:
        raise ConfigError(
            f"{component}: option {', '.join(repr(g) for g in given)} cannot be combined with routing "
            f"('{{table}}' in {option!r}): each table is written keyed by its primary key, unpartitioned "
            "(docs/mirror.md). Drop the option."
        )


def check_stream(names: list[str], component: str, option: str) -> None:
    """Refuse an input that is not the multi-table stream (its JSON shape or its packed one, ``rowFormat=arrow``)."""
    if list(names) != list(STREAM_COLUMNS) and not is_packed(names):
        raise ConfigError(
            f"{component}: '{{table}}' in {option!r} routes the multi-table stream of a flinkish.postgres source "
            f"read with the option 'tables' (columns {', '.join(STREAM_COLUMNS)}), but the query writes "
            f"{', '.join(names)}. Read with .option('tables', ...), or name one target without placeholders."
        )


def table_plan(data: pa.Schema, key: tuple[str, ...], merge_mode: MergeMode, mode: TableMode = UPSERT,
               table: str = "") -> ChangePlan:
    """The keyed plan of one table: by ``key`` in ``mode`` (upsert or history; deletes applied, soft or ignored),
    ``_op``, ``_lsn``, ``_commit_ts`` (history's ``_valid_from``/``_valid_to``) and ``_unchanged`` (the columns an
    update did not carry: the target keeps its value) steering. The table's columns are ``data`` and the mode's
    :attr:`~.TableMode.extra_columns`; a source column of one of those names is refused, naming ``table``."""
    clash = [f.name for f in data if f.name in mode.extra_columns]
    if clash:
        raise SchemaChangeError(
            f"source table {table}: its column(s) {', '.join(clash)} have the name of a column its target's mode "
            f"({mode.describe()}) writes itself; rename them in the source, or give "
            f"the table another mode (the sink's 'tableModes' option), or exclude it in the source's 'tables' option"
        )
    input_schema = pa.schema(list(data) + [pa.field(OP, pa.string()), pa.field(LSN, pa.int64()),
                                           pa.field(COMMIT_TS, TIMESTAMP), pa.field(UNCHANGED, pa.list_(pa.string()))])
    return ChangePlan(mode.mode, tuple(key), mode.deletes, merge_mode, input_schema,
                      pa.schema(list(data) + mode_fields(mode.mode, mode.deletes)),
                      mode.tracked(data.names, tuple(key), table) if len(data) else None)


def source_columns(schema: pa.Schema, mode: TableMode) -> pa.Schema:
    """A target's columns without its mode's extra columns: what the source table's are."""
    return pa.schema([f for f in schema if f.name not in mode.extra_columns])


@dataclass(frozen=True)
class TableInput:
    """One table's rows of one task, as a keyed target takes them."""

    changes: pa.Table  # the data columns, _op (r/c/u/d), _lsn, _commit_ts and _unchanged, in stream order, after the last truncate
    truncate: bool  # the task's rows hold a truncate: the target is emptied (upsert), or its rows marked, before ``changes``
    begin: bool  # a re-snapshot begins (B)
    end: bool  # ... ends (E): delete the keys no row since B carried
    lsn: int  # the largest _lsn of the rows (-1: snapshot rows only)
    earlier: tuple[str, ...] = ()  # TableSchema JSON: the older schemas changes of these rows announced, oldest first
    figures: Figures = Figures()  # what the rows were, all of them (before the truncate): set by task_tables
    truncate_us: int = -1  # the last truncate's source commit time (epoch µs; -1: none, or not known)
    #: With a truncate: every row change of the task and the truncates (``_op`` 't'), as ``changes`` (for the modes
    #: that keep what a truncate takes: :func:`truncates_as_deletes`).
    whole: pa.Table | None = None


def table_input(rows: pa.Table) -> TableInput:
    """From :attr:`TableRows.rows <flinkish_spark.connectors.postgres.rows.TableRows.rows>`."""
    ops = rows.column("_op")
    markers = set(pc.unique(pc.filter(ops, pc.is_in(ops, pa.array(["B", "E"])))).to_pylist())
    truncates = pc.indices_nonzero(pc.equal(ops, "t"))
    truncate = len(truncates) > 0
    truncate_us = -1
    whole = None
    data = [n for n in rows.column_names if n not in ROW_META]

    def as_changes(rows: pa.Table) -> pa.Table:
        return (rows.select(data).append_column(OP, rows.column("_op"))
                .append_column(LSN, rows.column("_lsn").cast(pa.int64()))
                .append_column(COMMIT_TS, rows.column("_commit_ts").cast(TIMESTAMP))
                .append_column(UNCHANGED, rows.column(UNCHANGED)))

    if truncate:
        at = truncates[-1].as_py()
        ts = rows.column("_commit_ts")[at]
        if ts.is_valid:
            truncate_us = int(ts.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).as_py())
        whole = as_changes(rows.filter(pc.is_in(rows.column("_op"), pa.array(["r", "c", "u", "d", "t"]))))
        rows = rows.slice(at + 1)
    rows = rows.filter(pc.is_in(rows.column("_op"), pa.array(["r", "c", "u", "d"])))
    lsn = pc.max(rows.column("_lsn")).as_py() if rows.num_rows else None
    return TableInput(as_changes(rows), truncate, "B" in markers, "E" in markers, -1 if lsn is None else int(lsn),
                      truncate_us=truncate_us, whole=whole)


def truncates_as_deletes(data: TableInput, key: tuple[str, ...]) -> pa.Table:
    """The task's row changes with each truncate as a delete of every key a row since the one before carried
    (at the truncate's LSN and commit time): what a target that keeps what a truncate takes (soft deletes,
    history, deletes ignored) applies -- a change before the truncate in the same epoch is a version too. The
    target's own rows from before the epoch are the commit's to mark (:mod:`.routed_modes`)."""
    if data.whole is None:
        return data.changes
    whole = data.whole
    ops = whole.column(OP).to_pylist()
    pieces: list[pa.Table] = []
    start = 0
    for i, op in enumerate(ops):
        if op != "t":
            continue
        since = whole.slice(start, i - start)
        pieces.append(since)
        keys = since.select(list(key)).group_by(list(key), use_threads=False).aggregate([])
        n = keys.num_rows
        if n:
            t = whole.slice(i, 1)
            cols = {f.name: (keys.column(f.name).cast(f.type) if f.name in key else
                             pa.repeat(t.column(f.name)[0], n) if f.name in (LSN, COMMIT_TS) else
                             pa.repeat(pa.scalar("d"), n) if f.name == OP else pa.nulls(n, f.type))
                    for f in whole.schema}
            pieces.append(pa.table(cols, schema=whole.schema))
        start = i + 1
    pieces.append(whole.slice(start))
    return pa.concat_tables(pieces)


#: Stream rows a sink task decodes at once (:func:`task_tables`): their JSON texts are dropped once typed, so a task
#: of millions of rows (one big transaction) never holds all its texts, only the typed rows (docs/postgres-source.md,
#: "Big transactions").
DECODE_ROWS = 131_072


def task_tables(batches: Iterable[pa.RecordBatch]) -> list[tuple[str, TableSchema, TableInput]]:
    """A task's rows per source table (sorted by name): the table's newest schema in the task and its input
    (with :attr:`TableInput.earlier`: what the commit's evolution must see of a schema change within the task).

    The rows are typed as they arrive (:class:`.task_decode.TaskDecode`): a one-table task in stream order a batch
    at a time, anything else :data:`DECODE_ROWS` at a time; the same rows as one decode of the whole task, and the
    task's JSON texts are never all held."""
    decode: TaskDecode | PackedDecode | None = None
    for b in batches:
        if decode is None:  # the shape of the stream (rowFormat=arrow: packed, :mod:`.packed`)
            decode = PackedDecode() if is_packed(b.schema.names) else TaskDecode(DECODE_ROWS)
        decode.add(b)
    if decode is None:
        return []
    return [(name, require_key(name, last.schema),
             replace(table_input(rows), figures=figures, earlier=earlier))
            for name, (last, rows, figures, earlier) in decode.result().items()]


def require_key(table: str, schema: TableSchema) -> TableSchema:
    """``schema`` if it names a key: a routed target is applied by key, and a schema without one
    (the table's primary key dropped while it is followed) is one clear error, nothing written."""
    if not schema.key:
        raise SchemaChangeError(
            f"source table {table}: its schema in the stream (schema id {schema.schema_id}) has no primary key, so "
            f"its changes cannot be applied by key to its routed target. Give the table its primary key again "
            f"(ALTER TABLE {table} ADD PRIMARY KEY (...)) and mirror it anew, or exclude it in the source's "
            f"'tables' option (!{table})"
        )
    return schema


@dataclass(frozen=True)
class TablePart:
    """One table's share of one task, what every format's part carries besides its files."""

    table: str  # the source table, schema.table
    schema: str  # its newest TableSchema JSON in the task
    lsn: int  # the largest _lsn of the task's rows of the table (-1: snapshot rows only)
    truncate: bool
    begin: bool
    end: bool
    #: The task's older schemas of the table that its changes announced (TableSchema JSON, oldest first):
    #: a change task can hold a type and its narrowing, which the evolution must both see.
    earlier: tuple[str, ...] = field(default=(), kw_only=True)
    #: What the task's rows of the table were (counted rows, newest commit time): the epoch's figures for a status.
    figures: Figures = field(default=Figures(), kw_only=True)
    #: The task's last truncate's source commit time (epoch µs; -1: none): where history closes the current versions.
    truncate_us: int = field(default=-1, kw_only=True)


class PartLike(Protocol):
    """One table's share of one task (each format's committable part has these, read only)."""

    @property
    def table(self) -> str: ...  # the source table, schema.table

    @property
    def schema(self) -> str: ...  # its newest TableSchema JSON in the task

    @property
    def lsn(self) -> int: ...  # the largest _lsn of the task's rows of the table (-1: snapshot rows only)

    @property
    def truncate(self) -> bool: ...

    @property
    def begin(self) -> bool: ...

    @property
    def end(self) -> bool: ...

    @property
    def earlier(self) -> tuple[str, ...]: ...

    @property
    def figures(self) -> Figures: ...

    @property
    def keyed(self) -> Any: ...


P = TypeVar("P", bound=PartLike)


class SchemaStep(NamedTuple):
    """One source schema a target's evolution goes through (:meth:`TableEpoch.steps`)."""

    schema: TableSchema
    announced: bool  # a change carried it (False: snapshot rows only)
    passing: bool  # an older schema of a change task, before its newest: it moves no column


@dataclass
class TableEpoch(Generic[P]):
    """Every task's part of one table in one epoch (committable order)."""

    table: str
    parts: list[P]

    def schemas(self) -> list[TableSchema]:
        """The tasks' schemas, oldest first: snapshot tasks, then by LSN."""
        return [s for s, _ in self.announced()]

    def announced(self) -> list[tuple[TableSchema, bool]]:
        """:meth:`schemas`, each with whether a change announced it (False: snapshot rows only, whose
        schema is the catalog's when the chunk was read -- older or newer than the changes' position,
        see :mod:`~flinkish_spark.connectors.lakehouse.evolution`)."""
        return [(s.schema, s.announced) for s in self.steps() if not s.passing]

    def steps(self) -> list[SchemaStep]:
        """What the target's evolution goes through, oldest first: each task's newest schema (snapshot
        tasks first, then by LSN; one schema once, where it came last) and, before a change task's newest,
        the older ones its changes announced (``passing``: they only tell what the changes announced)."""
        out: list[SchemaStep] = []
        for p in sorted(self.parts, key=lambda p: p.lsn):
            out += [SchemaStep(TableSchema.from_json(e), True, True) for e in p.earlier]
            s = TableSchema.from_json(p.schema)
            had = [i for i, o in enumerate(out) if not o.passing and o.schema.schema_id == s.schema_id]
            announced = p.lsn >= 0 or any(out[i].announced for i in had)
            out = [o for i, o in enumerate(out) if i not in had] + [SchemaStep(s, announced, False)]
        return out

    @property
    def begin(self) -> bool:
        return any(p.begin for p in self.parts)

    @property
    def end(self) -> bool:
        return any(p.end for p in self.parts)

    @property
    def truncate(self) -> bool:
        return any(p.truncate for p in self.parts)

    def counted(self) -> list[P]:
        """The parts whose rows count: after a truncate only the tasks that saw it -- the others hold
        snapshot rows, which come before every change (and so before the truncate)."""
        return [p for p in self.parts if p.truncate] if self.truncate else list(self.parts)

    def keyed(self) -> list[Any]:
        return [p.keyed for p in self.counted() if p.keyed is not None]


def tables_of(parts: Iterable[P], route: Route, option: str) -> list[TableEpoch[P]]:
    """The epoch's parts by source table (sorted by name); two tables routed to one target are refused
    before anything is written."""
    by_table: dict[str, TableEpoch[P]] = {}
    for p in parts:
        by_table.setdefault(p.table, TableEpoch(p.table, [])).parts.append(p)
    by_target: dict[str, list[str]] = {}
    for name in by_table:
        by_target.setdefault(route.target(name), []).append(name)
    for target, names in by_target.items():
        if len(names) > 1 and not all(route.merged(n) for n in names):  # shards of a merging rule share it
            raise routed_twice(sorted(names), target, option)
    return [by_table[t] for t in sorted(by_table)]


def routed_twice(tables: list[str], target: str, option: str) -> ConfigError:
    example = ".../{schema}/{table}" if option == "path" else "<namespace>.{schema}_{table}"
    return ConfigError(f"source tables {' and '.join(tables)} both route to {target}: put {{schema}} in the sink's "
                       f"{option!r} (e.g. {example}), or exclude one of them in the source's 'tables' option")
