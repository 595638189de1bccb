"""Which columns and rows of each source table its routed target gets, and the columns it computes: per table pattern.

A routing sink's option ``transforms`` (``flinkish.delta`` / ``flinkish.iceberg`` / ``flinkish.postgres``; ``flinkish
mirror``'s ``--sink-option`` and its pipeline file's Flink CDC ``transform`` block) is a JSON list of rules, **the
first rule whose ``tables`` patterns match a table is its transform** (a table no rule matches is mirrored as it is)::

    [{"tables": "public.users", "columns.exclude": ["password_hash"], "filter": "country = 'DE'",
      "computed": {"changed_at": "_commit_ts", "source": "_source_table"}}]

A rule has ``tables`` and any of ``columns`` (the only source columns the target gets, key included),
``columns.exclude`` (the ones it never gets), ``filter`` (a Spark SQL predicate on the source row), ``computed``
(``{"name": "expression"}`` or a list of ``"name = expression"``), ``projection`` (Flink CDC's: ``*, upper(name) AS
uname`` / ``* EXCEPT (password_hash)`` / ``id, name``) and ``description``. Anything else is refused.

The guarantees (each applied by :meth:`Transform.rows` to the typed rows of one table, in stream order):

* an excluded column (or one outside ``columns``) is in no row and no schema the target sees -- also after the source
  adds columns; a key column cannot be left out (:class:`~flinkish_spark.errors.ConfigError`);
* the filter selects rows of the snapshot and of the changes alike: a snapshot row not matching is skipped; an insert
  or update whose new row does not match becomes a delete of its key (a row that stops matching leaves the target; a
  delete of a key the target lacks changes nothing), one that matches is an upsert (a row that starts matching
  enters); a delete stays a delete. A re-snapshot delivers only matching rows, so its end removes the rest;
* a computed column holds its expression of the row and the change metadata (:data:`.parse.METADATA`), the same
  value in every replay of an epoch (expressions are deterministic: :mod:`.evaluate`);
* every text is compiled at start; a column a filter or expression names that the table lacks stops the query with
  one error naming the table, the rule and the fix, when the table's schema is first seen -- never a target written
  with a wrong value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.lakehouse.transform.names import METADATA, resolve
from flinkish_spark.connectors.postgres.rows import Column, TableSchema
from flinkish_spark.connectors.postgres.rows.schema import arrow_type
from flinkish_spark.errors import ChangeDataError, ConfigError

if TYPE_CHECKING:
    # The parser and evaluator (sqlglot) are imported where a rule is parsed: a sink without rules never needs them.
    from flinkish_spark.connectors.lakehouse.transform.evaluate import Value
    from flinkish_spark.connectors.lakehouse.transform.parse import Expression

#: The sink option this module reads.
TRANSFORM_OPTION = "transforms"
RULE_KEYS = ("tables", "columns", "columns.exclude", "filter", "computed", "projection", "description")
#: The columns of a table's rows that are not its data (the change's own).
_CHANGE = ("_op", "_lsn", "_seq", "_commit_ts", "_unchanged")
#: The ``_op`` values of a row (not a delete). A tuple, not a module-level ``pa.array``: building an Arrow array from a
#: list imports pandas (pyarrow's pandas shim), which every Python worker importing a routing sink would then pay for.
_ROW_OPS = ("r", "c", "u")

#: Arrow type of a computed column -> (Spark DDL type, PostgreSQL's spelling, its base type name, JSON encoding).
_COMPUTED_TYPES: list[tuple[Callable[[pa.DataType], bool], pa.DataType | None, str, str, str, str]] = [
    (pa.types.is_boolean, None, "boolean", "boolean", "bool", "bool"),
    (lambda t: t in (pa.int8(), pa.int16(), pa.uint8()), pa.int16(), "smallint", "smallint", "int2", "number"),
    (lambda t: t in (pa.int32(), pa.uint16()), pa.int32(), "int", "integer", "int4", "number"),
    (pa.types.is_integer, pa.int64(), "bigint", "bigint", "int8", "number"),
    (lambda t: t in (pa.float16(), pa.float32()), pa.float32(), "float", "real", "float4", "number"),
    (pa.types.is_floating, pa.float64(), "double", "double precision", "float8", "number"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), pa.string(), "string", "text", "text", "string"),
    (pa.types.is_date, pa.date32(), "date", "date", "date", "string"),
    (lambda t: pa.types.is_timestamp(t) and t.tz is not None, pa.timestamp("us", tz="UTC"), "timestamp",
     "timestamp with time zone", "timestamptz", "string"),
    (pa.types.is_timestamp, pa.timestamp("us"), "timestamp_ntz", "timestamp without time zone", "timestamp", "string"),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), pa.binary(), "binary", "bytea", "bytea", "base64"),
]


def computed_column(name: str, t: pa.DataType, where: str) -> Column:
    """The schema column of a computed column of Arrow type ``t``."""
    if pa.types.is_decimal(t) and t.precision <= 38:
        return Column(name, f"numeric({t.precision},{t.scale})", "numeric", "number", f"decimal({t.precision},{t.scale})")
    for test, _, spark, pg, base, encoding in _COMPUTED_TYPES:
        if test(t):
            return Column(name, pg, base, encoding, spark)  # type: ignore[arg-type]
    hint = " (CAST(NULL AS <type>) gives a null its type)" if t == pa.null() else ""
    raise ConfigError(f"{where}: computed column {name!r} has the type {t}, which a target cannot hold{hint}")


def _names(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {key!r} is a list of column names (or one comma-separated text), not {value!r}")
    return tuple(value)


def _computed(value: Any, where: str) -> tuple[tuple[str, Expression], ...]:
    from flinkish_spark.connectors.lakehouse.transform.parse import parse_expression
    pairs: list[tuple[str, str]] = []
    if isinstance(value, dict):
        pairs = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        pairs = [(n.strip().strip("`"), e.strip()) for n, _, e in (v.partition("=") for v in value)]
    else:
        raise ConfigError(f"{where}: 'computed' is {{\"name\": \"expression\"}} or a list of \"name = expression\", "
                          f"not {value!r}")
    return tuple((name, parse_expression(text, f"{where}: computed column {name!r}")) for name, text in pairs)


@dataclass(frozen=True)
class Transform:
    """One rule: what its tables' targets get."""

    tables: str  # the patterns as given
    patterns: TablePatterns
    columns: tuple[str, ...] | None = None  # None: every source column
    exclude: tuple[str, ...] = ()
    filter: Expression | None = None
    computed: tuple[tuple[str, Expression], ...] = ()

    @property
    def where(self) -> str:
        return f"transforms rule for {self.tables!r}"

    def _kept(self, names: list[str] | tuple[str, ...]) -> list[str]:
        excluded = {n for e in self.exclude if (n := resolve(e, names)) is not None}
        chosen = None if self.columns is None else {resolve(c, names) for c in self.columns}
        return [n for n in names if n not in excluded and (chosen is None or n in chosen)]

    def schema(self, source: TableSchema, newest: TableSchema | None = None) -> TableSchema:
        """The target's view of ``source``: the kept columns, then the computed ones. A column the rule names that
        the table lacks, or a key column left out, is an error -- unless ``source`` is an older schema of a task whose
        newest (transformed) is ``newest``: its rows are typed in the newest schema, whose computed columns it takes."""
        names = source.names
        if newest is None:
            self.check(source)
        kept = set(self._kept(names))
        columns = [c for c in source.columns if c.name in kept]
        if newest is not None:
            computed = {n for n, _ in self.computed}
            columns += [c for c in newest.columns if c.name in computed]
        else:
            columns += [computed_column(name, self._type(expr, source), f"source table {source.table}: {self.where}")
                        for name, expr in self.computed]
        return TableSchema(source.table, tuple(columns), source.key)

    def check(self, source: TableSchema) -> None:
        names, table = source.names, source.table
        fix = (f"Change the rule (the sink's option {TRANSFORM_OPTION!r}, the pipeline file's 'transform'), or "
               f"exclude the table in the source's 'tables' option (!{table})")
        missing = [c for c in (self.columns or ()) if resolve(c, names) is None]
        for what, expr in ([("filter", self.filter)] if self.filter else []) + [(f"computed column {n!r}", e)
                                                                                 for n, e in self.computed]:
            missing += [f"{c} (in the {what} {expr.text!r})" for c in expr.columns if resolve(c, names) is None]
        if missing:
            raise ConfigError(f"source table {table}: {self.where} names column(s) {', '.join(missing)} the table "
                              f"does not have (its columns: {', '.join(names)}). {fix}")
        kept = self._kept(names)
        dropped_keys = [k for k in source.key if k not in kept]
        if dropped_keys:
            raise ConfigError(f"source table {table}: {self.where} leaves out its key column(s) "
                              f"{', '.join(dropped_keys)}: the target is written by its key, which it must hold. {fix}")
        clash = [n for n, _ in self.computed if resolve(n, kept) is not None or n in _CHANGE]
        if clash:
            raise ConfigError(f"source table {table}: {self.where} computes column(s) {', '.join(clash)} the target "
                              f"has already; name them otherwise. {fix}")
        for what, expr in ([("filter", self.filter)] if self.filter else []) + [(f"computed column {n!r}", e)
                                                                                 for n, e in self.computed]:
            try:  # on no rows: an operand of a type the expression cannot take ('name % 2') is found now, not at a row
                self._type(expr, source)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise ConfigError(f"source table {table}: {self.where}: the {what} {expr.text!r} cannot be evaluated "
                                  f"over the table's column types ({e}). {fix}") from None

    def _type(self, expr: Expression, source: TableSchema) -> pa.DataType:
        empty = source.arrow_schema().empty_table()
        return _broadcast(expr.evaluate(_context(empty, source.table, expr)), 0).type

    def rows(self, source: TableSchema, rows: pa.Table) -> pa.Table:
        """A table's rows (its data columns and the change's, in stream order) as its target gets them. A value an
        expression cannot compute (a cast of ``'abc'`` to int, an overflow) stops the query naming the table and the
        rule (:class:`~flinkish_spark.errors.ChangeDataError`), nothing of the epoch written."""
        try:
            return self._rows(source, rows)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise ChangeDataError(f"source table {source.table}: {self.where} cannot compute a row's value: {e}. "
                                  "Change the rule (a CAST of a value that does not fit, an overflow?)") from None

    def _rows(self, source: TableSchema, rows: pa.Table) -> pa.Table:
        n = rows.num_rows
        names = [c for c in rows.column_names if c not in _CHANGE]
        ops = rows.column("_op")
        is_row = pc.is_in(ops, value_set=pa.array(_ROW_OPS, pa.string()))
        self._check_unchanged(rows, source.table)
        leave = None
        if self.filter is not None:
            match = pc.fill_null(_broadcast(self.filter.evaluate(_context(rows, source.table, self.filter)), n)
                                 .cast(pa.bool_()), False)
            leave = pc.and_(pc.is_in(ops, value_set=pa.array(["c", "u"])), pc.invert(match))
        fields: list[pa.Field] = []
        arrays: list[Any] = []
        for name, expr in self.computed:
            t = arrow_type(computed_column(name, self._type(expr, source), self.where).spark_type)
            value = _broadcast(expr.evaluate(_context(rows, source.table, expr)), n).cast(t)
            keep = is_row if leave is None else pc.and_(is_row, pc.invert(leave))
            fields.append(pa.field(name, t))
            arrays.append(pc.if_else(keep, value, pa.scalar(None, t)))  # deletes, truncates: null
        kept = self._kept(names)
        data = []
        for name in kept:
            col = rows.column(name)
            if leave is not None and name not in source.key:
                col = pc.if_else(leave, pa.scalar(None, col.type), col)  # a delete carries its key only
            data.append(col)
        fields = [rows.schema.field(n) for n in kept] + fields
        arrays = data + arrays
        for name in (c for c in rows.column_names if c in _CHANGE):
            col = rows.column(name)
            if name == "_op" and leave is not None:
                col = pc.if_else(leave, pa.scalar("d"), col)
            elif name == "_unchanged":
                col = self._unchanged(col, kept, leave)
            fields.append(rows.schema.field(name))
            arrays.append(col)
        result = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        if self.filter is not None:  # a snapshot row not matching is not delivered
            skip = pc.and_(pc.equal(ops, "r"), pc.invert(match))
            if pc.any(skip).as_py():
                result = result.filter(pc.invert(skip))
        return result

    def _reads(self) -> set[str]:
        return {c for e in ([self.filter] if self.filter else []) + [e for _, e in self.computed] for c in e.columns}

    def _check_unchanged(self, rows: pa.Table, table: str) -> None:
        """An update that did not carry a column (PostgreSQL's unchanged TOAST value) cannot be filtered or computed
        on by that column: its value is not in the change."""
        if "_unchanged" not in rows.column_names or rows.column("_unchanged").null_count == rows.num_rows:
            return
        reads = {r.lower() for r in self._reads()}
        for listed in rows.column("_unchanged").to_pylist():
            hit = [c for c in listed or () if c.lower() in reads]
            if hit:
                raise ConfigError(
                    f"source table {table}: an update did not carry the value of column(s) {', '.join(hit)} (a large "
                    f"value PostgreSQL sends only when it changes), which {self.where} reads. Set ALTER TABLE {table} "
                    "REPLICA IDENTITY FULL (every update then carries every column), or do not read those columns")

    @staticmethod
    def _unchanged(col: Any, kept: list[str], leave: Any) -> Any:
        if col.null_count == len(col):
            return col
        keep = set(kept)
        values = [None if v is None else [c for c in v if c in keep] for v in col.to_pylist()]
        arr = pa.array(values, col.type)
        return arr if leave is None else pc.if_else(leave, pa.scalar(None, col.type), arr)


