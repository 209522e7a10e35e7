"""The SolverSpec of each MFG solver: implementations, features, ladders, memory.

Implementations import their backend modules on first use, so listing the
solvers costs neither numba's nor torch's import.
"""

from __future__ import annotations

import numpy as np

from core import SolverSpec
from plugins.mfg.problem import CommonNoiseProblem, FPProblem, HJBProblem, MFGProblem

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
        from plugins.mfg.fp.numba_kernel import all_steps_bytes, runs_all_steps

        histograms = all_steps_bytes(problem) if runs_all_steps(problem) else 0
        return 24.0 * problem.N + 3 * grid + histograms
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
    default_params=lambda: {"N": 50_000},
    summarize=fp_summary,
    description="forward Fokker-Planck: Euler-Maruyama particles and KDE density on the grid",
)


# -- mfg.hjb_fdm ---------------------------------------------------------------------


def _hjb(backend: str):
    def solve(problem: HJBProblem):
        if backend == "numpy":
            from plugins.mfg.hjb.reference import solve_numpy as run
        elif backend == "numba":
            from plugins.mfg.hjb.numba_kernel import solve_numba as run
        else:
            from plugins.mfg.hjb.torch_kernel import solve_torch as run
        return run(problem)

    return solve


def hjb_features(problem: HJBProblem) -> dict[str, float]:
    return {"grid_steps": float(problem.Nx * problem.Nt), "steps": float(problem.Nt)}


def hjb_ladder(quick: bool) -> list[HJBProblem]:
    sizes = [25, 50, 100, 200] if quick else [25, 50, 100, 200, 400, 800]
    return [HJBProblem(Nx=n, Nt=n) for n in sizes]


def hjb_memory(problem: HJBProblem, backend: str) -> float:
    from plugins.mfg.hjb.reference import memory

    return memory(problem, backend)


def hjb_summary(problem: HJBProblem, outputs) -> str:
    U = np.asarray(outputs["U"])
    return (f"U(0, x) in [{U[0].min():.3f}, {U[0].max():.3f}], Newton iterations per step <= "
            f"{int(np.max(outputs['newton_iterations']))}, all converged: {bool(np.all(outputs['converged']))}")


HJB_FDM = SolverSpec(
    name="mfg.hjb_fdm",
    problem_type=HJBProblem,
    implementations={name: _hjb(name) for name in ("numpy", "numba", "torch")},
    features=hjb_features,
    size_axis="Nx",
    ladder=hjb_ladder,
    memory=hjb_memory,
    default_problem=lambda: HJBProblem(Nx=101, Nt=100),
    default_params=lambda: {"Nx": 101, "Nt": 100},
    summarize=hjb_summary,
    description="backward HJB: implicit Euler, Newton with one tridiagonal solve per iteration, Godunov upwind",
)

# -- mfg.fixed_point -----------------------------------------------------------------


def _fixed_point(backend: str):
    def solve(problem: MFGProblem):
        from plugins.mfg.coupling import solve_with

        return solve_with(backend)(problem)

    return solve


def coupled_features(problem: MFGProblem) -> dict[str, float]:
    return {"particle_steps": float(problem.N * problem.Nt), "grid_steps": float(problem.Nx * problem.Nt)}


def fixed_point_ladder(quick: bool) -> list[MFGProblem]:
    sizes = [1_000, 3_000, 10_000, 30_000] if quick else [1_000, 3_000, 10_000, 30_000, 100_000, 300_000]
    return [MFGProblem(preset="lq", N=n, Nt=30) for n in sizes]


def coupled_memory(problem: MFGProblem, backend: str) -> float:
    return fp_memory(FPProblem(**problem.model_fields()), backend) + 16.0 * (problem.Nt + 1) * problem.Nx


def fixed_point_summary(problem: MFGProblem, outputs) -> str:
    history = np.asarray(outputs["history"])
    last = history[-1] if len(history) else [np.nan] * 4
    return (f"{'converged' if bool(outputs['converged']) else 'NOT converged'} after "
            f"{int(outputs['iterations'])} iterations (relative L2 change U {last[1]:.1e}, M {last[3]:.1e})")


FIXED_POINT = SolverSpec(
    name="mfg.fixed_point",
    problem_type=MFGProblem,
    implementations={name: _fixed_point(name) for name in ("numpy", "numba", "torch")},
    features=coupled_features,
    size_axis="N",
    ladder=fixed_point_ladder,
    memory=coupled_memory,
    default_problem=lambda: MFGProblem(N=20_000),
    default_params=lambda: {"N": 20_000},
    summarize=fixed_point_summary,
    description="the coupled MFG by damped Picard iteration (separate damping for U and M)",
)

# -- mfg.common_noise ----------------------------------------------------------------


def _common_noise(backend: str):
    def solve(problem: CommonNoiseProblem):
        from plugins.mfg import common_noise

        if backend == "process":
            return common_noise.solve_process(problem)
        if backend == "torch":
            return common_noise.solve_torch(problem)
        return common_noise.solve_serial(problem, backend)

    return solve


def common_noise_features(problem: CommonNoiseProblem) -> dict[str, float]:
    return {"path_particle_steps": float(problem.K * problem.N * problem.Nt),
            "path_grid_steps": float(problem.K * problem.Nx * problem.Nt), "paths": float(problem.K)}


def common_noise_ladder(quick: bool) -> list[CommonNoiseProblem]:
    sizes = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 16, 32, 64]
    return [CommonNoiseProblem(preset="lq", K=k, N=2_000, Nt=20, seed=k) for k in sizes]


def common_noise_memory(problem: CommonNoiseProblem, backend: str) -> float:
    per_path = coupled_memory(problem, backend) + 32.0 * (problem.Nt + 1) * problem.Nx
    return per_path * (problem.K if backend == "torch" else 1) + 16.0 * problem.K * (problem.Nt + 1) * problem.Nx


def common_noise_summary(problem: CommonNoiseProblem, outputs) -> str:
    error = float(np.max(outputs["M_mc_error"]))
    return (f"K={problem.K} paths, {int(np.sum(outputs['converged']))} converged; "
            f"max Monte Carlo error of mean M {error:.2e}")


COMMON_NOISE = SolverSpec(
    name="mfg.common_noise",
    problem_type=CommonNoiseProblem,
    implementations={name: _common_noise(name) for name in ("numpy", "numba", "process", "torch")},
    features=common_noise_features,
    size_axis="K",
    ladder=common_noise_ladder,
    memory=common_noise_memory,
    default_problem=lambda: CommonNoiseProblem(preset="lq", K=8, N=5_000),
    default_params=lambda: {"preset": "lq", "K": 8, "N": 5_000},
    summarize=common_noise_summary,
    description="K conditional MFG solves along Ornstein-Uhlenbeck common-noise paths",
)


def all_specs() -> list[SolverSpec]:
    return [FP_PARTICLE, HJB_FDM, FIXED_POINT, COMMON_NOISE]
