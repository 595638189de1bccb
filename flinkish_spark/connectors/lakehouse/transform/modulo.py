"""Spark SQL's remainder on Arrow values: ``a % b`` / ``mod(a, b)``, ``pmod(a, b)`` and ``try_mod(a, b)``.

The guarantee: the value and the type Spark 4.x gives (compared with Spark itself in
``tests/connectors/lakehouse/test_transform_spark.py``):

* the sign of the dividend, as Java's ``%`` (``-7 % 3 = -1``, ``7 % -3 = 1``); ``pmod`` is ``(r + b) % b`` when
  ``r < 0`` (``pmod(-7, 3) = 2``; the sign of the divisor when both are negative, as Spark: ``pmod(-7, -3) = -1``);
* integers keep an integer type: the wider of the two (an integer literal is an ``int`` when it fits, as Spark's, so
  ``id % 2`` of an ``int`` column is an ``int``, of a ``bigint`` one a ``bigint``); ``int_min % -1`` is 0;
* a decimal's type is Spark's ``decimal(min(p1-s1, p2-s2) + max(s1, s2), max(s1, s2))`` (an integer column as
  ``decimal(10,0)`` -- ``decimal(5,0)``, ``decimal(20,0)`` for ``smallint``, ``bigint`` --, an integer literal as the
  decimal of its digits); a ``float`` or ``double`` side makes a ``double`` (``float % float`` a ``float``) with
  IEEE ``fmod`` (exact, as Java's);
* NULL in, NULL out;
* a zero divisor of a row whose operands are both not null is an error, as Spark's default ANSI mode
  (``REMAINDER_BY_ZERO``): :class:`pyarrow.ArrowInvalid`, which the rules turn into the error naming the table and
  the rule. ``try_mod`` gives NULL there instead (``pmod`` has no ``try_`` form in Spark). A guarded remainder
  (``b <> 0 AND a % b = 0``, ``CASE WHEN b = 0 THEN ... ELSE a % b END``, ``if(...)``) never divides by zero: the
  evaluator evaluates a guarded operand only on the rows its guard lets through, as Spark does row by row.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from typing import Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Value = Union[pa.Array, pa.ChunkedArray, pa.Scalar]

#: The decimal an integer column becomes beside a decimal (Spark's ``DecimalType.forType``).
_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}
ZERO_DIVISOR = ("remainder by zero (Spark's REMAINDER_BY_ZERO in its default ANSI mode): guard the divisor "
                "(b <> 0 AND a % b = 0) or write try_mod(a, b), NULL for a zero divisor")


def _array(v: Value, n: int) -> pa.Array:
    if isinstance(v, pa.Scalar):
        return pa.repeat(v, n) if v.type != pa.null() else pa.nulls(n)
    return v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v


def _narrow_literal(v: Value, literal: bool) -> Value:
    """An integer literal as Spark types it: an ``int`` when it fits, else a ``bigint``."""
    if literal and isinstance(v, pa.Scalar) and pa.types.is_integer(v.type) and v.is_valid \
            and -2 ** 31 <= v.as_py() < 2 ** 31:
        return pa.scalar(v.as_py(), pa.int32())
    return v


def _decimal_of(v: Value, literal: bool) -> Value:
    """An integer beside a decimal as Spark's decimal of it: a literal's own digits (``3`` is ``decimal(1,0)``; taken
    from the literal, not the rows, so an empty batch types it alike), a column's type's (``int``: ``decimal(10,0)``)."""
    if pa.types.is_decimal(v.type) or not pa.types.is_integer(v.type):
        return v
    if isinstance(v, pa.Scalar):
        x = v.as_py()
        digits = len(str(abs(x))) if literal and x is not None else _INT_DIGITS[v.type.bit_width]
        return pa.scalar(None if x is None else Decimal(x), pa.decimal128(digits, 0))
    # by value: Arrow's integer-to-decimal cast wants room for any integer of the type
    values = v.to_pylist()
    return pa.array([None if x is None else Decimal(x) for x in values], pa.decimal128(_INT_DIGITS[v.type.bit_width], 0))


def _zero(t: pa.DataType) -> pa.Scalar:
    return pa.scalar(Decimal(0) if pa.types.is_decimal(t) else 0, t)


def _zero_rows(a: pa.Array, b: pa.Array) -> pa.Array:
    """The rows Spark divides by zero: both operands set, the divisor zero (a NULL dividend is NULL, no error)."""
    return pc.fill_null(pc.and_(pc.equal(b, _zero(b.type)), pc.is_valid(a)), False)


def _integers(a: pa.Array, b: pa.Array) -> pa.Array:
    t = a.type if a.type.bit_width >= b.type.bit_width else b.type
    a, b = pc.cast(a, t), pc.cast(b, t)
    # -1 as 1 (the same remainder): int_min / -1 overflows; 0 as 1: its rows are NULL or the error
    safe = pc.if_else(pc.fill_null(pc.or_(pc.equal(b, -1), pc.equal(b, 0)), False), pa.scalar(1, t), b)
    return pc.subtract(a, pc.multiply(pc.divide(a, safe), safe))  # Arrow's integer divide truncates, as Java's


def _floats(a: pa.Array, b: pa.Array) -> pa.Array:
    t = pa.float32() if a.type == b.type == pa.float32() else pa.float64()
    x = pc.cast(a, pa.float64()).to_numpy(zero_copy_only=False)
    y = pc.cast(b, pa.float64()).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.fmod(x, y)  # C's fmod: exact, the sign of the dividend, as Java's % of doubles
    nulls = pc.or_(pc.is_null(a), pc.is_null(b))
    return pc.cast(pa.array(r, pa.float64(), mask=nulls.to_numpy(zero_copy_only=False)), t)


def _decimals(a: pa.Array, b: pa.Array) -> pa.Array:
    (p1, s1), (p2, s2) = (a.type.precision, a.type.scale), (b.type.precision, b.type.scale)
    s = max(s1, s2)
    t = pa.decimal128(min(p1 - s1, p2 - s2) + s, s)
    quantum = Decimal(1).scaleb(-s)
    out = []
    with localcontext() as ctx:
        ctx.prec = 80  # exact for any decimal128
        for x, y in zip(a.to_pylist(), b.to_pylist()):
            out.append(None if x is None or y is None or y == 0 else (x % y).quantize(quantum))
    return pa.array(out, t)


def remainder(a: Value, b: Value, a_literal: bool = False, b_literal: bool = False, *, positive: bool = False,
              zero_is_null: bool = False) -> Value:
    """``a % b`` (``pmod`` when ``positive``; ``try_mod`` when ``zero_is_null``) with Spark's value and type."""
    scalar = isinstance(a, pa.Scalar) and isinstance(b, pa.Scalar)
    n = 1 if scalar else len(a if not isinstance(a, pa.Scalar) else b)
    a, b = _narrow_literal(a, a_literal), _narrow_literal(b, b_literal)
    if any(pa.types.is_decimal(v.type) for v in (a, b)) and not any(pa.types.is_floating(v.type) for v in (a, b)):
        a, b = _decimal_of(a, a_literal), _decimal_of(b, b_literal)
    x, y = _array(a, n), _array(b, n)
    if x.type == pa.null():
        x = pa.nulls(n, y.type if y.type != pa.null() else pa.int32())
    if y.type == pa.null():
        y = pa.nulls(n, x.type)
    if not all(pa.types.is_integer(v.type) or pa.types.is_floating(v.type) or pa.types.is_decimal(v.type)
               for v in (x, y)):
        raise pa.ArrowTypeError(f"% takes numbers, not {x.type} and {y.type}")
    zero = _zero_rows(x, y)
    if not zero_is_null and pc.any(zero).as_py():
        raise pa.ArrowInvalid(ZERO_DIVISOR)
    if pa.types.is_floating(x.type) or pa.types.is_floating(y.type):
        calc = _floats
    elif pa.types.is_decimal(x.type) or pa.types.is_decimal(y.type):
        calc = _decimals
    else:
        calc = _integers
    r = calc(x, y)
    if positive:
        negative = pc.fill_null(pc.less(r, _zero(r.type)), False)
        if pc.any(negative).as_py():  # Spark's pmod: (r + b) % b; a decimal sum widens, the remainder narrows again
            shifted = pc.add(r, y if calc is _decimals else pc.cast(y, r.type))
            r = pc.if_else(negative, pc.cast(calc(shifted, y), r.type), r)
    if zero_is_null:
        r = pc.if_else(zero, pa.scalar(None, r.type), r)
    return r[0] if scalar else r

