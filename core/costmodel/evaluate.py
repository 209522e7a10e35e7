"""The honesty check: does auto-selection pick the fastest implementation on problems it never measured?

Held-out problems are seeded random points of the solver's size space that
calibration never measured, plus a few beyond the top of its size axis
(:func:`core.costmodel.design.held_out_problems`). On each, every runnable
implementation is timed (the best of three rounds taken seconds apart,
:func:`best_of_rounds`), and the choice the *models* make, before the
timings and without learning from them (no measuring, one-off costs
ignored), is scored by its regret ``t_chosen / t_best - 1``: 0 when it
picked the fastest, 0.5 when the pick took 50 % longer than the best would
have.

A second regret scores what ``core.solve`` does with a problem that runs
more than once: where the plan is not confident it measures its close
candidates once and keeps the fastest. Those rows are marked, and their
*auto* regret is that of the fastest close candidate in the same timings
(the time spent measuring is the one-off price of that, paid once per
problem). The model regret is the stricter number: it is what the models
alone are worth.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from core.costmodel.calibrate import ensure_calibrated, measure
from core.costmodel.design import held_out_problems
from core.costmodel.plan import plan
from core.registry import get_solver
from core.running import run_once
from core.validation import check_int, check_seed


@dataclass
class EvaluationRow:
    size: float
    params: dict[str, Any]
    seconds: dict[str, float]
    chosen: str
    best: str
    regret: float
    confident: bool = True
    auto: str = ""  # what a repeated solve runs: the model's pick, or the fastest close candidate when unsure
    auto_regret: float = 0.0
    # what each model predicted (seconds, and its status), to tell a model's miss from a timing's
    predicted: dict[str, tuple[float | None, str]] = field(default_factory=dict)


@dataclass
class Evaluation:
    solver: str
    rows: list[EvaluationRow] = field(default_factory=list)

    @property
    def regrets(self) -> list[float]:
        return [row.regret for row in self.rows]

    @property
    def median_regret(self) -> float:
        return statistics.median(self.regrets) if self.rows else math.nan

    @property
    def max_regret(self) -> float:
        return max(self.regrets) if self.rows else math.nan

    @property
    def median_auto_regret(self) -> float:
        return statistics.median(row.auto_regret for row in self.rows) if self.rows else math.nan

    @property
    def max_auto_regret(self) -> float:
        return max(row.auto_regret for row in self.rows) if self.rows else math.nan

    def worst(self, count: int = 3) -> list[EvaluationRow]:
        return sorted(self.rows, key=lambda row: row.regret, reverse=True)[:count]

    def to_dict(self) -> dict[str, Any]:
        return {"solver": self.solver, "median_regret": self.median_regret, "max_regret": self.max_regret,
                "median_auto_regret": self.median_auto_regret, "max_auto_regret": self.max_auto_regret,
                "rows": [vars(row) for row in self.rows]}


def _params(problem: Any, fields: list[str]) -> dict[str, Any]:
    return {name: getattr(problem, name) for name in fields}


ROUNDS = 3
SETTLE_SECONDS = 0.3


def settle(spec: Any, keys: list[str], problem: Any) -> None:
    """Run each implementation for about SETTLE_SECONDS before its first timing in this process.

    A thread pool's first ~0.1 s runs slow: new threads start on their
    parent's core until the kernel's load balancer spreads them (on the
    2-core VM the first held-out problem's three rounds of numba:threads all
    took 1.7x its later time). Timings begin once every pool has settled.
    """
    for key in keys:
        started = time.perf_counter()
        while True:
            run_once(spec, key, problem)
            if time.perf_counter() - started >= SETTLE_SECONDS:
                break


def best_of_rounds(spec: Any, cases: list[tuple[Any, list[str]]], repeats: int,
                   rounds: int = ROUNDS) -> list[dict[str, float]]:
    """Each case's implementations' times: for each, the best of ``rounds`` rounds of :func:`measure`.

    A round is a warm-up and the median of several runs (tens of ms). Round
    ``r`` of every case and implementation runs before round ``r + 1`` of
    any, so one implementation's rounds lie seconds apart: a slow spell of a
    shared machine (on the 2-core VM the same sub-millisecond run took 1.9x
    longer for a few seconds at a time) slows at most some rounds of each,
    and the best round is the implementation's speed. Alone, one round each
    made two implementations running the same code differ by up to 68 % on
    that VM. Each round's warm-up absorbs what the previous implementation
    left behind (spinning threads, a cold cache).
    """
    best = [dict.fromkeys(keys, math.inf) for _, keys in cases]
    for _ in range(rounds):
        for (problem, keys), times in zip(cases, best):
            for key in keys:
                times[key] = min(times[key], measure(spec, key, problem, repeats)[1])
    return best


def evaluate(solver: str, quick: bool = True, repeats: int = 3, count: int = 12, seed: int = 2024) -> Evaluation:
    """Time every runnable implementation on held-out problems and score the models' choice."""
    spec = get_solver(solver)
    count, repeats = check_int("count", count, minimum=1), check_int("repeats", repeats, minimum=1)
    seed = check_seed("seed", seed)
    ensure_calibrated(spec)
    report = Evaluation(spec.name)
    fields = list(spec.space(quick).ranges) + list(spec.space(quick).choices) if spec.space else [spec.size_axis]
    settled: set[str] = set()
    cases, decisions = [], []
    for problem in held_out_problems(spec, quick, count=count, seed=seed):
        # decide first, on the steady state (evaluation warms every implementation up)
        decision = plan(problem, solver=spec.name, expected_calls=math.inf, explain=False)
        runnable = [key for key in decision.predictions if key not in decision.excluded]
        settle(spec, [key for key in runnable if key not in settled], problem)
        settled.update(runnable)
        cases.append((problem, runnable))
        decisions.append(decision)
    for (problem, _), decision, seconds in zip(cases, decisions, best_of_rounds(spec, cases, repeats)):
        best = min(seconds, key=seconds.get)
        # everything here is warm, so a repeated solve would measure every close candidate
        close = [key for key in decision.close if key in seconds] if not decision.confident else []
        close = close or [decision.backend]
        auto = min(close, key=seconds.get)
        report.rows.append(EvaluationRow(size=float(getattr(problem, spec.size_axis)),
                                         params=_params(problem, fields), seconds=seconds,
                                         chosen=decision.backend, best=best,
                                         regret=seconds[decision.backend] / seconds[best] - 1,
                                         confident=decision.confident, auto=auto,
                                         auto_regret=seconds[auto] / seconds[best] - 1,
                                         predicted={key: (decision.predictions[key].seconds,
                                                          decision.predictions[key].status) for key in seconds}))
    return report
