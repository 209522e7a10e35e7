"""Particle-steps per second of the FP solver on each backend, side by side.

    python docs/scripts/fp_throughput.py --N 10000000 --Nx 101 --Nt 100 --backends torch numba

Every backend solves the same problem (towel_beach, a smooth given U) once
to warm up (JIT, CUDA context, Triton compile), then ``--repeats`` times;
the median is reported as particle-steps per second, N * Nt / seconds, and
the ratio of each backend to the first one named. Run on the machine you
quote, and name it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from core.costmodel.calibrate import median_seconds
from plugins.mfg.problem import FPProblem


def problem(n: int, nx: int, nt: int, kde: str) -> FPProblem:
    base = FPProblem(N=n, Nx=nx, Nt=nt, kde=kde)
    u = 0.2 * np.outer(base.T - base.t, np.cos(2 * np.pi * base.x))
    return FPProblem(N=n, Nx=nx, Nt=nt, kde=kde, U=u)


def runner(backend: str, p: FPProblem):
    if backend == "numpy":
        from plugins.mfg.fp.reference import solve_numpy

        return lambda: solve_numpy(p)
    if backend == "numba":
        from plugins.mfg.fp.numba_kernel import solve_numba

        return lambda: solve_numba(p)
    from plugins.mfg.fp.torch_kernel import solve_torch

    path = backend.split(":")[1] if ":" in backend else "auto"
    return lambda: {k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in solve_torch(p, path=path).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--N", type=int, default=10_000_000)
    parser.add_argument("--Nx", type=int, default=101)
    parser.add_argument("--Nt", type=int, default=100)
    parser.add_argument("--kde", default="binned")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=["torch", "numba"],
                        help="numpy, numba, torch, torch:fused, torch:eager")
    args = parser.parse_args()
    p = problem(args.N, args.Nx, args.Nt, args.kde)
    rows = []
    for backend in args.backends:
        seconds = median_seconds(runner(backend, p), args.repeats)
        rows.append({"backend": backend, "seconds": seconds, "particle_steps_per_s": args.N * args.Nt / seconds})
    for row in rows:
        row["ratio_to_first"] = rows[0]["seconds"] / row["seconds"]
        print(f"{row['backend']:>12}: {row['seconds']:.4f} s, {row['particle_steps_per_s']:.3e} particle-steps/s, "
              f"{rows[0]['backend']} / this = {row['ratio_to_first']:.2f}")
    print(json.dumps({"N": args.N, "Nx": args.Nx, "Nt": args.Nt, "kde": args.kde, "rows": rows}))


if __name__ == "__main__":
    main()
