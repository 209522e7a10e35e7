"""Bad input gets one specific line naming the field, the value and what is allowed."""

from __future__ import annotations

import math

import numpy as np
import pytest

import core
from core import BackendUnavailableError, ProblemError, UnknownBackendError
from core.problem import UnknownParameterError, make_problem
from core.validation import check_array, check_choice, check_float, check_int
from plugins.example.problem import RandomWalkProblem


@pytest.mark.parametrize(("field", "value", "message"), [
    ("n_walkers", 0, "n_walkers=0 is invalid: must be an integer >= 1"),
    ("n_walkers", -5, "n_walkers=-5 is invalid: must be an integer >= 1"),
    ("n_walkers", 2.5, "n_walkers=2.5 is invalid: must be an integer >= 1"),
    ("n_walkers", "many", "n_walkers='many' is invalid: must be an integer >= 1"),
    ("n_steps", True, "n_steps=True is invalid: must be an integer >= 1"),
    ("step_std", -1.0, "step_std=-1.0 is invalid: must be a finite number >= 0"),
    ("step_std", math.nan, "step_std=nan is invalid: must be a finite number >= 0"),
    ("drift", math.inf, "drift=inf is invalid: must be a finite number"),
    ("n_bins", 10**9, "n_bins=1000000000 is invalid: must be an integer >= 1 and <= 100000"),
    ("chunk", 0, "chunk=0 is invalid: must be an integer >= 1"),
    ("seed", -1, "seed=-1 is invalid: must be an integer >= 0 and <= 18446744073709551615"),
])
def test_each_invalid_field_names_itself(field, value, message):
    with pytest.raises(ProblemError) as caught:
        RandomWalkProblem(**{field: value})
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_integral_floats_are_accepted_as_sizes():
    assert RandomWalkProblem(n_walkers=1e3).n_walkers == 1000


def test_problems_are_immutable():
    problem = RandomWalkProblem()
    with pytest.raises(AttributeError):
        problem.n_walkers = 3


def test_array_validation():
    with pytest.raises(ProblemError, match=r"m0=array\(shape=\(3,\), dtype=float64\) is invalid: must be finite, "
                                           r"found 1 NaN or inf value\(s\)"):
        check_array("m0", np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ProblemError, match=r"m0=.* must have shape \(4,\), got \(3,\)"):
        check_array("m0", [1, 2, 3], shape=(4,))
    with pytest.raises(ProblemError, match=r"m0=.* must be non-negative, minimum is -1.0"):
        check_array("m0", [1, -1, 3], nonnegative=True)
    with pytest.raises(ProblemError, match=r"m0='abc' is invalid: must be an array of real numbers "
                                           r"\(integer or float dtype\), got string dtype <U3$"):
        check_array("m0", "abc")
    source = np.ones(3)
    checked = check_array("m0", source)
    source[0] = 5  # the caller changing its array cannot change the problem
    assert checked[0] == 1 and not checked.flags.writeable


def test_scalar_helpers():
    assert check_int("n", 3, minimum=1) == 3
    assert check_float("x", 2, minimum=0, strict_minimum=True) == 2.0
    with pytest.raises(ProblemError, match=r"x=0\.0 is invalid: must be a finite number > 0"):
        check_float("x", 0.0, minimum=0, strict_minimum=True)
    with pytest.raises(ProblemError, match="kde='fast' is invalid: must be one of 'binned', 'direct'"):
        check_choice("kde", "fast", ["binned", "direct"])


def test_make_problem_converts_text_and_rejects_unknown_names():
    problem = make_problem(RandomWalkProblem, {"n_walkers": "1e4", "drift": "0.5", "seed": "none"})
    assert problem.n_walkers == 10_000 and problem.drift == 0.5 and problem.seed is None
    with pytest.raises(UnknownParameterError, match=r"unknown parameter 'walkers' .* valid parameters: n_walkers, "):
        make_problem(RandomWalkProblem, {"walkers": "3"})
    with pytest.raises(ProblemError, match=r"drift='fast' is invalid: must be a finite number$"):
        make_problem(RandomWalkProblem, {"drift": "fast"})


def test_unknown_backend():
    with pytest.raises(UnknownBackendError) as caught:
        core.solve(RandomWalkProblem(n_walkers=10), backend="cuda")
    registered = ", ".join(core.backends(describe=False))  # the built-ins first, then plugins' (ml's torch_cpu)
    assert registered.startswith("numpy, numba, process, torch")
    assert str(caught.value) == f"unknown backend 'cuda'; registered backends: {registered}"


def test_unavailable_backend_says_why():
    if core.availability("torch").available:
        pytest.skip("a GPU is present; the unavailable path is tested on CPU machines")
    with pytest.raises(BackendUnavailableError, match=r"^backend 'torch' is unavailable here: torch .*"
                                                      r"(not installed|sees no CUDA or MPS device)"):
        core.solve(RandomWalkProblem(n_walkers=10), backend="torch")


def test_torch_without_a_device_reports_the_build(monkeypatch):
    """With torch installed but no GPU, the reason names the torch build; no CPU fallback."""
    import sys
    import types

    from core.backends import torch_gpu

    fake = types.SimpleNamespace(
        __version__="9.9.9+cpu",
        cuda=types.SimpleNamespace(is_available=lambda: False),
        backends=types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: False)),
        version=types.SimpleNamespace(cuda=None),
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(torch_gpu.importlib.util, "find_spec", lambda name: object())
    status = torch_gpu.BACKEND.probe()
    assert status == core.Availability(False, "torch 9.9.9+cpu (a CPU-only build) sees no CUDA or MPS device")
    with pytest.raises(BackendUnavailableError, match="sees no CUDA or MPS device"):
        torch_gpu.device()


def test_wrong_problem_for_solver():
    @__import__("dataclasses").dataclass(frozen=True)
    class Other:
        n: int = 1

    with pytest.raises(ProblemError, match=r"no registered solver takes a Other"):
        core.solve(Other(), backend="numpy")
    with pytest.raises(ProblemError, match=r"solver 'example.random_walk' takes a RandomWalkProblem, got Other"):
        core.solve(Other(), backend="numpy", solver="example.random_walk")


def test_unknown_solver():
    with pytest.raises(core.UnknownSolverError, match=r"unknown solver 'mfg.nope'; registered solvers: .*example"):
        core.solve(RandomWalkProblem(), backend="numpy", solver="mfg.nope")


def test_large_integer_parameters_stay_exact():
    assert make_problem(RandomWalkProblem, {"seed": "12345678901234567891"}).seed == 12345678901234567891
