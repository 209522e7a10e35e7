"""Parallel efficiency of the process backend on common noise: T(1 worker) / (W * T(W workers)).

    python docs/scripts/common_noise_scaling.py --workers 16 --K 64 --N 20000 --Nx 51 --Nt 51

Each pool is warmed up first (workers started, Numba kernels loaded from the
on-disk cache in every worker), so the figure is the steady state a sweep
or a long calibration sees. Both runs use the same paths, so their results
are identical; the script checks that too.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from core.backends import process_pool
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
    one, out_one = timed_on(1, problem)
    many, out_many = timed_on(args.workers, problem)
    process_pool.shutdown()
    same = bool(np.array_equal(out_one["M_mean"], out_many["M_mean"]))
    efficiency = one / (args.workers * many)
    busy_one, busy_many = out_one["path_seconds"].sum(), out_many["path_seconds"].sum()
    print(f"1 worker: {one:.2f} s; {args.workers} workers: {many:.2f} s; speed-up {one / many:.2f}x; "
          f"parallel efficiency {efficiency:.1%}; identical results: {same}; "
          f"paths converged: {int(out_many['converged'].sum())}/{args.K}")
    # where the efficiency goes: slower paths when all cores run (clock, memory), or idle workers
    print(f"path seconds summed: {busy_one:.2f} on 1 worker, {busy_many:.2f} on {args.workers} "
          f"(x{busy_many / busy_one:.2f}); busy fraction of {args.workers} workers: "
          f"{busy_many / (args.workers * many):.1%}; iterations per path {out_many['iterations'].min()}.."
          f"{out_many['iterations'].max()}")
    print(json.dumps({"workers": args.workers, "K": args.K, "N": args.N, "one_worker_s": one, "many_workers_s": many,
                      "efficiency": efficiency, "identical": same}))


if __name__ == "__main__":
    main()
