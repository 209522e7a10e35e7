"""The SolverSpec of each MFG solver: implementations, size spaces, features, memory.

Every implementation is a :class:`core.solver.lazy` binding, so listing the
solvers costs neither numba's nor torch's import. Variants of one device
(``numba:fused`` and ``numba:steps``, ``torch:hjb_host`` and
``torch:hjb_device``) are separate implementations that the cost model
measures and chooses between; what a variant cannot run at all is its
``supports`` answer, what does not fit is its memory estimate. No size rule
picks between them here.
"""

from __future__ import annotations

import numpy as np

from core.formatting import with_error
from core.solver import SizeSpace, SolverSpec, lazy
from plugins.mfg import triton_keys, work
from plugins.mfg.fp.common import all_steps_unsupported
from plugins.mfg.fp.torch_kernel import fused_unsupported
from plugins.mfg.hjb.torch_kernel import fused_unsupported as hjb_fused_unsupported
from plugins.mfg.problem import PRESETS, CommonNoiseProblem, FPProblem, HJBProblem, MFGProblem

# The coupled solvers' convergence tolerances, a decade either side of the defaults (rtol 1e-3, atol 1e-4,
# the middle of each log range). They move the work only through the Picard iterations a solve runs,
# which each solve reports (work_done), so the models price the iterations really run.
PICARD_TOLERANCES = {"rtol": (1e-4, 1e-2), "atol": (1e-5, 1e-3)}

# -- mfg.fp_particle ---------------------------------------------------------------


def fp_space(quick: bool) -> SizeSpace:
    # Every preset: a user picks one, and with it the boundary, which moves the numpy reference's cost of
    # a particle step by about a third (the periodic_particle_steps feature prices it). The KDE method and the
    # bandwidth rule stay at their defaults: the direct KDE's O(N Nx) work per step would put the top of
    # the space out of reach, and Silverman's rule closes the all-steps kernels.
    # The quick top keeps the numpy reference near 0.3 s a sample on a 2-core machine.
    if quick:
        return SizeSpace(ranges={"N": (500, 50_000), "Nx": (21, 201), "Nt": (5, 100)},
                         choices={"preset": list(PRESETS)})
    return SizeSpace(ranges={"N": (500, 2_000_000), "Nx": (21, 401), "Nt": (5, 200)},
                     choices={"preset": list(PRESETS)})


def fp_supports(problem: FPProblem, implementation: str) -> str:
    if implementation == "numba:fused":
        return all_steps_unsupported(problem)
    if implementation == "torch:fused":
        return fused_unsupported(problem)
    return ""


# -- one-line summaries ----------------------------------------------------------------
# Monte Carlo answers are printed with their standard errors (core.formatting.with_error), never as the
# argmax of a density or a residual near the tolerance: two correct runs then agree within the digits shown.

MASS_TOLERANCE = 1e-9


def mass_text(mass) -> str:
    """``mass 1`` when every time step holds unit mass to 1e-9 (the KDE normalises it), else the range."""
    mass = np.asarray(mass, dtype=float)
    if mass.size and np.all(np.abs(mass - 1.0) <= MASS_TOLERANCE):
        return "mass 1 (within 1e-9)"
    return f"mass {np.min(mass):.6f}..{np.max(mass):.6f}"


def density_moments(problem, density) -> tuple[float, float]:
    """Mean and standard deviation of a density on the problem's grid (its quadrature weights)."""
    weights = problem.weights() * np.asarray(density, dtype=float)
    total = weights.sum()
    mean = float(weights @ problem.x / total)
    return mean, float(np.sqrt(max(weights @ (problem.x - mean) ** 2 / total, 0.0)))


def spread_text(mean: float, std: float, mean_error: float, std_error: float) -> str:
    return f"mean {with_error(mean, mean_error)}, std {with_error(std, std_error)}"


def fp_summary(problem: FPProblem, outputs) -> str:
    """Mass, and the particles' mean and spread at T with their standard errors (std/sqrt(N), std/sqrt(2N))."""
    mean, variance = np.asarray(outputs["moments"], dtype=float)[-1]
    std = float(np.sqrt(max(variance, 0.0)))
    return (f"N={problem.N:,} particles, {problem.Nt} steps: {mass_text(outputs['mass'])}; at T: "
            f"{spread_text(float(mean), std, std / np.sqrt(problem.N), std / np.sqrt(2.0 * problem.N))}")


