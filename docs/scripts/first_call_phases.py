"""Where a new HJB problem's first ``core.solve`` call spends its time, auto against naming numba.

    python docs/scripts/first_call_phases.py

For 200 new small ``mfg.hjb_fdm`` problems (Nx 21-70), each on a fresh
planner that first planned another problem (as ``crossover evaluate``'s
loops), it prints the median overhead of the first call (wall less
kernel, us) and the median time of each phase (the plan, the loop's step,
the run and its bookkeeping), four ways: auto or naming numba, with the
free-memory reading fresh (read within the second) or stale (the first
call of a process that solves a problem every few seconds). Before that,
what reading each backend's free memory costs, and after, a cProfile of
120 auto first calls. Calibrates the solver (quick) where it never was.
"""

from __future__ import annotations

import collections
import cProfile
import io
import math
import pstats
import statistics
import time

import core
import core.api as api
import core.costmodel.plan as planmod
from core.backend import safe_free_memory
from core.costmodel.planner import Planner, current, use
from core.registry import get_registry, get_solver
from core.solver import problem_from_params

SPEC = get_solver("mfg.hjb_fdm")
TIMES: dict[str, list[float]] = collections.defaultdict(list)
TIMING = [False]


def problem(nx: int, nt: int) -> object:
    return problem_from_params(SPEC, {"Nx": nx, "Nt": nt})


def timed(module: object, name: str) -> None:
    """Replace ``module.name`` by a wrapper that adds its time to TIMES while TIMING is on."""
    function = getattr(module, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        result = function(*args, **kwargs)
        if TIMING[0]:
            TIMES[name].append(time.perf_counter() - began)
        return result

    setattr(module, name, wrapper)


def first_calls(problems: list, primer: object, backend: str, stale: bool) -> float:
    """The median overhead (us) of each problem's first call on a fresh planner."""
    overheads = []
    for new in problems:
        with use(Planner.from_calibration(current())):
            core.plan(primer, solver=SPEC.name, expected_calls=math.inf, explain=False, calibrate=True)
            if stale:
                current().process.memory_read = (-math.inf, {})
            TIMING[0] = True
            began = time.perf_counter()
            result = core.solve(new, backend, solver=SPEC.name, expected_calls=math.inf)
            wall = time.perf_counter() - began
            TIMING[0] = False
            overheads.append(wall - result.seconds)
    return statistics.median(overheads) * 1e6


def main() -> None:
    primer = problem(21, 12)
    for _ in range(5):
        core.solve(primer, solver=SPEC.name, expected_calls=math.inf)
    for name, backend in get_registry().backends.items():
        reads = []
        for _ in range(20):
            began = time.perf_counter()
            safe_free_memory(backend)
            reads.append(time.perf_counter() - began)
        print(f"free memory of {name}: {statistics.median(reads) * 1e6:.1f} us a reading")
    for name in ("plan", "_step", "_run", "_settling", "_next", "tier_up", "run_once", "_named"):
        timed(api, name)
    for name in ("_view", "_decide"):
        timed(planmod, name)
    problems = [problem(21 + i, nt) for i in range(50) for nt in (10, 11, 13, 17)]
    for backend in ("auto", "numba"):
        for stale in (False, True):
            TIMES.clear()
            overhead = first_calls(problems, primer, backend, stale)
            phases = ", ".join(f"{name} {statistics.median(values) * 1e6:.0f}" for name, values in TIMES.items())
            print(f"{backend}, {'stale' if stale else 'fresh'} free memory: first call {overhead:.0f} us over "
                  f"the kernel; phases (us): {phases}")
    profile = cProfile.Profile()
    for new in problems[:120]:
        with use(Planner.from_calibration(current())):
            core.plan(primer, solver=SPEC.name, expected_calls=math.inf, explain=False, calibrate=True)
            current().process.memory_read = (-math.inf, {})
            profile.enable()
            core.solve(new, solver=SPEC.name, expected_calls=math.inf)
            profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue()[:6000])


if __name__ == "__main__":
    main()