def _context(rows: pa.Table, table: str, expr: Expression) -> pa.Table:
    """``rows`` with the change metadata ``expr`` names as columns."""
    n = rows.num_rows
    schema, _, name = table.partition(".")
    meta = {"_source_table": table, "__schema_name__": schema, "__table_name__": name}
    out = rows
    for m in expr.metadata:
        if m in out.column_names:
            continue
        if m in meta:
            out = out.append_column(m, pa.repeat(pa.scalar(meta[m]), n) if n else pa.array([], pa.string()))
        else:
            t = {"_op": pa.string(), "_commit_ts": pa.timestamp("us", tz="UTC"), "_lsn": pa.int64()}[m]
            out = out.append_column(m, pa.nulls(n, t))
    return out


def _broadcast(v: Value, n: int) -> pa.Array | pa.ChunkedArray:
    if isinstance(v, pa.Scalar):
        return pa.repeat(v, n) if n else pa.array([], v.type)
    return v


@dataclass(frozen=True)
class Transforms:
    """The rules, first match wins."""

    rules: tuple[Transform, ...] = ()

    def of(self, table: str) -> Transform | None:
        for rule in self.rules:
            if rule.patterns.matches(table):
                return rule
        return None

    def __bool__(self) -> bool:
        return bool(self.rules)


