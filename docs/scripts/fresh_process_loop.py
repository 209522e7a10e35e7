"""Eight plain ``core.solve`` calls in a fresh process: auto against every fixed backend.

A new user's loop: a fresh Python process, a calibrated store, and
``core.solve(problem)`` called eight times. Each mode (auto, and each
backend named) runs in its own fresh process, three times, interleaved;
the table gives the median total seconds of the eight calls (first-call
one-offs such as numba's import and cache load included, since the user
pays them) and the ratio of auto to the best fixed backend.

    python docs/scripts/fresh_process_loop.py [--solver mfg.fp_particle] [--param N=50000] [--calls 8]

The calibration runs once first, in a private cache directory, unless
``--cache DIR`` names one that is already calibrated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import core
from core.registry import get_solver
from core.solver import problem_from_params
solver, params, backend, calls = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
spec = get_solver(solver)
problem = problem_from_params(spec, params)
used, started = [], time.perf_counter()
for _ in range(calls):
    used.append(core.solve(problem, backend=backend, solver=solver).backend)
print(json.dumps({"seconds": time.perf_counter() - started, "used": used}))
"""


def run(mode: str, args: argparse.Namespace, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, args.solver, json.dumps(args.params), mode, str(args.calls)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solver", default="mfg.fp_particle")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", help="an already calibrated CROSSOVER_CACHE_DIR")
    args = parser.parse_args()
    args.params = dict(p.split("=", 1) for p in args.param) or {"N": "50000"}
    env = dict(os.environ, CROSSOVER_CACHE_DIR=args.cache or tempfile.mkdtemp(prefix="crossover-loop-"))
    import core
    from core.costmodel.calibrate import runnable_implementations
    from core.costmodel.store import fingerprint
    from core.registry import get_solver

    if not args.cache:
        subprocess.run([sys.executable, "-m", "core.cli", "calibrate", args.solver], env=env, check=True,
                       capture_output=True)
    spec = get_solver(args.solver)
    backends = sorted({key.split(":")[0] for key in runnable_implementations(spec)})
    modes = ["auto", *backends]
    totals: dict[str, list[float]] = {mode: [] for mode in modes}
    used: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for mode in modes:
            result = run(mode, args, env)
            totals[mode].append(result["seconds"])
            used[mode] = result["used"]
    medians = {mode: statistics.median(values) for mode, values in totals.items()}
    best = min(backends, key=medians.get)
    machine = fingerprint()
    print(f"{args.solver} {args.params}, {args.calls} calls per fresh process, median of {args.repeats}; "
          f"{machine['cpu']}, {machine['cores']} cores, {', '.join(machine['gpus']) or 'no GPU'}")
    print("| mode | total s (median) | runs | backends used (last run) |")
    print("| --- | --- | --- | --- |")
    for mode in modes:
        runs = ", ".join(f"{s:.3f}" for s in totals[mode])
        print(f"| {mode} | {medians[mode]:.3f} | {runs} | {' '.join(used[mode])} |")
    print(f"auto / best fixed ({best}) = {medians['auto'] / medians[best]:.2f}")
    del core


if __name__ == "__main__":
    main()
