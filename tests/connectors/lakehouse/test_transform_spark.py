"""The transform evaluator against Spark itself: the same expressions, the same rows, through Spark SQL (the shared
session, one query for the values, one per error) and through :mod:`flinkish_spark.connectors.lakehouse.transform`.
Every value and every result type must be Spark's, every error Spark raises must be one here."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.transform.parse import parse_expression

SPARK_SCHEMA = "i int, l bigint, h smallint, d decimal(10,2), x double, f float, z int, m int"
ARROW = pa.schema([("i", pa.int32()), ("l", pa.int64()), ("h", pa.int16()), ("d", pa.decimal128(10, 2)),
                   ("x", pa.float64()), ("f", pa.float32()), ("z", pa.int32()), ("m", pa.int32())])
ROWS = [  # z: a divisor, 0 on two rows; m: null where z is 0 (a NULL dividend is NULL, no error)
    (7, 7, 7, Decimal("7.25"), 7.5, 7.5, 3, 1),
    (-7, -7, -7, Decimal("-7.25"), -7.5, -7.5, 0, None),
    (None, 2 ** 63 - 1, None, None, None, None, 0, None),
    (-2 ** 31, -2 ** 63, 1, Decimal("-0.01"), -0.0, 2.0, -1, 4),
    (5, -5, -3, Decimal("1.05"), 1e17, 3.0, -3, 5),
]
#: Each evaluates on every row without an error in Spark 4 (ANSI mode).
EXPRESSIONS = [
    # the sign of the dividend; pmod's the divisor's; integer types kept (an int literal is an int)
    "i % 3", "i % -3", "mod(i, 3)", "pmod(i, 3)", "pmod(i, -3)", "l % 3", "l % i", "i % l", "h % 2", "h % h",
    "pmod(l, i)", "i % -1", "l % -1", "pmod(i, -1)", "i % 2 = 0", "-7 % 3", "7 % -3", "pmod(-7, 3)", "pmod(7, -3)",
    "pmod(-7, -3)", "i % 3000000000",
    # decimals: Spark's precision and scale; decimal literals
    "d % 3", "d % 300", "pmod(d, -30)", "d % i", "d % l", "d % h", "pmod(d, 3)", "d % 2.5", "i % 2.5", "d % 0.3", "7.5 % 2", "-7.5 % 2",
    "pmod(-7.25, 3)", "i % d", "x % d", "d % f", "d % 1.5D",
    # floating point: fmod, a float kept only beside a float
    "x % 2", "pmod(x, 2)", "f % 2", "f % f", "x % f", "f % i", "x % 1.5D", "pmod(f, -2)",
    # NULL in, NULL out; a NULL dividend with a zero divisor is NULL
    "CAST(NULL AS INT) % 3", "3 % CAST(NULL AS INT)", "i % CAST(NULL AS INT)", "pmod(CAST(NULL AS INT), 3)", "m % z",
    # guarded: Spark never evaluates the remainder where the guard says no
    "z <> 0 AND i % z = 0", "z = 0 OR l % z = 1", "CASE WHEN z = 0 THEN NULL ELSE h % z END",
    "if(z <> 0, pmod(l, z), -1)", "try_mod(i, z)", "try_mod(d, z)", "try_mod(x, z)",
]
#: Each divides by zero on a row: Spark's REMAINDER_BY_ZERO, the evaluator's error.
ERRORS = ["i % z", "pmod(x, z)", "d % 0"]


def _spark_type(t: pa.DataType) -> str:
    names = {pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint", pa.float32(): "float",
             pa.float64(): "double", pa.bool_(): "boolean"}
    return f"decimal({t.precision},{t.scale})" if pa.types.is_decimal(t) else names.get(t, str(t))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def test_the_remainder_evaluates_as_spark_sql(spark: Any) -> None:
    df = spark.createDataFrame(ROWS, SPARK_SCHEMA)
    result = df.selectExpr(*[f"{e} AS c{k}" for k, e in enumerate(EXPRESSIONS)])
    rows = result.collect()  # one query for every expression
    expected = [[row[k] for row in rows] for k in range(len(EXPRESSIONS))]
    types = [f.dataType.simpleString() for f in result.schema.fields]
    table = pa.Table.from_pylist([dict(zip(ARROW.names, r)) for r in ROWS], ARROW)
    for text, want, want_type in zip(EXPRESSIONS, expected, types):
        v = parse_expression(text, "test").evaluate(table)
        got = [v.as_py()] * len(ROWS) if isinstance(v, pa.Scalar) else v.to_pylist()
        assert (_spark_type(v.type), len(got)) == (want_type, len(want)), text
        assert all(_same(g, w) for g, w in zip(got, want)), (text, got, want)
        # the type a target's schema gets (computed on no rows) is the same
        assert _spark_type(parse_expression(text, "test").evaluate(table.slice(0, 0)).type) == want_type, text
    for text in ERRORS:
        with pytest.raises(Exception, match="REMAINDER_BY_ZERO"):
            df.selectExpr(text).collect()
        with pytest.raises(pa.ArrowInvalid, match="remainder by zero"):
            parse_expression(text, "test").evaluate(table)