def _rule(d: Any, i: int, component: str) -> Transform:
    from flinkish_spark.connectors.lakehouse.transform.parse import parse_expression, parse_projection

    where = f"{component}: {TRANSFORM_OPTION} rule {i}"
    if not isinstance(d, dict):
        raise ConfigError(f"{where} is {d!r}, not an object")
    unknown = sorted(set(d) - set(RULE_KEYS))
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; a rule has "
                          f"{', '.join(map(repr, RULE_KEYS))}")
    tables = d.get("tables")
    if not isinstance(tables, str) or not tables.strip():
        raise ConfigError(f"{where} has no 'tables' (the table patterns it applies to, e.g. 'public.users, sales.*')")
    where = f"{where} ({tables!r})"
    patterns = TablePatterns.parse(tables, where)
    columns = _names(d["columns"], "columns", where) if "columns" in d else None
    exclude = _names(d["columns.exclude"], "columns.exclude", where) if "columns.exclude" in d else ()
    computed = _computed(d["computed"], where) if "computed" in d else ()
    if "projection" in d:
        if columns is not None or exclude or computed:
            raise ConfigError(f"{where}: give 'projection' or 'columns' / 'columns.exclude' / 'computed', not both")
        p = parse_projection(d["projection"], f"{where}: projection")
        columns, exclude, computed = p.columns, p.exclude, p.computed
    if columns is not None and exclude:
        raise ConfigError(f"{where}: give 'columns' (the ones to keep) or 'columns.exclude' (the ones to leave out), "
                          "not both")
    names = [n for n, _ in computed]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: a computed column is named twice ({', '.join(names)})")
    meta = [n for n in names if n in METADATA]
    if meta:
        raise ConfigError(f"{where}: computed column(s) {', '.join(meta)} have the name of change metadata; "
                          "name them otherwise")
    filt = parse_expression(d["filter"], f"{where}: filter") if d.get("filter") is not None else None
    return Transform(tables, patterns, columns, exclude, filt, computed)


