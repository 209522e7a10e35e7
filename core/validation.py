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

import numpy as np

from core.errors import ProblemError


def _show(value: object) -> str:
    """A short, single-line rendering of a user value for error messages."""
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    text = repr(value)
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


def check_int(field: str, value: object, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """An integer (bools refused) within ``[minimum, maximum]``."""
    bounds = _bounds_text(minimum, maximum)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
                and float(value).is_integer()):
            value = int(value)  # 1e6 typed in a config is meant as an integer
        else:
            raise fail(field, value, f"must be an integer{bounds}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise fail(field, value, f"must be an integer{bounds}")
    return value


def check_float(field: str, value: object, *, minimum: float | None = None,
                maximum: float | None = None, strict_minimum: bool = False) -> float:
    """A finite real number within the bounds (``strict_minimum`` excludes the minimum)."""
    bounds = _bounds_text(minimum, maximum, strict_minimum)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(field, value, f"must be a finite number{bounds}")
    value = float(value)
    if not math.isfinite(value):
        raise fail(field, value, f"must be a finite number{bounds}")
    too_small = minimum is not None and (value <= minimum if strict_minimum else value < minimum)
    if too_small or (maximum is not None and value > maximum):
        raise fail(field, value, f"must be a finite number{bounds}")
    return value


def check_choice(field: str, value: object, choices: Sequence[str]) -> str:
    """One of a fixed set of names."""
    if not isinstance(value, str) or value not in choices:
        raise fail(field, value, "must be one of " + ", ".join(repr(c) for c in choices))
    return value


def check_array(field: str, value: object, *, ndim: int | None = None,
                shape: tuple[int | None, ...] | None = None, nonnegative: bool = False,
                dtype: type = np.float64) -> np.ndarray:
    """A finite numeric array, copied, cast to ``dtype`` and made read-only.

    The copy makes the problem truly immutable: the caller mutating the array
    they passed in cannot change a problem that was already validated.
    """
    try:
        array = np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError):
        raise fail(field, value, f"must be an array of {np.dtype(dtype).name} numbers") from None
    if ndim is not None and array.ndim != ndim:
        raise fail(field, value, f"must have {ndim} dimension(s), got {array.ndim}")
    if shape is not None:
        expected = tuple("any" if s is None else s for s in shape)
        if array.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, array.shape)):
            raise fail(field, value, f"must have shape {expected}, got {array.shape}")
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise fail(field, value, f"must be finite, found {bad} NaN or inf value(s)")
    if nonnegative and np.any(array < 0):
        raise fail(field, value, f"must be non-negative, minimum is {float(array.min())!r}")
    array.setflags(write=False)
    return array


def check_seed(field: str, value: object) -> int | None:
    """A seed for :class:`numpy.random.SeedSequence`: ``None`` or an integer >= 0."""
    if value is None:
        return None
    return check_int(field, value, minimum=0)


def _bounds_text(minimum: float | None, maximum: float | None, strict_minimum: bool = False) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if strict_minimum else '>='} {minimum:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    return (" " + " and ".join(parts)) if parts else ""
