"""What ``core.solve`` costs on top of the kernel it runs, in steady state.

A user's loop calls ``core.solve(problem)`` again and again; every call
plans, runs the chosen implementation, and observes the time. The overhead
is the call's wall time minus the kernel's own measured time
(``Result.seconds``, which covers the implementation and its device-to-host
copy). The goal: at most 0.3 ms, or 2 % of the solve.

``track_overhead_ms`` is the median overhead over many steady-state calls
(after the loop settled) of a small problem of each solver;
``track_overhead_fraction`` divides it by the solve's median time.

``FirstCalls`` times what ``crossover evaluate``'s loop ratio charges on small
problems: a new problem's three calls on a fresh planner over the
calibration (as ``evaluate`` runs them, ``core.costmodel.evaluate.run_loop``),
choosing and naming the implementation the first choice ran. Its tracks are
the first call's overhead either way and the choosing calls' total over the
naming ones' (the selection issue's bar is 1.3). A user's process keeps one
planner for every problem it solves, which ``evaluate``'s fresh planners do
not: ``track_long_lived_first_call_overhead_ms`` is the first call's
overhead on new problems (the small one's size plus 1, 2, ...) after that
planner has solved :data:`LONG_LIVED_PROBLEMS` of them.

Run it without asv too: ``python asv_benchmarks/bench_solve_overhead.py``
(a quick calibration of each solver first, in a temporary wisdom store);
``--first-calls`` adds ``FirstCalls``' figures; ``--profile`` adds where the steady-state calls spend their time (each
phase's wall time, then cProfile's top functions by their own and their
cumulative time), to find what a host adds.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time

import core
from core.costmodel import history

PROBLEMS = {
    "example.random_walk": {"n_walkers": 2_000, "n_steps": 20},
    "mfg.fp_particle": {"N": 2_000, "Nx": 31, "Nt": 20},
    "ml.linreg": {"n_samples": 2_000, "n_epochs": 10},
}
WARM_CALLS = 20
TIMED_CALLS = 200


def _problem(solver: str):
    from core.registry import get_solver
    from core.solver import problem_from_params

    return problem_from_params(get_solver(solver), PROBLEMS[solver])


def steady_overhead(solver: str, calls: int = TIMED_CALLS) -> tuple[float, float]:
    """(median overhead seconds, median kernel seconds) of ``calls`` steady-state ``core.solve`` calls."""
    problem = _problem(solver)
    for _ in range(WARM_CALLS):  # the loop settles: one-offs paid, contenders tried
        core.solve(problem, solver=solver)
    overheads, kernels = [], []
    for _ in range(calls):
        began = time.perf_counter()
        result = core.solve(problem, solver=solver)
        overheads.append(time.perf_counter() - began - result.seconds)
        kernels.append(result.seconds)
    return statistics.median(overheads), statistics.median(kernels)


class SolveOverhead:
    params = (tuple(PROBLEMS),)
    param_names = ("solver",)
    timeout = 900

    def setup_cache(self) -> str:
        directory = tempfile.mkdtemp(prefix="crossover-asv-overhead-")
        os.environ["CROSSOVER_CACHE_DIR"] = directory
        history.forget()
        core.calibrate(list(PROBLEMS), quick=True)
        return directory

    def setup(self, directory: str, solver: str) -> None:
        os.environ["CROSSOVER_CACHE_DIR"] = directory
        history.forget()

    def track_overhead_ms(self, directory: str, solver: str) -> float:
        return 1e3 * steady_overhead(solver)[0]

    track_overhead_ms.unit = "ms per call"

    def track_overhead_fraction(self, directory: str, solver: str) -> float:
        overhead, kernel = steady_overhead(solver)
        return overhead / kernel

    track_overhead_fraction.unit = "overhead / kernel seconds"


FIRST_CALL_LOOPS = 40


def first_calls(solver: str, loops: int = FIRST_CALL_LOOPS) -> dict[str, float]:
    """Medians over ``loops`` new problems (fresh copies of the solver's small problem): each of the three calls'
    overhead choosing and naming (the implementation the choosing loop ran first), and their walls' ratio."""
    from core.costmodel.evaluate import hold_inputs, primer, run_loop, warm_the_process
    from core.registry import get_solver

    spec = get_solver(solver)
    warm_the_process(spec, True)  # a user's process has run the solver before (evaluate does the same)
    earlier = primer(spec, True)
    rows: dict[str, list[float]] = {}
    for _ in range(loops):
        problem = _problem(solver)
        hold_inputs(problem)
        _, chosen, chosen_walls = run_loop(spec, problem, 3, primer=earlier)
        twin = _problem(solver)
        hold_inputs(twin)
        _, named, named_walls = run_loop(spec, twin, 3, backend=chosen[0].backend, planning="estimate",
                                         primer=earlier)
        for label, results, walls in (("choosing", chosen, chosen_walls), ("naming", named, named_walls)):
            for call, (result, wall) in enumerate(zip(results, walls), 1):
                rows.setdefault(f"{label} call {call}", []).append(wall - result.seconds)
        rows.setdefault("ratio", []).append(sum(chosen_walls) / sum(named_walls))
    return {name: statistics.median(values) for name, values in rows.items()}


LONG_LIVED_PROBLEMS = 90


def long_lived_first_calls(solver: str, problems: int = LONG_LIVED_PROBLEMS) -> float:
    """The median first-call overhead (seconds) over the last third of ``problems`` new problems, three calls
    each, all on one planner (a user's process), none of them seen before."""
    from core.costmodel.evaluate import hold_inputs, warm_the_process
    from core.costmodel.planner import Planner, current, use
    from core.registry import get_solver
    from core.solver import problem_from_params

    spec = get_solver(solver)
    warm_the_process(spec, True)
    overheads = []
    with use(Planner.from_calibration(current())):
        for index in range(problems):
            params = {**PROBLEMS[solver], spec.size_axis: PROBLEMS[solver][spec.size_axis] + index + 1}
            problem = problem_from_params(spec, params)
            hold_inputs(problem)
            for call in range(3):
                began = time.perf_counter()
                result = core.solve(problem, solver=solver, expected_calls=math.inf)
                if call == 0:
                    overheads.append(time.perf_counter() - began - result.seconds)
    return statistics.median(overheads[-max(1, problems // 3):])


class FirstCalls:
    """A new small problem's first calls: what the plan costs before anything settles."""

    params = (tuple(PROBLEMS),)
    param_names = ("solver",)
    timeout = 900

    def setup_cache(self) -> str:
        return SolveOverhead().setup_cache()

    def setup(self, directory: str, solver: str) -> None:
        SolveOverhead().setup(directory, solver)

    def track_first_call_overhead_ms(self, directory: str, solver: str) -> float:
        return 1e3 * first_calls(solver)["choosing call 1"]

    track_first_call_overhead_ms.unit = "ms over the kernel"

    def track_named_first_call_overhead_ms(self, directory: str, solver: str) -> float:
        return 1e3 * first_calls(solver)["naming call 1"]

    track_named_first_call_overhead_ms.unit = "ms over the kernel"

    def track_three_calls_over_named(self, directory: str, solver: str) -> float:
        return first_calls(solver)["ratio"]

    track_three_calls_over_named.unit = "choosing / naming wall time"

    def track_long_lived_first_call_overhead_ms(self, directory: str, solver: str) -> float:
        return 1e3 * long_lived_first_calls(solver)

    track_long_lived_first_call_overhead_ms.unit = "ms over the kernel"


def _profile(solver: str, top: int = 25) -> None:
    """Print where steady-state calls of ``solver`` spend their time, by each function's own time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    steady_overhead(solver)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def _phases(solver: str) -> None:
    """Print the mean wall time per call of each phase of ``core.solve`` (wrapped, so no profiler inflates it)."""
    import core.api as api
    from core.costmodel.planner import Planner

    spent: dict[str, float] = {}

    def timed(name, function):
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - began
        return wrapper

    originals = {name: getattr(api, name) for name in ("plan", "_step", "_refuse_if_too_long", "_run", "run_once")}
    observe = Planner.observe
    for name, function in originals.items():
        setattr(api, name, timed(name, function))
    Planner.observe = timed("observe", observe)
    try:
        began = time.perf_counter()
        steady_overhead(solver)
        total = time.perf_counter() - began
    finally:
        for name, function in originals.items():
            setattr(api, name, function)
        Planner.observe = observe
    calls = WARM_CALLS + TIMED_CALLS
    inner = spent["_run"] - spent["run_once"] - spent["observe"]
    rows = {"plan": spent["plan"], "loop step": spent["_step"], "time limit check": spent["_refuse_if_too_long"],
            "observe": spent["observe"], "_run, less kernel and observe": inner,
            "solve, less the above and _run": total - spent["plan"] - spent["_step"]
            - spent["_refuse_if_too_long"] - spent["_run"]}
    for name, seconds in rows.items():
        print(f"    {name:32s} {1e3 * seconds / calls:7.3f} ms a call")


def main() -> None:
    names = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    bench = SolveOverhead()
    directory = bench.setup_cache()
    for solver in names or PROBLEMS:
        bench.setup(directory, solver)
        overhead, kernel = steady_overhead(solver)
        print(f"{solver:22s} overhead {overhead * 1e3:7.3f} ms  kernel {kernel * 1e3:8.3f} ms  "
              f"({overhead / kernel:.1%} of the solve)")
        if "--first-calls" in sys.argv:
            found = first_calls(solver)
            print("    " + "; ".join(f"{name} {value * 1e6:.0f} us" for name, value in found.items() if name != "ratio")
                  + f"; three calls choosing / naming {found['ratio']:.2f}x")
            print(f"    first call on a new problem, one planner after {LONG_LIVED_PROBLEMS} of them: "
                  f"{long_lived_first_calls(solver) * 1e6:.0f} us")
        if "--profile" in sys.argv:
            _phases(solver)
            _profile(solver)


if __name__ == "__main__":
    main()
