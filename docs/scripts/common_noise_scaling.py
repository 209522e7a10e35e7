"""Parallel efficiency of the process backend on common noise: T(1 worker) / (W * T(W workers)).

    python docs/scripts/common_noise_scaling.py --workers 16 --K 64 --N 20000 --Nx 51 --Nt 51

Each pool is warmed up first (workers started, Numba kernels loaded from the
on-disk cache in every worker), so the figure is the steady state a sweep
or a long calibration sees. Both runs use the same paths, so their results
are identical; the script checks that too.

It also measures the host's all-core penalty: the same pure-Python loop
timed as one task alone and as one of W tasks running at once. A loop that
touches no memory slows down under full load only because the cores clock
lower or share their hardware, which no scheduling can win back.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from core.backends import process_pool
from core.backends.process_pool import map_tasks
from plugins.mfg.common_noise import solve_process
from plugins.mfg.problem import CommonNoiseProblem


def timed_on(workers: int, problem: CommonNoiseProblem) -> tuple[float, dict]:
    import os

    os.environ["CROSSOVER_WORKERS"] = str(workers)
    # many tiny paths, so that every worker (not just the first to be free) has loaded the
    # Numba kernels before the clock starts: a worker's first path pays ~0.7 s for that
    warm = CommonNoiseProblem(**{**problem.model_fields(), "K": 8 * workers, "N": 500, "Nt": 5})
    solve_process(warm)
    started = time.perf_counter()
    out = solve_process(problem)
    return time.perf_counter() - started, out


def spin(task: int, shared, seed) -> float:
    """The clock probe: ``task`` iterations of integer arithmetic, seconds taken."""
    started = time.perf_counter()
    total = 0
    for i in range(task):
        total += i * i
    return time.perf_counter() - started


def all_core_penalty(workers: int, loops: int = 3_000_000) -> float:
    """Median probe time with W probes at once over the median alone."""
    alone = [map_tasks(spin, [loops], workers=1)[0] for _ in range(3)]
    crowded = map_tasks(spin, [loops] * (3 * workers), workers=workers)
    return float(np.median(crowded) / np.median(alone))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--N", type=int, default=20_000)
    parser.add_argument("--Nx", type=int, default=51)
    parser.add_argument("--Nt", type=int, default=51)
    parser.add_argument("--preset", default="lq")
    args = parser.parse_args()
    problem = CommonNoiseProblem(preset=args.preset, K=args.K, N=args.N, Nx=args.Nx, Nt=args.Nt)
    penalty = all_core_penalty(args.workers)
    one, out_one = timed_on(1, problem)
    many, out_many = timed_on(args.workers, problem)
    process_pool.shutdown()
    same = bool(np.array_equal(out_one["M_mean"], out_many["M_mean"]))
    efficiency = one / (args.workers * many)
    print(f"1 worker: {one:.2f} s; {args.workers} workers: {many:.2f} s; speed-up {one / many:.2f}x; "
          f"parallel efficiency {efficiency:.1%}; identical results: {same}; "
          f"paths converged: {int(out_many['converged'].sum())}/{args.K}")
    # where the efficiency goes: paths slower when every core runs (clock, shared caches), or a tail
    # of last paths; paths that ran on one core throughout time the first, lent cores shorten the second
    alone = out_many["path_threads"] == 1
    slowdown = out_many["path_seconds"][alone].sum() / out_one["path_seconds"][alone].sum()
    print(f"host all-core penalty (pure-Python probe): x{penalty:.2f}; one-core paths under full load: "
          f"x{slowdown:.2f} ({int(alone.sum())} of {args.K}); cores lent to the last paths: "
          f"{sorted(out_many['path_threads'][~alone].tolist())}; iterations per path "
          f"{out_many['iterations'].min()}..{out_many['iterations'].max()}")
    print(json.dumps({"workers": args.workers, "K": args.K, "N": args.N, "one_worker_s": one, "many_workers_s": many,
                      "efficiency": efficiency, "identical": same, "all_core_penalty": penalty,
                      "path_slowdown": slowdown}))


if __name__ == "__main__":
    main()
