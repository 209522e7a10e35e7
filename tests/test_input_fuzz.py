"""Random malformed values at every field of every registered solver's problem type.

The solvers and their fields come from the registry at collection time, so a
solver added later (by a plugin of this repository or a third party) is
covered without touching this file. For one field at a time, hypothesis draws
a malformed value: wrong types (text, numeric strings, bytes, None, bools,
complex numbers, dicts), floats that are huge, tiny, negative, zero, NaN or
inf, integers beyond 64 bits, Fractions and Decimals, NumPy arrays of every
refused dtype and of wrong shapes, nested and ragged lists, and the field's
own default pushed to extremes (scaled by 1e300 or 1e-300, negated, NaN
inserted into its array). Construction must then either

- raise the library's :class:`~core.errors.ProblemError` whose message
  names the field that was given, not one derived from it: it starts with
  ``field=``, or names the field as a word (a rule between two fields, "heads
  must divide H", names both), or
- give a problem whose ``features`` are finite numbers >= 0, whose
  ``memory`` is finite and >= 0 for every implementation key (parallel
  backends included), and, when the problem is small (below), whose solve on
  the numpy reference and on numba runs without an exception, with every
  output that holds NaN or inf flagged in ``diagnostics["non_finite_outputs"]``
  and by a :class:`~core.result.NonFiniteResultWarning`.

The small-problem rule: every field starts at the solver's smallest
calibration problem (its quick size space's low ends, over its
``default_params`` or default problem), so a solve takes milliseconds. A
malformed value that makes the problem big is only checked for finite
features and memory: big means the numpy memory estimate exceeds 200 MB, or
a feature exceeds 50 times the base problem's plus 10,000 (the margin lets a
zero feature such as a reflecting grid's cyclic steps become non-zero).

The profile is fixed (``derandomize=True``, no example database), so every
run draws the same cases: ``MAX_EXAMPLES`` per (solver, field). Each case
must finish within ``CASE_SECONDS`` (every small case here takes well under a
second): a construction that does a big problem's work before its checks
(synthesising data, allocating arrays) fails the test instead of hanging it.
Failures are reported as drawn, not shrunk, since shrinking would repeat a
slow case many times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import re
import signal
import warnings
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import core
from core.errors import ProblemError
from core.registry import get_registry, get_solver
from core.result import NonFiniteResultWarning
from core.running import implementations, probe

MAX_EXAMPLES = 25
BIG_BYTES = 200e6
BIG_FEATURE_FACTOR, BIG_FEATURE_MARGIN = 50.0, 10_000.0
SOLVE_BACKENDS = ("numpy", "numba")

CASE_SECONDS = 20

FUZZ = settings(derandomize=True, database=None, max_examples=MAX_EXAMPLES, deadline=None,
                phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


@contextlib.contextmanager
def time_limit(seconds: int, what: str):
    """Raise TimeoutError in this (the main) thread if the block runs longer than ``seconds``."""
    def stop(signum, frame):
        raise TimeoutError(f"{what} took more than {seconds} s: work done before the checks that should refuse it")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    except TimeoutError as error:
        # raised afresh, without the interrupted frames: pytest cannot render a frame stopped inside C code
        raise AssertionError(str(error)) from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _cases() -> list[tuple[str, str]]:
    """(solver, field) for every init field of every registered solver's problem type."""
    cases = []
    for name, spec in sorted(get_registry().solvers.items()):
        cases += [(name, f.name) for f in dataclasses.fields(spec.problem_type) if f.init]
    return cases


def small_params(spec) -> dict[str, Any]:
    """The keyword arguments of the solver's smallest calibration problem (see the module docstring)."""
    if spec.space is not None:
        low = {name: bounds[0] for name, bounds in spec.space(True).ranges.items()}
        if spec.default_params is not None:
            return {**spec.default_params(), **low}
        base = dataclasses.replace(spec.default_problem(), **low)
    else:
        base = spec.ladder(True)[0]
    return {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}


# -- the malformed values ----------------------------------------------------------

EXTREME_FLOATS = [0.0, -0.0, -1.0, 1e308, -1e308, 1.7976931348623157e308, 5e-324, 1e-300, 1e-263, 2.2e-308,
                  4.7e16, 1e30, 1e154, 1e-154, math.nan, math.inf, -math.inf]
EXTREME_INTS = [0, -1, -(2**63), 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, 10**69, 10**400]
REFUSED_DTYPES = [np.bool_, np.complex128, "datetime64[s]", "timedelta64[s]", np.object_, "<U3", "S3"]
ACCEPTED_DTYPES = [np.float64, np.float32, np.int64, np.uint64, np.int8]

scalars = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(EXTREME_FLOATS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(EXTREME_INTS),
    st.fractions(max_denominator=10**6),
    st.sampled_from([Fraction(10**400, 3), Fraction(-(10**400), 7), Fraction(1, 10**400), Fraction(8, 2)]),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.sampled_from([Decimal("1e400"), Decimal("-1e-400"), Decimal("sNaN"), Decimal("12")]),
    st.booleans(),
    st.none(),
    st.complex_numbers(max_magnitude=1e10),
    st.text(max_size=8),
    st.sampled_from(["1", "1e400", "nan", "inf", "-3", "0x10", "", " ", "none", "True"]),
    st.binary(max_size=4),
    st.just({"a": 1}),
)


