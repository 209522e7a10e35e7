"""One validation vocabulary for every problem type.

Each helper checks one field and either returns the cleaned value or raises
:class:`~core.errors.ProblemError` with a one-line message naming the field,
the value given and what is allowed. Problems call these from
``__post_init__`` so a bad problem can never be constructed.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from decimal import Decimal

import numpy as np

from core.errors import ProblemError


def _show(value: object) -> str:
    """A short, single-line rendering of a user value for error messages (never raises)."""
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) > 10**60:
        # Python refuses to print integers of more than 4300 digits; the size is what matters
        return f"<integer of about {int(int(value).bit_length() * 0.30103) + 1} digits>"
    try:
        text = repr(value)
    except Exception:  # a huge Fraction, an object whose repr is broken
        return f"<{type(value).__name__} that cannot be printed>"
    return text if len(text) <= 60 else text[:57] + "..."


def fail(field: str, value: object, allowed: str) -> ProblemError:
    """Build the standard error: ``field=value is invalid: allowed``."""
    return ProblemError(f"{field}={_show(value)} is invalid: {allowed}")


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name: str, default: bool = False) -> bool:
    """A yes/no environment variable: unset or empty gives ``default``; a value in neither list is an error."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _ON or value in _OFF:
        return value in _ON
    raise fail(name, os.environ[name], f"must be one of {', '.join(_ON + _OFF)}, or unset")