FP_PARTICLE = SolverSpec(
    name="mfg.fp_particle",
    problem_type=FPProblem,
    implementations={
        "numpy": lazy("plugins.mfg.fp.reference", "solve_numpy"),
        "numba:fused": lazy("plugins.mfg.fp.numba_kernel", "solve_particles", fused=True),
        "numba:steps": lazy("plugins.mfg.fp.numba_kernel", "solve_particles", fused=False),
        "torch:fused": lazy("plugins.mfg.fp.torch_kernel", "solve_torch", fused=True),
        "torch:eager": lazy("plugins.mfg.fp.torch_kernel", "solve_torch", fused=False),
    },
    features=work.fp_features,
    compile_key=triton_keys.fp_compile_key,  # Triton compiles the all-steps kernel per key (triton_keys)
    compile_cached=triton_keys.CACHED_ON_DISK,
    size_axis="N",
    space=fp_space,
    supports=fp_supports,
    memory=work.fp_memory,
    default_problem=lambda: FPProblem(N=50_000),
    default_params=lambda: {"N": 50_000},
    summarize=fp_summary,
    description="forward Fokker-Planck: Euler-Maruyama particles and KDE density on the grid",
    version="1",  # 1: every preset in the space, periodic_particle_steps
)


# -- mfg.hjb_fdm ---------------------------------------------------------------------


def hjb_space(quick: bool) -> SizeSpace:
    # newton_tol moves the Newton iterations per step (2 to 6 over this range); newton_max caps them, and
    # from 4 up it rarely binds (see work.expected_newton_iterations)
    newton = {"newton_tol": (1e-13, 1e-7), "newton_max": (4, 60)}
    if quick:
        return SizeSpace(ranges={"Nx": (21, 201), "Nt": (10, 100), **newton}, choices={"preset": list(PRESETS)})
    return SizeSpace(ranges={"Nx": (21, 801), "Nt": (10, 400), **newton}, choices={"preset": list(PRESETS)})


def hjb_supports(problem: HJBProblem | MFGProblem, implementation: str) -> str:
    """The Triton HJB (``torch:fused``, and the coupled solvers' ``torch:hjb_fused``) needs CUDA and Triton."""
    if implementation in ("torch:fused", "torch:hjb_fused"):
        return hjb_fused_unsupported(problem)
    return ""


def hjb_summary(problem: HJBProblem, outputs) -> str:
    U = np.asarray(outputs["U"])
    return (f"U(0, x) in [{U[0].min():.3f}, {U[0].max():.3f}], Newton iterations per step <= "
            f"{int(np.max(outputs['newton_iterations']))}, all converged: {bool(np.all(outputs['converged']))}")


HJB_FDM = SolverSpec(
    name="mfg.hjb_fdm",
    problem_type=HJBProblem,
    implementations={
        "numpy": lazy("plugins.mfg.hjb.reference", "solve_numpy"),
        "numba": lazy("plugins.mfg.hjb.numba_kernel", "solve_numba"),
        "torch": lazy("plugins.mfg.hjb.torch_kernel", "solve_torch"),
        "torch:fused": lazy("plugins.mfg.hjb.torch_kernel", "solve_torch", fused=True),
    },
    features=work.hjb_features,
    work_done=work.hjb_work_done,
    compile_key=triton_keys.hjb_compile_key,
    compile_cached=triton_keys.CACHED_ON_DISK,
    size_axis="Nx",
    space=hjb_space,
    supports=hjb_supports,
    memory=work.hjb_memory,
    default_problem=lambda: HJBProblem(Nx=101, Nt=100),
    default_params=lambda: {"Nx": 101, "Nt": 100},
    summarize=hjb_summary,
    description="backward HJB: implicit Euler, Newton with one tridiagonal solve per iteration, Godunov upwind",
    version="1",  # 1: Newton iterations as features, newton_tol and newton_max in the space
)

# -- mfg.fixed_point -----------------------------------------------------------------


def fixed_point_space(quick: bool) -> SizeSpace:
    if quick:
        return SizeSpace(ranges={"N": (500, 20_000), "Nx": (21, 101), "Nt": (5, 40), "max_iter": (2, 8),
                                 **PICARD_TOLERANCES}, choices={"preset": list(PRESETS)})
    return SizeSpace(ranges={"N": (500, 300_000), "Nx": (21, 201), "Nt": (5, 100), "max_iter": (2, 20),
                             **PICARD_TOLERANCES}, choices={"preset": list(PRESETS)})


def fixed_point_summary(problem: MFGProblem, outputs) -> str:
    """Convergence, and the density's mean and spread at T.

    The errors are those of one N-particle sample (std/sqrt(N)); the final
    density is a damped average of the iterates' samples, no noisier than one.
    """
    mean, std = density_moments(problem, np.asarray(outputs["M"])[-1])
    n = float(problem.N)
    return (f"{'converged' if bool(outputs['converged']) else 'NOT converged'} after "
            f"{int(outputs['iterations'])} Picard iterations; density at T: "
            f"{spread_text(mean, std, std / np.sqrt(n), std / np.sqrt(2.0 * n))}")


