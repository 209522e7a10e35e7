"""Particle-steps per second of the FP solver on each backend, side by side.

    python docs/scripts/fp_throughput.py --N 10000000 --Nx 101 --Nt 100 --backends torch:fused numba:fused

Every implementation named (a key of ``mfg.fp_particle``: numpy,
numba:fused, numba:steps, torch:fused, torch:eager) solves the same problem
(towel_beach, a smooth given U) once to warm up (JIT, CUDA context, Triton
compile), then ``--repeats`` times, its outputs moved to the host inside
the clock; the median is reported as particle-steps per second,
N * Nt / seconds, and the ratio of each to the first one named. Run on the
machine you quote, and name it.

``--identical`` then solves once more with each and says whether the
outputs are the same bits as the last timed solve's (the problem's seed is
fixed), with the SHA-256 of M, so that two processes can be compared too.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import numpy as np

from core.costmodel.calibrate import median_seconds
from plugins.mfg.problem import FPProblem


def problem(n: int, nx: int, nt: int, kde: str) -> FPProblem:
    base = FPProblem(N=n, Nx=nx, Nt=nt, kde=kde)
    u = 0.2 * np.outer(base.T - base.t, np.cos(2 * np.pi * base.x))
    return FPProblem(N=n, Nx=nx, Nt=nt, kde=kde, U=u)


def runner(key: str, p: FPProblem):
    from plugins.mfg.specs import FP_PARTICLE

    solve = FP_PARTICLE.implementations[key]
    return lambda: {k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in solve(p).items()}


def identical(solve) -> dict:
    """Whether two solves give the same bits in every output, and the SHA-256 of the first M."""
    first, second = solve(), solve()
    same = all(np.array_equal(np.asarray(first[k]), np.asarray(second[k])) for k in first)
    return {"bit_identical": same, "M_sha256": hashlib.sha256(np.ascontiguousarray(first["M"]).tobytes()).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--N", type=int, default=10_000_000)
    parser.add_argument("--Nx", type=int, default=101)
    parser.add_argument("--Nt", type=int, default=100)
    parser.add_argument("--kde", default="binned")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=["torch:fused", "numba:fused"],
                        help="numpy, numba:fused, numba:steps, torch:fused, torch:eager")
    parser.add_argument("--identical", action="store_true",
                        help="solve twice more and say whether the outputs are the same bits")
    args = parser.parse_args()
    p = problem(args.N, args.Nx, args.Nt, args.kde)
    rows = []
    for backend in args.backends:
        seconds = median_seconds(runner(backend, p), args.repeats)
        rows.append({"backend": backend, "seconds": seconds, "particle_steps_per_s": args.N * args.Nt / seconds})
        if args.identical:
            rows[-1].update(identical(runner(backend, p)))
    for row in rows:
        row["ratio_to_first"] = rows[0]["seconds"] / row["seconds"]
        same = f", bit-identical: {row['bit_identical']}, M sha256 {row['M_sha256'][:16]}" if args.identical else ""
        print(f"{row['backend']:>12}: {row['seconds']:.4f} s, {row['particle_steps_per_s']:.3e} particle-steps/s, "
              f"{rows[0]['backend']} / this = {row['ratio_to_first']:.2f}{same}")
    print(json.dumps({"N": args.N, "Nx": args.Nx, "Nt": args.Nt, "kde": args.kde, "rows": rows}))


if __name__ == "__main__":
    main()