def env_seconds(name: str) -> float | None:
    """A duration environment variable: unset or empty gives None; else a finite number of seconds > 0."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise fail(name, os.environ[name], "must be a finite number of seconds > 0, or unset")
    return seconds


# Every count (sizes, iterations, indices) is looped over or indexed in int64 by NumPy, Numba and
# torch: beyond this it wraps around deep inside a kernel, so it is the largest count any field takes.
INT64_MAX = int(np.iinfo(np.int64).max)
# The largest and the smallest normal float64: derived quantities (a grid spacing, its square,
# a time step's inverse) must stay between them to keep full precision and stay finite.
FLOAT_MAX = float(np.finfo(np.float64).max)
FLOAT_TINY = float(np.finfo(np.float64).tiny)


def _is_bool(value: object) -> bool:
    return isinstance(value, (bool, np.bool_))


def _exact_integer(value: object) -> int | None:
    """``value`` as an exact int when it is a whole number of any numeric type (1e6, Fraction(8, 2)), else None."""
    if _is_bool(value):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Rational):  # exact even beyond float range: Fraction(10**400, 1)
        return int(value.numerator) if value.denominator == 1 else None
    if isinstance(value, Decimal):
        return int(value) if value.is_finite() and value == value.to_integral_value() else None
    if isinstance(value, numbers.Real):
        number = float(value)
        return int(number) if math.isfinite(number) and number.is_integer() else None
    return None


def check_int(field: str, value: object, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """A whole number (bools refused; 1e6 and Fraction(8, 2) accepted) within ``[minimum, maximum]``.

    ``maximum`` defaults to :data:`INT64_MAX`, the largest count the kernels can loop over;
    it is named in the message only when it is what the value broke.
    """
    limit = INT64_MAX if maximum is None else maximum
    number = _exact_integer(value)
    too_big = number is not None and number > limit
    shown_maximum = limit if (maximum is not None or too_big) else None
    if number is None or too_big or (minimum is not None and number < minimum):
        raise fail(field, value, f"must be an integer{_bounds_text(minimum, shown_maximum)}")
    return number


def _as_float(value: object) -> float | None:
    """``value`` as a float: None for non-numbers and bools; +-inf where it overflows float64."""
    if _is_bool(value) or not isinstance(value, (numbers.Real, Decimal)):
        return None
    if isinstance(value, Decimal) and value.is_nan():  # float() refuses a signalling NaN
        return math.nan
    try:
        return float(value)
    except OverflowError:  # 10**400, Fraction(10**400, 3): beyond float64, like inf
        return math.inf if value > 0 else -math.inf


def check_float(field: str, value: object, *, minimum: float | None = None,
                maximum: float | None = None, strict_minimum: bool = False) -> float:
    """A finite real number within the bounds (``strict_minimum`` excludes the minimum).

    Integers, Fractions and Decimals are accepted as their nearest float64;
    ones too large for float64 are refused here, with this field's name.
    """
    bounds = _bounds_text(minimum, maximum, strict_minimum)
    number = _as_float(value)
    if number is None or not math.isfinite(number):
        raise fail(field, value, f"must be a finite number{bounds}")
    too_small = minimum is not None and (number <= minimum if strict_minimum else number < minimum)
    if too_small or (maximum is not None and number > maximum):
        raise fail(field, value, f"must be a finite number{bounds}")
    return number


def check_derived(field: str, value: object, derived: float, what: str, *, low: float = 0.0,
                  high: float = FLOAT_MAX) -> None:
    """Refuse ``value`` of ``field`` when a quantity computed from it leaves ``[low, high]`` or is not finite.

    For bounds that come from the numerics (a spacing whose square must stay
    normal, a product that must not overflow) rather than from the field
    alone; ``what`` names the quantity and says why it is bounded.
    """
    if not (math.isfinite(derived) and low <= abs(derived) <= high):
        raise fail(field, value, f"{what} is {derived:.3g}, must be between {low:.3g} and {high:.3g}")


def check_choice(field: str, value: object, choices: Sequence[str]) -> str:
    """One of a fixed set of names."""
    if not isinstance(value, str) or value not in choices:
        raise fail(field, value, "must be one of " + ", ".join(repr(c) for c in choices))
    return value


# dtype kinds a numeric array may have: signed and unsigned integers, floats. Booleans, complex
# numbers (the imaginary part would be dropped), dates, durations, strings and objects are refused
# rather than cast without a word.
_REFUSED_KINDS = {"b": "bool", "c": "complex", "M": "datetime", "m": "timedelta", "O": "object",
                  "U": "string", "S": "bytes", "V": "structured"}


def check_array(field: str, value: object, *, ndim: int | None = None,
                shape: tuple[int | None, ...] | None = None, nonnegative: bool = False,
                dtype: type = np.float64) -> np.ndarray:
    """A finite array of real numbers, copied, cast to ``dtype`` and made read-only.

    The copy makes the problem truly immutable: the caller mutating the array
    they passed in cannot change a problem that was already validated.
    """
    kinds = "iu" if np.issubdtype(dtype, np.integer) else "iuf"
    allowed = f"must be an array of real numbers ({'integer' if kinds == 'iu' else 'integer or float'} dtype)"
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError, OverflowError):  # ragged nested lists, unconvertible objects
        raise fail(field, value, f"{allowed}, with the same length in every row") from None
    if raw.dtype.kind not in kinds:
        kind = _REFUSED_KINDS.get(raw.dtype.kind, str(raw.dtype))
        hint = " (mixed types, None, or integers beyond 64 bits)" if raw.dtype.kind == "O" else ""
        raise fail(field, value, f"{allowed}, got {kind} dtype {raw.dtype}{hint}")
    array = raw.astype(dtype, copy=True)
    if ndim is not None and array.ndim != ndim:
        raise fail(field, value, f"must have {ndim} dimension(s), got {array.ndim}")
    if shape is not None:
        expected = tuple("any" if s is None else s for s in shape)
        if array.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, array.shape)):
            raise fail(field, value, f"must have shape {expected}, got {array.shape}")
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        # float64 values of a longdouble or a huge uint64 array overflow to inf here: also refused
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise fail(field, value, f"must be finite, found {bad} NaN or inf value(s)")
    if nonnegative and np.any(array < 0):
        raise fail(field, value, f"must be non-negative, minimum is {float(array.min())!r}")
    array.setflags(write=False)
    return array


SEED_MAX = 2**64 - 1  # torch's generators take a 64-bit seed; NumPy's SeedSequence takes any


def check_seed(field: str, value: object) -> int | None:
    """A seed for :class:`numpy.random.SeedSequence` and torch: ``None`` or an integer in [0, 2**64 - 1]."""
    if value is None:
        return None
    return check_int(field, value, minimum=0, maximum=SEED_MAX)


def _bounds_text(minimum: float | None, maximum: float | None, strict_minimum: bool = False) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if strict_minimum else '>='} {_number_text(minimum)}")
    if maximum is not None:
        parts.append(f"<= {_number_text(maximum)}")
    return (" " + " and ".join(parts)) if parts else ""


def _number_text(bound: float) -> str:
    """Integers exactly (a seed's 2**64 - 1 must not read as 1.84467e+19), floats in short form."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"
