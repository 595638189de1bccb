"""A transform's SQL text (Spark dialect, parsed by ``sqlglot``): a predicate, a computed column, a projection.

The guarantee: every text is parsed and compiled when the sink starts (:func:`parse_expression`,
:func:`parse_projection`), so a syntax error or a construct :mod:`.evaluate` does not support is a
:class:`~flinkish_spark.errors.ConfigError` naming the text and where it was given -- never an error mid-stream,
never a value computed some other way than Spark would. What an expression reads is known from its text:
:attr:`Expression.columns` (the row's columns) and :attr:`Expression.metadata` (the change's metadata:
:data:`.names.METADATA`), so a column the table lacks is found as soon as the table's schema is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from flinkish_spark.connectors.lakehouse.transform.evaluate import Evaluator, compile_expression
from flinkish_spark.connectors.lakehouse.transform.names import METADATA
from flinkish_spark.errors import ConfigError


@dataclass(frozen=True)
class Expression:
    """One parsed, compiled expression."""

    text: str
    columns: tuple[str, ...]  # the row columns it names (as written)
    metadata: tuple[str, ...]  # the METADATA names it uses
    where: str = field(compare=False, repr=False)
    evaluate: Evaluator = field(compare=False, repr=False)

    def __reduce__(self) -> tuple[object, ...]:
        # The evaluator is closures: a sink pickled into its tasks compiles the text again there.
        return parse_expression, (self.text, self.where)


def _parse(text: str, where: str) -> exp.Expression:
    try:
        parsed = sqlglot.parse_one(text, read="spark")
    except ParseError as e:
        first = e.errors[0]["description"] if e.errors else str(e)
        raise ConfigError(f"{where}: {text!r} is not a Spark SQL expression ({first})") from None
    if parsed is None:
        raise ConfigError(f"{where}: the expression is empty")
    return parsed  # type: ignore[return-value]  # sqlglot 30: Expr is the base of every expression


def _expression(node: exp.Expression, text: str, where: str) -> Expression:
    if isinstance(node, (exp.Select, exp.Subquery, exp.Exists)):
        raise ConfigError(f"{where}: {text!r}: a query is not an expression of the row")
    if any(isinstance(n, exp.AggFunc) or isinstance(n, exp.Window) for n in node.walk()):
        raise ConfigError(f"{where}: {text!r}: an aggregate or window function is not an expression of one row")
    evaluator = compile_expression(node, f"{where}: {text!r}")
    names = [c.name for c in node.find_all(exp.Column)]
    meta = tuple(dict.fromkeys(n for n in names if n in METADATA))
    return Expression(text, tuple(dict.fromkeys(n for n in names if n not in METADATA)), meta, where, evaluator)


def parse_expression(text: str, where: str) -> Expression:
    """A predicate or a computed column's expression."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: the expression is empty")
    return _expression(_parse(text, where), text, where)


@dataclass(frozen=True)
class Projection:
    """A Flink CDC ``projection``: ``*`` (every column) or a column list, ``* EXCEPT (a, b)``, and ``expr AS name``."""

    columns: tuple[str, ...] | None  # None: every column (``*``)
    exclude: tuple[str, ...]
    computed: tuple[tuple[str, Expression], ...]


def parse_projection(text: str, where: str) -> Projection:
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: the projection is empty")
    try:
        select = sqlglot.parse_one(f"SELECT {text}", read="databricks")  # Databricks' dialect: * EXCEPT (...)
    except ParseError as e:
        first = e.errors[0]["description"] if e.errors else str(e)
        raise ConfigError(f"{where}: {text!r} is not a projection ({first})") from None
    if not isinstance(select, exp.Select) or select.args.get("from_") or select.args.get("from") or select.args.get("where"):
        raise ConfigError(f"{where}: {text!r} is not a projection (a list of columns and 'expression AS name')")
    star, columns, exclude, computed = False, [], [], []
    for item in select.expressions:
        if isinstance(item, exp.Star):
            star = True
            exclude += [e.name for e in item.args.get("except_") or item.args.get("except") or []]
        elif isinstance(item, exp.Column) and not item.table:
            columns.append(item.name)
        elif isinstance(item, exp.Alias):
            computed.append((item.alias, _expression(item.this, item.this.sql("spark"), where)))
        else:
            raise ConfigError(f"{where}: {item.sql('spark')!r} in the projection needs a name: "
                              f"{item.sql('spark')} AS <name>")
    if star and columns:
        columns = []  # '*, id' names id twice: the star holds it
    return Projection(None if star else tuple(columns), tuple(exclude), tuple(computed))
