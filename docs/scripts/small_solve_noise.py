"""How much small solves' times scatter, and whether an idle dask cluster started by this process adds to it.

    python docs/scripts/small_solve_noise.py                       # mfg.common_noise's quick held-out sizes
    python docs/scripts/small_solve_noise.py --rounds 20 --json out.json

Auto-selection between implementations that run within 10-30 % of each
other is only as good as the timings its models are fitted on. This
script times a few small ``mfg.common_noise`` problems (5-15 ms on the
16-core H200 host) on each contender, one run at a time, in interleaved
rounds (round ``r`` of every problem and implementation before round
``r + 1``), in three phases:

1. no dask cluster;
2. a ``local`` dask cluster started and idle (its scheduler and the
   client's event loop run in threads of *this* process, beside the
   in-process implementations);
3. the cluster closed again (so that a drift of the host between phases
   is told apart from the cluster's effect).

Per phase, problem and implementation it prints the median, the best and
the 90th percentile of the single runs, and the spread ``p90 / median``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from core.atomic import atomic_write_text
from core.backends import dask_cluster
from core.costmodel.calibrate import runnable_implementations
from core.costmodel.evaluate import settle
from core.costmodel.store import cpu_model
from core.registry import get_solver
from core.running import run_once
from plugins.mfg.problem import CommonNoiseProblem

# held-out sizes of `crossover evaluate mfg.common_noise` where the contenders ran within 30 % of each other
PROBLEMS = [
    {"K": 2, "N": 366, "Nx": 35, "Nt": 8, "max_iter": 5, "preset": "towel_beach"},
    {"K": 2, "N": 3133, "Nx": 30, "Nt": 17, "max_iter": 2, "preset": "towel_beach"},
    {"K": 5, "N": 1608, "Nx": 30, "Nt": 7, "max_iter": 3, "preset": "crowd"},
    {"K": 1, "N": 499, "Nx": 31, "Nt": 7, "max_iter": 3, "preset": "towel_beach"},
]


def phase(spec, problems: list, keys: list[str], rounds: int, runs: int) -> dict[tuple[int, str], list[float]]:
    """Single-run seconds of each (problem, implementation): ``runs`` in a row per round, ``rounds`` rounds."""
    for problem in problems:
        settle(spec, keys, problem)
    times: dict[tuple[int, str], list[float]] = {(i, key): [] for i in range(len(problems)) for key in keys}
    for _ in range(rounds):
        for i, problem in enumerate(problems):
            for key in keys:
                run_once(spec, key, problem)  # each round's warm-up, as a calibration sample has
                times[(i, key)].extend(run_once(spec, key, problem)[1] for _ in range(runs))
    return times


def summary(times: list[float]) -> dict[str, float]:
    array = np.asarray(times)
    median = float(np.median(array))
    return {"median_ms": 1e3 * median, "best_ms": 1e3 * float(array.min()),
            "p90_ms": 1e3 * float(np.percentile(array, 90)), "spread": float(np.percentile(array, 90)) / median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3, help="timed runs in a row per round")
    parser.add_argument("--implementations", default="numba,torch:hjb_host,process",
                        help="those of them that can run here")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    spec = get_solver("mfg.common_noise")
    keys = [key for key in args.implementations.split(",") if key in runnable_implementations(spec)]
    problems = [CommonNoiseProblem(**params) for params in PROBLEMS]
    phases = {}
    started = time.perf_counter()
    phase(spec, problems, keys, 2, args.runs)  # discarded: the first seconds of a process run slow
    phases["no cluster"] = phase(spec, problems, keys, args.rounds, args.runs)
    dask_cluster.use_scheduler(dask_cluster.LOCAL)
    dask_cluster.start()
    phases["idle local cluster"] = phase(spec, problems, keys, args.rounds, args.runs)
    dask_cluster.shutdown()
    phases["cluster closed"] = phase(spec, problems, keys, args.rounds, args.runs)

    print(f"host: {cpu_model()}, {os.cpu_count()} cores; {args.rounds} rounds of {args.runs} runs; "
          f"{time.perf_counter() - started:.0f} s")
    out = []
    for i, params in enumerate(PROBLEMS):
        print(", ".join(f"{k}={v}" for k, v in params.items()))
        for key in keys:
            cells = []
            for name, times in phases.items():
                row = summary(times[(i, key)])
                out.append({"problem": params, "implementation": key, "phase": name, **row})
                cells.append(f"{name}: {row['median_ms']:6.2f} ms (best {row['best_ms']:6.2f}, "
                             f"p90/median {row['spread']:.2f})")
            print(f"  {key:15s} " + " | ".join(cells))
    print(json.dumps(out))
    if args.json:
        atomic_write_text(args.json, json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