FIXED_POINT = SolverSpec(
    name="mfg.fixed_point",
    problem_type=MFGProblem,
    implementations={
        "numpy": lazy("plugins.mfg.coupling", "solve_fixed_point", steps="numpy"),
        "numba": lazy("plugins.mfg.coupling", "solve_fixed_point", steps="numba"),
        "torch:hjb_host": lazy("plugins.mfg.coupling", "solve_fixed_point", steps="torch:hjb_host"),
        "torch:hjb_device": lazy("plugins.mfg.coupling", "solve_fixed_point", steps="torch:hjb_device"),
        "torch:hjb_fused": lazy("plugins.mfg.coupling", "solve_fixed_point", steps="torch:hjb_fused"),
    },
    features=work.fixed_point_features,
    work_done=work.fixed_point_work_done,
    compile_key=triton_keys.coupled_compile_key,
    compile_cached=triton_keys.COUPLED_CACHED_ON_DISK - {"torch:resident"},  # a common-noise variant only
    size_axis="N",
    space=fixed_point_space,
    supports=hjb_supports,
    memory=work.fixed_point_memory,
    default_problem=lambda: MFGProblem(N=20_000),
    default_params=lambda: {"N": 20_000},
    summarize=fixed_point_summary,
    description="the coupled MFG by damped Picard iteration (separate damping for U and M)",
    version="1",  # 1: rtol and atol in the space (calibration ran every iteration before)
)

# -- mfg.common_noise ----------------------------------------------------------------


def common_noise_space(quick: bool) -> SizeSpace:
    # kappa and noise, the common noise's physics, cost nothing; the quantiles' summary is negligible
    if quick:
        return SizeSpace(ranges={"K": (1, 8), "N": (300, 5_000), "Nx": (21, 61), "Nt": (5, 30), "max_iter": (2, 5),
                                 **PICARD_TOLERANCES}, choices={"preset": list(PRESETS)})
    return SizeSpace(ranges={"K": (1, 64), "N": (300, 50_000), "Nx": (21, 101), "Nt": (5, 60), "max_iter": (2, 10),
                             **PICARD_TOLERANCES}, choices={"preset": list(PRESETS)})


def common_noise_supports(problem: CommonNoiseProblem, implementation: str) -> str:
    """``torch:resident`` keeps the fixed point on the device, so it needs both Triton kernels, HJB and FP."""
    if implementation == "torch:resident":
        return fused_unsupported(problem) or hjb_fused_unsupported(problem)
    return hjb_supports(problem, implementation)


def common_noise_summary(problem: CommonNoiseProblem, outputs) -> str:
    """Paths converged, and the path-averaged density's mean and spread at T with a bound on their error.

    ``M_mc_error`` is the standard error over paths at each grid point; the
    standard error of a weighted sum is at most the weighted sum of the
    points' errors (the triangle inequality), which bounds the mean's. The
    spread's error is bounded the same way, from the second moment.
    """
    final, error = np.asarray(outputs["M_mean"])[-1], np.asarray(outputs["M_mc_error"])[-1]
    mean, std = density_moments(problem, final)
    weights = problem.weights()
    mean_error = float(weights @ (np.abs(problem.x - mean) * error))
    std_error = float(weights @ ((problem.x - mean) ** 2 * error)) / (2 * std) if std > 0 else np.inf
    return (f"K={problem.K} paths, {int(np.sum(outputs['converged']))}/{problem.K} converged; mean density at T: "
            f"{spread_text(mean, std, mean_error, std_error)}")


COMMON_NOISE = SolverSpec(
    name="mfg.common_noise",
    problem_type=CommonNoiseProblem,
    implementations={
        "numpy": lazy("plugins.mfg.common_noise", "solve_serial", steps="numpy"),
        "numba": lazy("plugins.mfg.common_noise", "solve_serial", steps="numba"),
        "torch:hjb_host": lazy("plugins.mfg.common_noise", "solve_torch", hjb_device=False),
        "torch:hjb_device": lazy("plugins.mfg.common_noise", "solve_torch", hjb_device=True),
        "torch:hjb_fused": lazy("plugins.mfg.common_noise", "solve_torch", hjb_device=True, fused_hjb=True),
        "torch:resident": lazy("plugins.mfg.common_noise", "solve_torch", hjb_device=True, resident=True),
    },
    parallel=lazy("plugins.mfg.common_noise", "solve_parallel"),
    parallel_tasks=lambda problem: float(problem.K),
    span_feature="path_particle_steps",
    features=work.common_noise_features,
    work_done=work.common_noise_work_done,
    compile_key=triton_keys.coupled_compile_key,
    compile_cached=triton_keys.COUPLED_CACHED_ON_DISK,
    size_axis="K",
    space=common_noise_space,
    supports=common_noise_supports,
    memory=work.common_noise_memory,
    default_problem=lambda: CommonNoiseProblem(preset="lq", K=8, N=5_000),
    default_params=lambda: {"preset": "lq", "K": 8, "N": 5_000},
    summarize=common_noise_summary,
    description="K conditional MFG solves along Ornstein-Uhlenbeck common-noise paths",
    version="1",  # 1: rtol and atol in the space (calibration ran every iteration before)
)


def all_specs() -> list[SolverSpec]:
    return [FP_PARTICLE, HJB_FDM, FIXED_POINT, COMMON_NOISE]