def parse_transforms(get: Callable[[str], str | None], component: str) -> Transforms:
    """The sink's ``transforms`` option (``get`` returns None for an option not given)."""
    raw = get(TRANSFORM_OPTION)
    if raw is None or not raw.strip():
        return Transforms()
    hint = ('transforms is a JSON list of rules, e.g. [{"tables": "public.users", "columns.exclude": '
            '["password_hash"], "filter": "active"}]')
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{component}: option {TRANSFORM_OPTION!r} is not JSON ({e.msg} at character {e.pos}); "
                          f"{hint}") from None
    if not isinstance(parsed, list):
        raise ConfigError(f"{component}: option {TRANSFORM_OPTION!r} is a JSON {type(parsed).__name__}; {hint}")
    return Transforms(tuple(_rule(r, i, component) for i, r in enumerate(parsed, start=1)))


def transforms_option(rules: list[dict[str, Any]]) -> str:
    return json.dumps(rules, separators=(",", ":"))


def sink_transforms(get: Callable[[str], str | None], routed: bool, component: str, option: str) -> Transforms:
    """A routing sink's transforms; the option is refused on a sink of one target (its query chooses its columns and
    rows itself: ``select``, ``where``)."""
    if not routed:
        if get(TRANSFORM_OPTION):
            raise ConfigError(f"{component}: option {TRANSFORM_OPTION!r} transforms the tables of a routing sink "
                              f"('{{table}}' in {option!r}); a sink of one target writes what its query selects "
                              "(select, where, withColumn). Drop the option.")
        return Transforms()
    return parse_transforms(get, component)
