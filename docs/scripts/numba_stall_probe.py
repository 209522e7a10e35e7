"""Does something else in the process stall Numba's threads? Times one small numba solve after each suspect.

Prints the median of 15 solves of ``example.random_walk`` (``--walkers``,
default 1,518 walkers x 17 steps) on numba: alone, then after a process-pool
map, after a torch solve (where a GPU exists), and after both again.

    python docs/scripts/numba_stall_probe.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import core
from core.registry import get_solver
from core.solver import problem_from_params


def median_ms(spec, problem, key: str, repeats: int = 15) -> float:
    core.solve(problem, backend=key, solver=spec.name)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        core.solve(problem, backend=key, solver=spec.name)
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walkers", type=int, default=1518)
    args = parser.parse_args()
    spec = get_solver("example.random_walk")
    problem = problem_from_params(spec, {"n_walkers": args.walkers, "n_steps": 17})
    rows = [("numba alone", median_ms(spec, problem, "numba"))]
    core.solve(problem, backend="process", solver=spec.name)
    rows.append(("numba after a process map", median_ms(spec, problem, "numba")))
    if core.availability("torch").available:
        core.solve(problem, backend="torch", solver=spec.name)
        rows.append(("numba after a torch solve", median_ms(spec, problem, "numba")))
        median_ms(spec, problem, "torch", 3)
        rows.append(("numba right after torch solves", median_ms(spec, problem, "numba")))
    from core.backends import process_pool

    process_pool.shutdown()
    rows.append(("numba after the pool's shutdown", median_ms(spec, problem, "numba")))
    for label, ms in rows:
        print(f"{label:34s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
