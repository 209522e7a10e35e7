"""The FP acceptance benchmark: auto-selected backend vs the numpy/scipy reference, side by side.

    python docs/scripts/fp_speedup.py --N 50000 --Nx 51 --Nt 50

The reference is the original CPU pipeline: NumPy Euler-Maruyama with the
density from scipy.stats.gaussian_kde (``backend="numpy", kde="direct"``).
The contender is ``core.solve(problem)`` with the default binned KDE and
``backend="auto"``, after a quick calibration if this machine has none.
Both run in this process, each timed as the median of ``--repeats`` runs
after a warm-up.
"""

from __future__ import annotations

import argparse
import json

import core
from core.costmodel.calibrate import median_seconds
from plugins.mfg.problem import FPProblem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--N", type=int, default=50_000)
    parser.add_argument("--Nx", type=int, default=51)
    parser.add_argument("--Nt", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    problem = FPProblem(N=args.N, Nx=args.Nx, Nt=args.Nt)
    reference = FPProblem(N=args.N, Nx=args.Nx, Nt=args.Nt, kde="direct")
    plan = core.plan(problem, calibrate=True, expected_calls=float("inf"))
    auto = median_seconds(lambda: core.solve(problem, expected_calls=float("inf")), args.repeats)
    ref = median_seconds(lambda: core.solve(reference, backend="numpy"), max(1, args.repeats // 3))
    print(f"reference numpy+scipy gaussian_kde: {ref:.3f} s; auto ({plan.backend}): {auto:.4f} s; "
          f"speed-up {ref / auto:.1f}x")
    print(json.dumps({"N": args.N, "Nx": args.Nx, "Nt": args.Nt, "reference_s": ref, "auto_s": auto,
                      "auto_backend": plan.backend, "speedup": ref / auto}))


if __name__ == "__main__":
    main()
