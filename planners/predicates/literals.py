"""Filter literals, and comparing a column with a literal of another type exactly as SQL does.

SQL compares a column with a literal of another type in a common type: ``l_quantity < 24`` on
a ``decimal(15, 2)`` column compares 24 as a decimal, ``n < 2.5`` on an integer column compares
exactly (it means ``n <= 2``, never ``n < 2``), ``d < TIMESTAMP '2024-01-02 12:00:00'`` on a
date column compares the date's midnight with that instant. DuckDB and PostgreSQL agree on these.

Every translation (pyarrow, SQL with bound parameters, pyiceberg, partition pruning) is simplest
and safest when the literal already is a value of the column's type: then no engine, driver or
library has to pick a common type, and binding never depends on how a driver types a parameter
(pyiceberg, for one, truncates ``2.5`` to ``2`` for a long column and refuses ``24`` for a
``decimal(15, 2)``). So the parser rewrites each mixed-type comparison into an equivalent one
over values of the column type, using the nearest column values below and above the literal:

- ``n < 2.5`` -> ``n <= 2``; ``n >= 2.5`` -> ``n >= 3``;
- ``n = 2.5`` -> ``n >= 3 AND n <= 2``: FALSE for every non-null ``n`` and NULL for NULL, as in
  SQL, so ``NOT (n = 2.5)`` keeps every non-null row; ``n != 2.5`` -> ``n <= 2 OR n >= 3``;
- past the type's range, ``tinyint_col < 300`` -> ``tinyint_col <= 127`` (TRUE unless NULL).

Numeric literals mean their exact decimal value (PostgreSQL's ``numeric``; DuckDB reads ``2.5``
as an exact DECIMAL too). Float columns compare like DuckDB: a double column with the literal
rounded to the nearest double; a float32 column with an integer or decimal literal rounded to
float32 (DuckDB's common type is FLOAT), but with an exponent literal (``1e-1``, a DOUBLE) in
double precision. DuckDB also compares exponent literals with integer and decimal columns as
doubles; here they stay exact, which differs only beyond 2**53 or past 15 significant digits.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from planners.predicates.ast import And, Between, Cmp, Expr, In, Or

EXACT = "exact"  # an integer or decimal literal: 24, -2.5
APPROX = "approx"  # an exponent literal, a DOUBLE in SQL: 1e1, 2.5E-3
STRING = "string"  # 'text': cast to the column type, as SQL casts an untyped string
DATE = "date"  # DATE '2024-01-02'
TIMESTAMP = "timestamp"  # TIMESTAMP '2024-01-02 10:00:00[+hh:mm]'
BOOL = "bool"  # TRUE / FALSE

# Wide enough for any decimal256 digit count, so quantize never rounds by accident.
_DECIMAL_CONTEXT = decimal.Context(prec=200, Emax=999_999, Emin=-999_999)
_FLOAT_FORMATS = {16: ("<e", "<H"), 32: ("<f", "<I")}
_UNIT_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}
# timestamp[ns] holds 1677-09-21 .. 2262-04-11; these are its first and last whole microseconds.
_NS_RANGE = (
    dt.datetime(1677, 9, 21, 0, 12, 43, 145225),
    dt.datetime(2262, 4, 11, 23, 47, 16, 854775),
)


@dataclass(frozen=True)
class SqlLiteral:
    """A literal as written: ``kind`` and its value (Decimal for numbers, str, date, datetime
    with or without a UTC offset, bool)."""

    kind: str
    value: Any
    text: str


@dataclass(frozen=True)
class Nearest:
    """The column values nearest a literal: ``below`` is the largest <= it and ``above`` the
    smallest >= it (equal when the literal is a value of the column type); None past the type's
    range (then the other one is the type's minimum or maximum)."""

    below: Any
    above: Any

    @property
    def exact(self) -> bool:
        return self.below is not None and self.below == self.above


def compare(op: str, column: str, lit: SqlLiteral | None, ftype: pa.DataType) -> Expr:
    """``column <op> lit`` as a comparison (or two) with literals of the column type.

    Raises ValueError when the literal cannot be compared with the column type."""
    if lit is None:
        return Cmp(op, column, None)
    near = nearest(lit, ftype)
    if near.exact:
        return Cmp(op, column, near.below)
    at_most = (
        Cmp("<=", column, near.below) if near.below is not None else Cmp("<", column, near.above)
    )
    at_least = (
        Cmp(">=", column, near.above) if near.above is not None else Cmp(">", column, near.below)
    )
    if op in ("<", "<="):
        return at_most
    if op in (">", ">="):
        return at_least
    if op == "=":
        return And((at_least, at_most))
    return Or((at_most, at_least))


def in_list(column: str, lits: list[SqlLiteral | None], ftype: pa.DataType) -> Expr:
    """``column IN (lits)``: literals no column value can equal drop out of the list."""
    if any(lit is not None and lit.kind == APPROX for lit in lits):
        # SQL compares the whole list in one common type: one DOUBLE makes it DOUBLE.
        lits = [replace(lit, kind=APPROX) if lit and lit.kind == EXACT else lit for lit in lits]
    if any(lit is not None and lit.kind == TIMESTAMP for lit in lits):
        # Likewise one TIMESTAMP makes it TIMESTAMP: an untyped string in the list is read as a
        # timestamp, not cast to the column's DATE (which would drop its time of day).
        lits = [_as_timestamp(lit) if lit and lit.kind == STRING else lit for lit in lits]
    values: list[Any] = []
    never: SqlLiteral | None = None
    for lit in lits:
        if lit is None:
            values.append(None)
            continue
        near = nearest(lit, ftype)
        if near.exact:
            values.append(near.below)
        elif never is None:
            never = lit
    if values:
        return In(column, tuple(values))
    if never is None:
        raise ValueError("empty IN list")
    return compare("=", column, never, ftype)  # no value can match: FALSE, or NULL for NULL


def _as_timestamp(lit: SqlLiteral) -> SqlLiteral:
    try:
        return replace(lit, kind=TIMESTAMP, value=parse_datetime(str(lit.value)))
    except ValueError:
        return lit  # not a timestamp: compared as the string it is (and refused if it cannot)


def between(
    column: str, low: SqlLiteral | None, high: SqlLiteral | None, ftype: pa.DataType
) -> Expr:
    """``column BETWEEN low AND high`` = ``column >= low AND column <= high``, each bound typed
    on its own (as DuckDB does), except that a TIMESTAMP bound makes an untyped string bound a
    timestamp too, as in an IN list: DuckDB compares all three in one type, so
    ``d BETWEEN '2024-01-02 12:00:00' AND TIMESTAMP '…'`` keeps the string's time of day."""
    if any(lit is not None and lit.kind == TIMESTAMP for lit in (low, high)):
        low, high = (
            _as_timestamp(lit) if lit is not None and lit.kind == STRING else lit
            for lit in (low, high)
        )
    lo, hi = compare(">=", column, low, ftype), compare("<=", column, high, ftype)
    if isinstance(lo, Cmp) and lo.op == ">=" and isinstance(hi, Cmp) and hi.op == "<=":
        return Between(column, lo.value, hi.value)
    return And((lo, hi))


def nearest(lit: SqlLiteral, ftype: pa.DataType) -> Nearest:
    """The column values nearest ``lit``; ValueError when it cannot compare with ``ftype``."""
    t = ftype
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
    if numeric and lit.kind not in (EXACT, APPROX):
        raise ValueError("expected a number")
    if lit.kind in (EXACT, APPROX) and not numeric:
        raise ValueError(f"a number does not compare with {t}")
    if pa.types.is_integer(t):
        return _integer(lit.value, t)
    if pa.types.is_decimal(t):
        return _decimal(lit.value, t)
    if pa.types.is_floating(t):
        return _floating(lit, t)
    if pa.types.is_date(t):
        return _date(lit)
    if pa.types.is_timestamp(t):
        return _timestamp(lit, t)
    if lit.kind in (DATE, TIMESTAMP):
        raise ValueError(f"a {lit.kind} does not compare with {t}")
    value = coerce(lit.value, t, from_string=lit.kind == STRING)
    return Nearest(value, value)


def _integer(value: decimal.Decimal, t: pa.DataType) -> Nearest:
    bits = t.bit_width
    lo, hi = (
        (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if pa.types.is_signed_integer(t)
        else (0, 2**bits - 1)
    )
    if value < lo:
        return Nearest(None, lo)
    if value > hi:
        return Nearest(hi, None)
    floor = int(value.to_integral_value(decimal.ROUND_FLOOR, _DECIMAL_CONTEXT))
    ceil = int(value.to_integral_value(decimal.ROUND_CEILING, _DECIMAL_CONTEXT))
    return Nearest(floor, ceil)


def _decimal(value: decimal.Decimal, t: pa.DataType) -> Nearest:
    quantum = decimal.Decimal(1).scaleb(-t.scale)
    hi = (decimal.Decimal(10) ** t.precision - 1) * quantum
    if value < -hi:
        return Nearest(None, -hi)
    if value > hi:
        return Nearest(hi, None)
    # Quantized to the column's scale: pyiceberg refuses a decimal of any other scale.
    floor = value.quantize(quantum, decimal.ROUND_FLOOR, _DECIMAL_CONTEXT)
    ceil = value.quantize(quantum, decimal.ROUND_CEILING, _DECIMAL_CONTEXT)
    return Nearest(abs(floor) if floor == 0 else floor, abs(ceil) if ceil == 0 else ceil)


def _floating(lit: SqlLiteral, t: pa.DataType) -> Nearest:
    value = float(lit.value)  # correctly rounded; +-inf past the double range
    if t.bit_width == 64:
        return Nearest(value, value)
    if lit.kind == EXACT:
        narrow = _narrow(value, t.bit_width)  # compared in the column's own precision
        return Nearest(narrow, narrow)
    # A DOUBLE literal: compared in double precision, where the narrow values are exact.
    narrow = _narrow(value, t.bit_width)
    if narrow > value:
        return Nearest(_step(narrow, t.bit_width, up=False), narrow)
    if narrow < value:
        return Nearest(narrow, _step(narrow, t.bit_width, up=True))
    return Nearest(narrow, narrow)


def _narrow(value: float, bits: int) -> float:
    """``value`` rounded to the nearest float of ``bits`` bits."""
    fmt, _ = _FLOAT_FORMATS[bits]
    try:
        return float(struct.unpack(fmt, struct.pack(fmt, value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def _step(value: float, bits: int, *, up: bool) -> float:
    """The next float of ``bits`` bits after ``value`` (itself one) toward +inf or -inf."""
    fmt, int_fmt = _FLOAT_FORMATS[bits]
    if value == 0:
        tiny = float(struct.unpack(fmt, struct.pack(int_fmt, 1))[0])
        return tiny if up else -tiny
    pattern = struct.unpack(int_fmt, struct.pack(fmt, value))[0]
    pattern += 1 if (value > 0) == up else -1
    return float(struct.unpack(fmt, struct.pack(int_fmt, pattern))[0])


def _date(lit: SqlLiteral) -> Nearest:
    if lit.kind == DATE:
        return Nearest(lit.value, lit.value)
    if lit.kind == STRING:
        # An untyped string is cast to DATE, which drops a time of day (DuckDB, PostgreSQL).
        day = dt.date.fromisoformat(str(lit.value).strip()[:10])
        return Nearest(day, day)
    if lit.kind != TIMESTAMP:
        raise ValueError("expected a date")
    instant = _naive_utc(lit.value)
    day = instant.date()
    if instant == dt.datetime.combine(day, dt.time()):
        return Nearest(day, day)
    return Nearest(day, day + dt.timedelta(days=1))


def _timestamp(lit: SqlLiteral, t: pa.DataType) -> Nearest:
    if lit.kind == DATE:
        value = dt.datetime.combine(lit.value, dt.time())
    elif lit.kind == STRING:
        value = parse_datetime(str(lit.value))
    elif lit.kind == TIMESTAMP:
        value = lit.value
    else:
        raise ValueError("expected a timestamp")
    value = _naive_utc(value)
    if t.unit == "ns" and not _NS_RANGE[0] <= value <= _NS_RANGE[1]:
        raise ValueError("outside the range of timestamp[ns] (1677-09-21 .. 2262-04-11)")
    step = _UNIT_MICROS[t.unit]
    below = value - dt.timedelta(microseconds=value.microsecond % step)
    above = below if below == value else below + dt.timedelta(microseconds=step)
    if t.tz is not None:
        return Nearest(below.replace(tzinfo=dt.UTC), above.replace(tzinfo=dt.UTC))
    return Nearest(below, above)


def _naive_utc(value: dt.datetime) -> dt.datetime:
    """A naive datetime means UTC (the session time zone of SQL engines here)."""
    return value if value.tzinfo is None else value.astimezone(dt.UTC).replace(tzinfo=None)


def parse_datetime(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))


def coerce(raw: Any, ftype: pa.DataType, *, from_string: bool = True) -> Any:
    """Turn a literal (or a JSON partition value) into the Python value of type ``ftype``.

    Raises ValueError when it does not fit, so ``'abc'`` never compares with an int column.
    """
    if raw is None:
        return None
    t = ftype
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if not isinstance(raw, str) or not from_string:
            raise ValueError("expected a string literal")
        return raw
    if pa.types.is_boolean(t):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise ValueError("expected TRUE or FALSE")
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
    if isinstance(raw, str) and from_string and numeric:
        raise ValueError("expected a number, not a string")
    if pa.types.is_integer(t):
        if isinstance(raw, float) or (isinstance(raw, str) and not raw.lstrip("-").isdigit()):
            raise ValueError("expected an integer")
        value = int(raw)
        _scalar(value, t)  # range check
        return value
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        # The value as the column stores it: a float32 rounded to float32, a decimal at the
        # column's scale (Decimal('24.00'), never Decimal('24'), for decimal(15, 2)).
        try:
            number = float(raw) if pa.types.is_floating(t) else decimal.Decimal(str(raw))
        except (TypeError, decimal.InvalidOperation) as e:
            raise ValueError("expected a number") from e
        return _scalar(number, t).as_py()
    if pa.types.is_timestamp(t):
        if not isinstance(raw, str):
            raise ValueError("expected a timestamp string")
        instant = _naive_utc(parse_datetime(raw))
        return instant.replace(tzinfo=dt.UTC) if t.tz is not None else instant
    if pa.types.is_date(t):
        if not isinstance(raw, str):
            raise ValueError("expected a date string")
        return dt.date.fromisoformat(raw.strip()[:10])
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return raw.encode() if isinstance(raw, str) else bytes(raw)
    raise ValueError(f"filters on {t} columns are not supported")


def _scalar(value: Any, t: pa.DataType) -> pa.Scalar:
    try:
        return pa.scalar(value, t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise ValueError(f"does not fit {t}") from e
