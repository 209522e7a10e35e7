"""Parallel efficiency of the process backend on common noise: T(1 worker) / (W * T(W workers)).

    python docs/scripts/common_noise_scaling.py --workers 16 --K 64 --N 20000 --Nx 51 --Nt 51

Each pool is warmed up first (workers started, Numba kernels loaded from the
on-disk cache in every worker), so the figure is the steady state a sweep
or a long calibration sees. Every run uses the same paths, so every result
is identical; the script checks that too.

Each kind of run is repeated, and the efficiency is given two ways: from
the medians (as asv reports timings) and from the fastest runs (as
``timeit`` advises: on a shared virtual machine a run of a few seconds can
land on a burst of the neighbours' load, which only ever adds time, so the
fastest run is the closest to what the code itself costs). The W-worker runs alternate between lending idle workers'
cores to the last paths and not lending them (``CROSSOVER_LEND_IDLE_CORES``),
so the two are compared under the same conditions.

It also measures the host's all-core penalty: the same pure-Python loop
timed as one task alone and as one of W tasks running at once. A loop that
touches no memory slows down under full load only because the cores clock
lower or share their hardware, which no scheduling can win back.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from core.backends import process_pool
from core.tasks import map_tasks
from plugins.mfg.common_noise import solve_parallel
from plugins.mfg.problem import CommonNoiseProblem


def warm_up(workers: int, problem: CommonNoiseProblem) -> None:
    os.environ["CROSSOVER_WORKERS"] = str(workers)
    # many tiny paths, so that every worker (not just the first to be free) has loaded the
    # Numba kernels before the clock starts: a worker's first path pays ~0.7 s for that
    solve_parallel(CommonNoiseProblem(**{**problem.model_fields(), "K": 8 * workers, "N": 500, "Nt": 5}),
                   backend="process")


def timed(problem: CommonNoiseProblem, lend: bool) -> tuple[float, dict]:
    os.environ["CROSSOVER_LEND_IDLE_CORES"] = "1" if lend else "0"  # read by the calling process, per map
    started = time.perf_counter()
    out = solve_parallel(problem, backend="process")
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
    alone = [map_tasks(spin, [loops], backend="process", workers=1)[0] for _ in range(3)]
    crowded = map_tasks(spin, [loops] * (3 * workers), backend="process", workers=workers)
    return float(np.median(crowded) / np.median(alone))


def path_slowdown(one: dict, many: dict) -> float:
    """Time of the paths that ran on one core throughout, under full load over alone."""
    alone = many["path_threads"] == 1
    return float(many["path_seconds"][alone].sum() / one["path_seconds"][alone].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--N", type=int, default=20_000)
    parser.add_argument("--Nx", type=int, default=51)
    parser.add_argument("--Nt", type=int, default=51)
    parser.add_argument("--preset", default="lq")
    parser.add_argument("--repeats", type=int, default=5, help="W-worker runs of each kind")
    parser.add_argument("--one-repeats", type=int, default=2, help="1-worker runs")
    args = parser.parse_args()
    problem = CommonNoiseProblem(preset=args.preset, K=args.K, N=args.N, Nx=args.Nx, Nt=args.Nt)
    w = args.workers

    penalty = all_core_penalty(w)
    ones: list[tuple[float, dict]] = []

    def one_worker_runs(count: int) -> None:
        warm_up(1, problem)
        ones.extend(timed(problem, lend=True) for _ in range(count))  # one worker has nothing to lend

    # the 1-worker runs before and after the W-worker ones, so that a drift of the host's load shows
    one_worker_runs(args.one_repeats - args.one_repeats // 2)
    warm_up(w, problem)
    runs: dict[bool, list[tuple[float, dict]]] = {True: [], False: []}
    for _ in range(args.repeats):
        for lend in (True, False):
            runs[lend].append(timed(problem, lend))
    one_worker_runs(args.one_repeats // 2)
    process_pool.shutdown()

    reference = ones[0][1]
    identical = all(np.array_equal(reference["M_mean"], out["M_mean"])
                    for out in [o for _, o in ones] + [o for r in runs.values() for _, o in r])
    one = float(np.median([t for t, _ in ones]))
    one_best = min(t for t, _ in ones)
    print(f"host: {os.cpu_count()} cores; all-core penalty of a pure-Python probe: x{penalty:.2f}")
    print(f"1 worker: {', '.join(f'{t:.2f}' for t, _ in ones)} s (median {one:.2f} s)")
    summary = {"workers": w, "K": args.K, "N": args.N, "one_worker_s": [t for t, _ in ones],
               "all_core_penalty": penalty, "identical": identical}
    for lend, label in ((True, "lending idle cores"), (False, "one core per path")):
        times = [t for t, _ in runs[lend]]
        many = float(np.median(times))
        slow = [path_slowdown(reference, out) for _, out in runs[lend]]
        lent = sorted(runs[lend][int(np.argsort(times)[len(times) // 2])][1]["path_threads"].tolist())[-8:]
        print(f"{w} workers, {label}: {', '.join(f'{t:.2f}' for t in times)} s (median {many:.2f} s); "
              f"efficiency per run {', '.join(f'{one / (w * t):.1%}' for t in times)}; "
              f"median efficiency {one / (w * many):.1%}; best-run efficiency {one_best / (w * min(times)):.1%}; "
              f"one-core path slowdown "
              f"{', '.join(f'x{s:.2f}' for s in slow)}" + (f"; cores of the last paths {lent}" if lend else ""))
        key = "lend" if lend else "no_lend"
        summary[f"{key}_s"] = times
        summary[f"{key}_efficiency"] = one / (w * many)
        summary[f"{key}_best_efficiency"] = one_best / (w * min(times))
    print(f"identical results in every run: {identical}; paths converged: "
          f"{int(reference['converged'].sum())}/{args.K}; iterations per path "
          f"{reference['iterations'].min()}..{reference['iterations'].max()}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
