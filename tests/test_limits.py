"""Nothing absurd starts: a run predicted past the time limit is refused before it begins (issue 9)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import core
from core import TooLongError
from core.errors import ProblemError
from core.limits import duration, max_seconds
from core.solver import SizeSpace
from core.validation import check_int

RUNS: list[int] = []


@dataclass(frozen=True)
class SumProblem:
    n: int = 1000

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def _total(problem: SumProblem) -> dict:
    RUNS.append(problem.n)
    return {"total": np.arange(problem.n, dtype=np.float64).sum()}


@pytest.fixture
def summing(fresh_registry, empty_cache):
    """A tiny solver with one backend, calibrated: its models predict every size."""
    plugin = type("Summing", (), {})()
    plugin.crossover_solvers = core.hookimpl(lambda: [core.SolverSpec(
        name="limits.sum", problem_type=SumProblem, implementations={"numpy": _total},
        features=lambda p: {"n": float(p.n)}, size_axis="n",
        space=lambda quick: SizeSpace(ranges={"n": (1_000, 1_000_000)}),
        memory=lambda p, b: 8.0 * min(p.n, 10**6), default_problem=SumProblem)])
    core.register(plugin, name="limits")
    core.calibrate(["limits.sum"], budget=2.0)
    RUNS.clear()
    return SumProblem


@pytest.mark.parametrize("backend", ["auto", "numpy"])
def test_a_run_predicted_past_the_limit_is_refused_before_it_starts(summing, backend):
    problem = summing(n=10**12)  # hours at any memory bandwidth (the memory model says it streams)
    with pytest.raises(TooLongError) as refused:
        core.solve(problem, backend=backend, max_seconds=1.0)
    message = str(refused.value)
    assert "limits.sum on numpy is predicted to take" in message and "over the limit of 1 s" in message
    assert "needing about 7.63 MiB" in message and "max_seconds=" in message and "\n" not in message
    assert RUNS == []  # nothing ran


def test_the_limit_can_be_lifted(summing):
    result = core.solve(summing(n=2000), max_seconds=float("inf"))
    # it ran (a short run may repeat within the call while the loop gathers its first samples)
    assert float(result["total"]) == 1999 * 2000 / 2 and set(RUNS) == {2000}


def test_the_environment_sets_the_limit_and_the_plan_warns(summing, monkeypatch):
    monkeypatch.setenv("CROSSOVER_MAX_SECONDS", "1e-9")
    decision = core.plan(summing(n=500_000))
    assert "WARNING: limits.sum on numpy is predicted to take" in decision.reason
    with pytest.raises(TooLongError):
        core.solve(summing(n=500_000))
    monkeypatch.setenv("CROSSOVER_MAX_SECONDS", "inf")
    assert "WARNING" not in core.plan(summing(n=500_000)).reason


@pytest.mark.parametrize("value", ["abc", "0", "-3", "nan", ""])
def test_a_bad_limit_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("CROSSOVER_MAX_SECONDS", value)
    if value == "":  # unset or empty: the default
        assert max_seconds() == 3600.0
        return
    with pytest.raises(ProblemError, match=rf"CROSSOVER_MAX_SECONDS={value!r} is invalid: must be a number"):
        max_seconds()


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "soon", True])
def test_a_bad_max_seconds_argument_is_refused(value):
    with pytest.raises(ProblemError, match=r"max_seconds=.* is invalid"):
        max_seconds(value)


@pytest.mark.parametrize(("seconds", "text"), [(4.2, "4.2 s"), (720, "12 min"), (3 * 3600, "3 h"),
                                               (7.5 * 86400, "7.5 days")])
def test_durations_read_as_people_say_them(seconds, text):
    assert duration(seconds) == text
