"""Spark SQL expressions (parsed by ``sqlglot``) evaluated column-wise on Arrow tables by ``pyarrow.compute``.

The guarantee: an expression is *compiled* once, when the sink starts (:func:`compile_expression`), and every
construct it cannot evaluate exactly is refused there, by name -- never a wrong value in a target. What compiles is
deterministic (no ``current_timestamp()``, ``rand()``, ``uuid()``: a replayed epoch must compute the same values)
and follows Spark SQL's meaning for the documented subset:

* column references (case-insensitive, as Spark), literals (numbers, strings, ``TRUE``/``FALSE``, ``NULL``);
* ``+ - * /`` (``/`` of two integers is a ``double``, as Spark), unary ``-``, ``abs``, ``round``; overflow is an error;
* ``%`` / ``mod``, ``pmod``, ``try_mod`` (:mod:`.modulo`: Spark's signs and types; a zero divisor is an error, as
  Spark's ANSI mode, except in ``try_mod``);
* ``= <> != < <= > >=``, ``AND`` / ``OR`` / ``NOT`` (three-valued), ``IS [NOT] NULL``, ``IN (...)``,
  ``[NOT] LIKE`` / ``ILIKE`` (a literal pattern), ``BETWEEN``;
* ``CASE WHEN ... THEN ... ELSE ... END``, ``if(c, a, b)``, ``coalesce``;
* ``CAST(x AS t)`` for ``smallint int bigint float double decimal(p,s) string boolean date timestamp timestamp_ntz``;
* ``||`` / ``concat`` (null if any part is null, as Spark), ``upper``, ``lower``, ``trim``, ``length``,
  ``substring(s, pos[, len])`` (literal positions, 1-based);
* ``to_date``, ``year``, ``month``, ``day`` / ``dayofmonth``, ``date_format(ts, 'pattern')``.

``AND`` / ``OR`` and the branches of ``CASE`` / ``if`` evaluate an operand only on the rows that reach it (Spark's
short circuit), so a guard guards: ``b <> 0 AND a % b = 0`` never divides by zero.

A literal compared with a column of another type is cast to the column's type first (``ts >= '2026-01-01'``,
``amount > 10`` on a decimal), as Spark's implicit casts do.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Union

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from flinkish_spark.connectors.lakehouse.transform.modulo import remainder
from flinkish_spark.connectors.lakehouse.transform.names import resolve
from flinkish_spark.errors import ConfigError

Value = Union[pa.Array, pa.ChunkedArray, pa.Scalar]
#: A compiled expression: the rows (a table holding every column it names, by the names :func:`resolve` gives) to values.
Evaluator = Callable[[pa.Table], Value]

_NON_DETERMINISTIC = (exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Rand, exp.Uuid)
#: Functions sqlglot leaves unparsed (``exp.Anonymous``) whose value is not one of the row.
_VOLATILE = {"now", "random", "randn", "uuid", "localtimestamp", "current_timezone", "monotonically_increasing_id",
             "spark_partition_id", "input_file_name", "shuffle"}
_COMPARE: dict[type, str] = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal",
                             exp.LT: "less", exp.LTE: "less_equal"}
_ARITH: dict[type, str] = {exp.Add: "add_checked", exp.Sub: "subtract_checked", exp.Mul: "multiply_checked"}
_DATE_PARTS: dict[type, str] = {exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day"}


def arrow_type_of(dt: exp.DataType, where: str) -> pa.DataType:
    """The Arrow type of a ``CAST`` target (Spark's names)."""
    T = exp.DataType.Type
    simple = {T.SMALLINT: pa.int16(), T.INT: pa.int32(), T.BIGINT: pa.int64(), T.FLOAT: pa.float32(),
              T.DOUBLE: pa.float64(), T.TEXT: pa.string(), T.VARCHAR: pa.string(), T.CHAR: pa.string(),
              T.BOOLEAN: pa.bool_(), T.DATE: pa.date32(), T.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
              T.TIMESTAMP: pa.timestamp("us"), T.TIMESTAMPNTZ: pa.timestamp("us"), T.TINYINT: pa.int16()}
    if dt.this in simple:
        return simple[dt.this]
    if dt.this == T.DECIMAL:
        params = [int(p.name) for p in dt.expressions]
        p, s = (params + [10, 0])[:2] if len(params) != 1 else (params[0], 0)
        return pa.decimal128(p, s)
    raise ConfigError(f"{where}: CAST to {dt.sql('spark')} is not supported (smallint, int, bigint, float, double, "
                      "decimal(p,s), string, boolean, date, timestamp, timestamp_ntz are)")


def column_name(node: exp.Column) -> str:
    return node.name


def _literal(node: exp.Expression) -> Any:
    if isinstance(node, exp.Neg):
        return -_literal(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        return float(text) if any(c in text for c in ".eE") else int(text)
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Null):
        return None
    raise ValueError(node.sql("spark"))


def _exact(node: exp.Expression) -> Evaluator | None:
    """A literal with a point and no exponent as Spark types it, a decimal of its digits (``7.5``: ``decimal(2,1)``);
    None for anything else."""
    inner = node.this if isinstance(node, exp.Neg) else node
    if not (isinstance(inner, exp.Literal) and not inner.is_string and "." in inner.this
            and not any(c in inner.this for c in "eE")):
        return None
    value = Decimal(inner.this) * (-1 if inner is not node else 1)
    scale = max(0, -int(value.as_tuple().exponent))
    digits = len(value.as_tuple().digits)
    scalar = pa.scalar(value, pa.decimal128(max(digits, scale, 1), scale))
    return lambda t: scalar


def _is_literal(node: exp.Expression) -> bool:
    try:
        _literal(node)
        return True
    except ValueError:
        return False


def _type(v: Value) -> pa.DataType:
    return v.type


def _cast_to(v: Value, t: pa.DataType) -> Value:
    if v.type == t:
        return v
    if isinstance(v, pa.Scalar):
        return _scalar_as(v, t)
    return pc.cast(v, t)


def _scalar_as(v: pa.Scalar, t: pa.DataType) -> pa.Scalar:
    """A literal as type ``t``: a number as a decimal exactly (Arrow's int-to-decimal cast wants room for any int),
    a text as a zoned timestamp in UTC when it names no zone (Spark's session time zone is UTC in flinkish)."""
    if not v.is_valid:
        return pa.scalar(None, t)
    if pa.types.is_decimal(t) and (pa.types.is_integer(v.type) or pa.types.is_floating(v.type)):
        return pa.scalar(Decimal(str(v.as_py())), t)
    if pa.types.is_timestamp(t) and t.tz is not None and pa.types.is_string(v.type):
        try:
            return pc.cast(v, t)
        except pa.ArrowInvalid:
            return pc.cast(pc.cast(v, pa.timestamp(t.unit)), t)
    return pc.cast(v, t)


def _aligned(a: Value, b: Value, a_lit: bool, b_lit: bool) -> tuple[Value, Value]:
    """A literal brought to the other side's type (Spark's implicit cast of a literal)."""
    if a.type == b.type:
        return a, b
    if b_lit and not a_lit:
        return a, _cast_to(b, a.type)
    if a_lit and not b_lit:
        return _cast_to(a, b.type), b
    return a, b


def _decimal_literal(a: Value, b: Value) -> tuple[Value, Value]:
    """An integer literal beside a decimal as the decimal of its own digits (Spark: ``2`` is ``decimal(1,0)``)."""
    def as_decimal(v: Value) -> Value:
        if isinstance(v, pa.Scalar) and v.is_valid and pa.types.is_integer(v.type):
            return pa.scalar(Decimal(v.as_py()), pa.decimal128(max(1, len(str(abs(v.as_py())))), 0))
        return v
    if pa.types.is_decimal(a.type):
        return a, as_decimal(b)
    if pa.types.is_decimal(b.type):
        return as_decimal(a), b
    return a, b


def _as_string(v: Value) -> Value:
    return v if pa.types.is_string(v.type) or pa.types.is_large_string(v.type) else pc.cast(v, pa.string())


def _true(v: Value) -> Value:
    """A predicate's value as a selection: null is not true."""
    return pc.fill_null(_cast_to(v, pa.bool_()), False)


#: What may fail on a row's value (a zero divisor, an overflow, a cast of 'abc' to int): evaluated lazily when guarded.
_MAY_FAIL = (exp.Mod, exp.Div, exp.Add, exp.Sub, exp.Mul, exp.Abs, exp.Cast, exp.TryCast, exp.TsOrDsToDate,
             exp.Anonymous)
Guarded = Callable[[pa.Table, Value], Value]


def _guarded(node: exp.Expression, evaluate: Evaluator) -> Guarded:
    """``evaluate`` (of ``node``) for the ``rows`` a guard lets through (null on the others, which it never sees): a
    guarded operand (``b <> 0 AND a % b = 0``, a CASE branch) is evaluated only where Spark, row by row, evaluates
    it. The values are a function of each row, so they are computed on every row first (no copy of the rows) and on
    the rows let through only when that fails (a value the guard excludes may fail); an operand that cannot fail
    (no arithmetic, cast, function) always on every row."""
    may_fail = any(isinstance(n, _MAY_FAIL) or (isinstance(n, exp.Neg) and not _is_literal(n)) for n in node.walk())
    if not may_fail:
        return lambda t, rows: evaluate(t)
    names = tuple(dict.fromkeys(column_name(c) for c in node.find_all(exp.Column)))

    def on_rows(t: pa.Table, rows: Value) -> Value:
        try:
            return evaluate(t)
        except pa.ArrowInvalid:
            if isinstance(rows, pa.Scalar):
                if rows.as_py() is not False:
                    raise
                return pa.scalar(None)
        rows = pc.fill_null(rows, False)
        if isinstance(rows, pa.ChunkedArray):
            rows = rows.combine_chunks()
        if t.num_rows == 0 or pc.all(rows).as_py():
            return evaluate(t)  # raises again: a row it reads fails
        if not pc.any(rows).as_py():
            return pa.scalar(None)  # no row reaches it: not even a literal's error (1 % 0) is Spark's
        read = list(dict.fromkeys(r for r in (resolve(n, t.column_names) for n in names) if r is not None))
        value = evaluate((t.select(read) if read else t).filter(rows))  # only the columns it reads are copied
        if isinstance(value, pa.Scalar):
            return value  # a literal: the same on every row
        if isinstance(value, pa.ChunkedArray):
            value = value.combine_chunks()
        if value.type == pa.null():
            return pa.nulls(t.num_rows)
        return pc.replace_with_mask(pa.nulls(t.num_rows, value.type), rows, value)
    return on_rows


#: Spark's datetime pattern letters this module formats (the rest of a pattern must be literal text).
_PATTERN = {"yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}


def _strftime(node: exp.TimeToStr, where: str) -> str:
    """``date_format``'s pattern (Spark's letters, from the text as Spark spells it) as ``strftime``'s."""
    import re

    shown = node.sql("spark")
    found = re.search(r",\s*'((?:[^']|'')*)'\)$", shown)
    if not found:
        raise ConfigError(f"{where}: {shown!r}: date_format takes a literal pattern")
    out = []
    for piece in re.finditer(r"([A-Za-z])\1*|[^A-Za-z]+", found.group(1)):
        text = piece.group(0)
        if text[0].isalpha():
            if text not in _PATTERN:
                raise ConfigError(f"{where}: {shown!r}: the pattern letters {text!r} are not supported "
                                  f"({', '.join(_PATTERN)} are)")
            out.append(_PATTERN[text])
        else:
            out.append(text.replace("%", "%%"))
    return "".join(out)


def compile_expression(node: exp.Expression, where: str) -> Evaluator:
    """``node`` as an evaluator, or the :class:`ConfigError` naming the construct it cannot evaluate."""
    def c(n: exp.Expression) -> Evaluator:
        return compile_expression(n, where)

    if isinstance(node, exp.Paren):
        return c(node.this)
    if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
        value = pa.scalar(_literal(node))
        return lambda t: value
    if isinstance(node, exp.Column):
        if node.table:
            raise ConfigError(f"{where}: {node.sql('spark')!r}: name a column without a table or alias")
        name = column_name(node)
        return lambda t: t.column(resolve(name, t.column_names) or name)
    if isinstance(node, tuple(_COMPARE)):
        fn, left, right = _COMPARE[type(node)], c(node.this), c(node.expression)
        ll, rl = _is_literal(node.this), _is_literal(node.expression)
        return lambda t: pc.call_function(fn, list(_aligned(left(t), right(t), ll, rl)))
    if isinstance(node, tuple(_ARITH)):
        fn, left, right = _ARITH[type(node)], c(node.this), c(node.expression)
        return lambda t: pc.call_function(fn, list(_decimal_literal(left(t), right(t))))
    if isinstance(node, exp.Div):
        left, right = c(node.this), c(node.expression)

        def divide(t: pa.Table) -> Value:
            a, b = left(t), right(t)
            if pa.types.is_integer(a.type) and pa.types.is_integer(b.type):
                a, b = pc.cast(a, pa.float64()), pc.cast(b, pa.float64())  # Spark: int / int is a double
            return pc.divide_checked(a, b)
        return divide
    if isinstance(node, exp.Mod) or (isinstance(node, exp.Anonymous) and node.name.lower() in ("pmod", "try_mod")):
        args = [node.this, node.expression] if isinstance(node, exp.Mod) else list(node.expressions)
        if len(args) != 2:
            raise ConfigError(f"{where}: {node.sql('spark')!r}: {node.name} takes two arguments")
        left, right = _exact(args[0]) or c(args[0]), _exact(args[1]) or c(args[1])
        lits = (_is_literal(args[0]), _is_literal(args[1]))
        kind = node.name.lower() if isinstance(node, exp.Anonymous) else "mod"
        return lambda t: remainder(left(t), right(t), *lits, positive=kind == "pmod", zero_is_null=kind == "try_mod")
    if isinstance(node, exp.Neg):
        inner = c(node.this)
        return lambda t: pc.negate_checked(inner(t))
    if isinstance(node, exp.Abs):
        inner = c(node.this)
        return lambda t: pc.abs_checked(inner(t))
    if isinstance(node, exp.Round):
        inner = c(node.this)
        digits = _literal(node.args["decimals"]) if node.args.get("decimals") is not None else 0
        return lambda t: pc.round(inner(t), ndigits=int(digits), round_mode="half_up")
    if isinstance(node, (exp.And, exp.Or)):
        lhs, rhs, conj = c(node.this), _guarded(node.expression, c(node.expression)), isinstance(node, exp.And)

        def logic(t: pa.Table) -> Value:
            a = _cast_to(lhs(t), pa.bool_())
            # the right side only where the left does not decide (Spark's short circuit: a guard guards)
            b = _cast_to(rhs(t, pc.fill_null(a if conj else pc.invert(a), True)), pa.bool_())
            return pc.and_kleene(a, b) if conj else pc.or_kleene(a, b)
        return logic
    if isinstance(node, exp.Not):
        inner = c(node.this)
        return lambda t: pc.invert(_cast_to(inner(t), pa.bool_()))
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise ConfigError(f"{where}: {node.sql('spark')!r}: only IS [NOT] NULL is supported")
        inner = c(node.this)
        return lambda t: pc.is_null(inner(t))
    if isinstance(node, exp.In):
        if node.args.get("query") is not None or not all(_is_literal(e) for e in node.expressions):
            raise ConfigError(f"{where}: {node.sql('spark')!r}: IN takes a list of literals")
        inner, values = c(node.this), [_literal(e) for e in node.expressions]

        def is_in(t: pa.Table) -> Value:
            v = inner(t)
            found = pc.is_in(v, value_set=pa.array(values).cast(v.type))
            return pc.if_else(pc.is_null(v), pa.scalar(None, pa.bool_()), found)  # NULL IN (...) is null
        return is_in
    if isinstance(node, (exp.Like, exp.ILike)):
        if not (isinstance(node.expression, exp.Literal) and node.expression.is_string) or node.args.get("escape"):
            raise ConfigError(f"{where}: {node.sql('spark')!r}: LIKE takes a literal pattern (without ESCAPE)")
        inner, pattern, fold = c(node.this), node.expression.this, isinstance(node, exp.ILike)
        return lambda t: pc.match_like(_as_string(inner(t)), pattern, ignore_case=fold)
    if isinstance(node, exp.Between):
        inner, low, high = c(node.this), c(node.args["low"]), c(node.args["high"])
        ll, hl = _is_literal(node.args["low"]), _is_literal(node.args["high"])

        def between(t: pa.Table) -> Value:
            v = inner(t)
            a, lo = _aligned(v, low(t), False, ll)
            b, hi = _aligned(v, high(t), False, hl)
            return pc.and_kleene(pc.greater_equal(a, lo), pc.less_equal(b, hi))
        return between
    if isinstance(node, (exp.Case, exp.If)):
        if isinstance(node, exp.Case):
            if node.this is not None:
                raise ConfigError(f"{where}: {node.sql('spark')!r}: write CASE WHEN <condition> THEN ... (not CASE <value> WHEN)")
            branches = [(i.this, i.args["true"]) for i in node.args.get("ifs") or []]
            default = node.args.get("default")
        else:
            branches = [(node.this, node.args["true"])]
            default = node.args.get("false")
        arms = [(_guarded(i, c(i)), _guarded(v, c(v))) for i, v in branches]
        otherwise: Guarded = _guarded(default, c(default)) if default is not None else lambda t, rows: pa.scalar(None)

        def case(t: pa.Table) -> Value:
            # each condition and value only on the rows that reach it, as Spark: a guarded branch is not evaluated
            left: Value = pa.scalar(True)
            chosen, values = [], []
            for cond, v in arms:
                picked = pc.and_(left, _true(cond(t, left)))
                chosen.append(picked)
                values.append(v(t, picked))
                left = pc.and_(left, pc.invert(picked))
            values.append(otherwise(t, left))
            typed = next((v.type for v in values if v.type != pa.null()), pa.null())
            out = _cast_to(values[-1], typed)
            for picked, v in reversed(list(zip(chosen, values))):
                out = pc.if_else(picked, _cast_to(v, typed), out)
            return out
        return case
    if isinstance(node, exp.Coalesce):
        parts = [c(node.this)] + [c(e) for e in node.expressions]

        def coalesce(t: pa.Table) -> Value:
            values = [p(t) for p in parts]
            typed = next((v.type for v in values if v.type != pa.null()), pa.null())
            return pc.coalesce(*[_cast_to(v, typed) for v in values])
        return coalesce
    if isinstance(node, (exp.Cast, exp.TryCast)):
        inner, to = c(node.this), arrow_type_of(node.args["to"], where)
        return lambda t: pc.cast(inner(t), to)
    if isinstance(node, (exp.DPipe, exp.Concat)):
        parts = [c(node.this), c(node.expression)] if isinstance(node, exp.DPipe) else [c(e) for e in node.expressions]
        return lambda t: pc.binary_join_element_wise(*[_as_string(p(t)) for p in parts], "")
    if isinstance(node, (exp.Upper, exp.Lower, exp.Trim, exp.Length)):
        if isinstance(node, exp.Trim) and (node.expression is not None or node.args.get("position")):
            raise ConfigError(f"{where}: {node.sql('spark')!r}: only trim(s) (whitespace) is supported")
        fn = {exp.Upper: "utf8_upper", exp.Lower: "utf8_lower", exp.Trim: "utf8_trim_whitespace",
              exp.Length: "utf8_length"}[type(node)]
        inner = c(node.this)
        return lambda t: pc.call_function(fn, [_as_string(inner(t))])
    if isinstance(node, exp.Substring):
        start, length = node.args.get("start"), node.args.get("length")
        if start is None or not _is_literal(start) or (length is not None and not _is_literal(length)):
            raise ConfigError(f"{where}: {node.sql('spark')!r}: substring takes literal positions")
        inner, first = c(node.this), int(_literal(start))
        begin = first - 1 if first > 0 else first  # Spark: 1-based; 0 is 1; a negative counts from the end
        begin = max(begin, 0) if first >= 0 else begin
        stop = None if length is None else begin + int(_literal(length))
        if stop is not None and first < 0 and stop >= 0:
            stop = None
        return lambda t: pc.utf8_slice_codeunits(_as_string(inner(t)), start=begin, stop=stop)
    if isinstance(node, exp.TsOrDsToDate):
        if node.args.get("format") is not None:
            raise ConfigError(f"{where}: {node.sql('spark')!r}: to_date with a format is not supported")
        inner = c(node.this)

        def to_date(t: pa.Table) -> Value:
            v = inner(t)
            if pa.types.is_string(v.type):
                v = pc.cast(v, pa.timestamp("us"))
            return _cast_to(v, pa.date32())
        return to_date
    if isinstance(node, tuple(_DATE_PARTS)):
        fn, inner = _DATE_PARTS[type(node)], c(node.this)
        return lambda t: pc.cast(pc.call_function(fn, [inner(t)]), pa.int32())
    if isinstance(node, exp.TimeToStr):
        pattern = _strftime(node, where)
        inner = c(node.this.this if isinstance(node.this, exp.TimeStrToTime) else node.this)
        return lambda t: pc.strftime(inner(t), format=pattern)
    if isinstance(node, _NON_DETERMINISTIC) or (isinstance(node, exp.Anonymous) and node.name.lower() in _VOLATILE):
        raise ConfigError(f"{where}: {node.sql('spark')!r} is not deterministic: a replayed epoch would write other "
                          "values (use _commit_ts, the change's commit time)")
    shown = node.sql("spark")
    kind = node.name if isinstance(node, exp.Anonymous) else type(node).__name__
    raise ConfigError(f"{where}: {shown!r}: {kind} is not supported in a transform (docs/mirror.md, "
                      "\"Columns and rows chosen\", lists what is)")
