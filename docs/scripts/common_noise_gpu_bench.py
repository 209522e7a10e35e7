"""Common noise on one GPU (``torch:resident``) against the process pool: wall time per K, and the crossover K.

    python docs/scripts/common_noise_gpu_bench.py --workers 16 --K 16 64 256 1024 4096

The problem is ``mfg.common_noise``'s default preset and size: ``lq``,
N = 5,000 particles, Nx = 51, Nt = 50, the default tolerances (each path
stops on its own test, 60 Picard iterations at most). Both sides solve the
same K paths:

- ``torch:resident``: every path in one batch on the GPU, the fixed point
  on the device, U and M copied to the host once (``solve_torch(...,
  resident=True)``);
- ``process``: the paths as tasks on a pool of ``--workers`` processes, each
  path the numba fixed point (``solve_parallel(..., backend="process")``,
  what ``crossover run mfg.common_noise --backend process`` runs).

Warm: each side first solves a K = 16 problem of the same size (pool start,
numba's kernels in every worker, the CUDA context, Triton's compiles), and
the GPU's first run at each K is not counted. Each time is the median of
``--repeats`` runs (fewer once a K has taken ``--max-seconds``), with the
summary on the host inside the clock. It prints the GPU and CPU, then a
markdown table and the crossover: the smallest K at which the GPU wins.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from plugins.mfg.common_noise import solve_parallel, solve_torch
from plugins.mfg.problem import CommonNoiseProblem


def seconds(run: Callable[[], dict], repeats: int, max_seconds: float) -> tuple[float, dict]:
    """Median wall time of up to ``repeats`` runs (fewer once they add up to ``max_seconds``), and the last output."""
    samples: list[float] = []
    out: dict = {}
    while len(samples) < repeats and sum(samples) < max_seconds:
        started = time.perf_counter()
        out = run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), out


def crossover(rows: list[dict]) -> int | None:
    """The smallest K from which the GPU is faster at every larger K measured (None if it never is)."""
    winning = None
    for row in rows:
        if row["gpu_s"] < row["process_s"]:
            winning = row["K"] if winning is None else winning
        else:
            winning = None
    return winning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--K", type=int, nargs="+", default=[16, 64, 256, 1024, 4096])
    parser.add_argument("--N", type=int, default=5_000)
    parser.add_argument("--Nx", type=int, default=51)
    parser.add_argument("--Nt", type=int, default=50)
    parser.add_argument("--preset", default="lq")
    parser.add_argument("--workers", type=int, default=16, help="process pool size (CROSSOVER_WORKERS)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=20.0, help="stop repeating a K after this much time")
    parser.add_argument("--budget", type=float, default=float("inf"),
                        help="skip the remaining K once the script has run this many seconds")
    args = parser.parse_args()
    os.environ["CROSSOVER_WORKERS"] = str(args.workers)  # read when the pool starts

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU is visible here: run this on a GPU host")
    began = time.perf_counter()

    def problem(k: int) -> CommonNoiseProblem:
        return CommonNoiseProblem(preset=args.preset, K=k, N=args.N, Nx=args.Nx, Nt=args.Nt, seed=0)

    def gpu(k: int) -> dict:
        return solve_torch(problem(k), hjb_device=True, resident=True)

    def pool(k: int) -> dict:
        return solve_parallel(problem(k), backend="process")

    gpu(16), pool(16)  # warm: see the module docstring
    print(f"GPU: {torch.cuda.get_device_name()}; CPU: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, process pool of {args.workers} workers")
    print(f"problem: preset={args.preset}, N={args.N:,}, Nx={args.Nx}, Nt={args.Nt}, default tolerances")
    rows = []
    for k in args.K:
        if time.perf_counter() - began > args.budget:
            print(f"K={k}: skipped, past the {args.budget:.0f} s budget")
            continue
        gpu(k)  # a new batch shape: allocator growth, not counted
        gpu_s, gpu_out = seconds(functools.partial(gpu, k), args.repeats, args.max_seconds)
        process_s, process_out = seconds(functools.partial(pool, k), args.repeats, args.max_seconds)
        rows.append({"K": k, "gpu_s": gpu_s, "process_s": process_s,
                     "gpu_iterations": float(np.mean(gpu_out["iterations"])),
                     "process_iterations": float(np.mean(process_out["iterations"]))})
        print(f"K={k}: GPU {gpu_s:.3f} s, process {process_s:.3f} s", flush=True)
    print("\n| K | torch:resident (s) | process, 16 workers (s) | speed-up | mean Picard iterations (GPU / CPU) |"
          .replace("16", str(args.workers)))
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['K']:,} | {row['gpu_s']:.3f} | {row['process_s']:.3f} | {row['process_s'] / row['gpu_s']:.1f}x"
              f" | {row['gpu_iterations']:.1f} / {row['process_iterations']:.1f} |")
    k = crossover(rows)
    print(f"\ncrossover: the GPU is faster from K = {k} on" if k is not None
          else "\ncrossover: the GPU was not faster at the largest K measured")


if __name__ == "__main__":
    main()
