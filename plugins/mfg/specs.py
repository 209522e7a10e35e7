"""The SolverSpec of each MFG solver: implementations, features, ladders, memory.

Implementations import their backend modules on first use, so listing the
solvers costs neither numba's nor torch's import.
"""

from __future__ import annotations

import numpy as np

from core import SolverSpec
from plugins.mfg.problem import FPProblem

# -- mfg.fp_particle ---------------------------------------------------------------


def _fp_numpy(problem: FPProblem):
    from plugins.mfg.fp.reference import solve_numpy

    return solve_numpy(problem)


def _fp_numba(problem: FPProblem):
    from plugins.mfg.fp.numba_kernel import solve_numba

    return solve_numba(problem)


def _fp_torch(problem: FPProblem):
    from plugins.mfg.fp.torch_kernel import solve_torch

    return solve_torch(problem)


def fp_features(problem: FPProblem) -> dict[str, float]:
    steps = problem.Nt + 1
    direct = problem.kde == "direct"
    return {"particle_steps": float(problem.N * steps), "grid_steps": float(problem.Nx * steps),
            "direct_kde_work": float(problem.N * problem.Nx * steps) if direct else 0.0}


def fp_ladder(quick: bool) -> list[FPProblem]:
    sizes = [1_000, 4_000, 16_000, 64_000, 256_000] if quick else [1_000 * 4**k for k in range(9)]
    return [FPProblem(N=n, Nx=51, Nt=50, seed=k) for k, n in enumerate(sizes)]


def fp_memory(problem: FPProblem, backend: str) -> float:
    grid = 8.0 * (problem.Nt + 1) * problem.Nx
    if backend == "torch":
        return 12.0 * problem.N + 4.0 * (problem.Nt + 1) * 128 * problem.Nx + 4 * grid
    if backend == "numba":
        return 24.0 * problem.N + 3 * grid
    return 64.0 * problem.N + 3 * grid  # numpy temporaries


def fp_summary(problem: FPProblem, outputs) -> str:
    mass = np.asarray(outputs["mass"])
    final = np.asarray(outputs["M"])[-1]
    peak = problem.x[int(np.argmax(final))]
    return (f"N={problem.N:,} particles, {problem.Nt} steps: mass {mass.min():.12f}..{mass.max():.12f}, "
            f"final density peaks at x={peak:.3f}")


FP_PARTICLE = SolverSpec(
    name="mfg.fp_particle",
    problem_type=FPProblem,
    implementations={"numpy": _fp_numpy, "numba": _fp_numba, "torch": _fp_torch},
    features=fp_features,
    size_axis="N",
    ladder=fp_ladder,
    memory=fp_memory,
    default_problem=lambda: FPProblem(N=50_000),
    summarize=fp_summary,
    description="forward Fokker-Planck: Euler-Maruyama particles and KDE density on the grid",
)


def all_specs() -> list[SolverSpec]:
    return [FP_PARTICLE]