def _element_pool(dtype: np.dtype) -> list:
    if dtype.kind in "fc":
        return [0.0, 1.0, -1.0, 0.5, 1e308, -1e308, 5e-324, math.nan, math.inf]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return [0, 1, 2, int(info.max), int(info.min)]
    if dtype.kind == "b":
        return [True, False]
    if dtype.kind in "Mm":
        return [0, 1, 86_400]
    if dtype.kind in "US":
        return ["1", "0.5", "x", "nan"]
    return [None, 1, 10**400, "x", Fraction(1, 3), 0.5]


@st.composite
def numpy_arrays(draw):
    """Arrays of every refused and accepted dtype, of shapes near and far from the fields' own."""
    dtype = np.dtype(draw(st.sampled_from(REFUSED_DTYPES + ACCEPTED_DTYPES)))
    shape = draw(st.sampled_from([(), (0,), (1,), (3,), (2, 2), (21,), (51,), (6, 21), (11, 21)]))
    size = int(np.prod(shape))
    values = draw(st.lists(st.sampled_from(_element_pool(dtype)), min_size=size, max_size=size))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = np.empty(size, dtype=dtype)
        for i, v in enumerate(values):
            array[i] = v
    return array.reshape(shape)


nested_lists = st.recursive(st.one_of(st.integers(-(10**400), 10**400), st.floats(), st.none(), st.text(max_size=2)),
                            lambda children: st.lists(children, max_size=4), max_leaves=12)


@st.composite
def near_default(draw, default: Any):
    """The field's own default pushed to extremes: the right type, the wrong size."""
    if isinstance(default, bool) or default is None or isinstance(default, str):
        return draw(st.sampled_from([None, "", "nonsense", 0, 1.5, True]))
    if isinstance(default, numbers.Integral):
        return draw(st.sampled_from([-default, 0, default * 10**6, default * 10**30, default + 0.5, float(default)]))
    if isinstance(default, numbers.Real):
        scale = draw(st.sampled_from([1e300, 1e-300, -1.0, 0.0, 1e154, 1e-154, math.nan, math.inf]))
        return default * scale
    array = np.asarray(default)
    if array.dtype.kind in "iuf" and array.size:
        choice = draw(st.sampled_from(["huge", "nan", "negative", "zeros", "short", "transposed", "complex", "text"]))
        floats = array.astype(float)
        if choice == "huge":
            return floats * 1e300
        if choice == "nan":
            floats.flat[draw(st.integers(0, floats.size - 1))] = math.nan
            return floats
        if choice == "negative":
            return -floats - 1.0
        if choice == "zeros":
            return np.zeros_like(floats)
        if choice == "short":
            return floats.reshape(-1)[:-1]
        if choice == "transposed":
            return np.atleast_2d(floats).T
        if choice == "complex":
            return floats + 1j
        return floats.astype(str)
    return draw(scalars)


def malformed(default: Any):
    # the field's own type pushed to extremes twice as often as the rest: most other values are
    # refused at the type check, these reach the bounds that come from the numerics
    return st.one_of(near_default(default), near_default(default), scalars, numpy_arrays(), nested_lists)


# -- the checks ----------------------------------------------------------------------


def names(message: str, field: str) -> bool:
    return message.startswith(f"{field}=") or re.search(rf"(?<![\w.]){re.escape(field)}(?![\w(])", message) is not None


def _finite_nonnegative(value: object) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            and value >= 0)


def _is_big(spec, problem, base_features: dict[str, float]) -> bool:
    if spec.memory(problem, next(iter(spec.implementations))) > BIG_BYTES:
        return True
    features = spec.features(problem)
    return any(value > BIG_FEATURE_FACTOR * base_features.get(name, 0.0) + BIG_FEATURE_MARGIN
               for name, value in features.items())


def _solve_cleanly(spec, problem) -> int:
    """Solve on each small-solve backend this solver has and this machine runs; return how many ran."""
    ran = 0
    for backend in SOLVE_BACKENDS:
        keys = [k for k in implementations(spec) if k.split(":")[0] == backend]
        if not keys or not probe(get_registry().backends[backend]).available:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = core.solve(problem, backend=backend, solver=spec.name)
        flagged = result.diagnostics["non_finite_outputs"]
        for name, value in result.outputs.items():
            array = np.asarray(value)
            if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
                assert name in flagged, f"{spec.name} on {backend}: {name} holds NaN or inf but is not flagged"
        if flagged:
            assert any(issubclass(w.category, NonFiniteResultWarning) for w in caught), "no NonFiniteResultWarning"
        ran += 1
    return ran


@pytest.mark.parametrize(("solver", "field"), _cases())
def test_malformed_value_is_refused_naming_the_field_or_runs_clean(solver, field, empty_cache):
    spec = get_solver(solver)
    params = small_params(spec)
    base = spec.problem_type(**params)
    base_features = dict(spec.features(base))
    default = getattr(base, field)

    @FUZZ
    @given(value=malformed(default))
    def check(value):
        with time_limit(CASE_SECONDS, f"{solver} with a malformed {field} ({type(value).__name__})"):
            check_case(value)

    def check_case(value):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow notes on the way to a refusal
            try:
                problem = spec.problem_type(**{**params, field: value})
            except ProblemError as error:
                assert names(str(error), field), f"blames the wrong field: {error}"
                assert "\n" not in str(error)
                return
        features = spec.features(problem)
        assert features and all(_finite_nonnegative(v) for v in features.values()), features
        for key in implementations(spec):
            assert _finite_nonnegative(spec.memory(problem, key)), (key, spec.memory(problem, key))
            assert isinstance(spec.supports(problem, key), str)
        if not _is_big(spec, problem, base_features):
            _solve_cleanly(spec, problem)

    check()
