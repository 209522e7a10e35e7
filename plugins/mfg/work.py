"""What the MFG solvers' problems cost: the features the cost model is linear in, and memory.

Each implementation's time is modelled as ``t = c0 + sum_i c_i * feature_i``
with ``c_i >= 0`` over the whole size space, every field moving at once. So
each feature counts one kind of work that some implementation pays for in
proportion, whichever field drives it:

- ``particle_steps``: one particle moved and binned, ``N * (Nt+1)``;
- ``periodic_particle_steps``: the same on a periodic domain (zero on a
  reflecting one), where wrapping and binning a particle cost the numpy
  reference about a third more (N = 50,000, Nx = 201: 176-182 ms periodic
  against 133-158 ms reflecting, for every preset alike);
- ``grid_steps``: one grid node at one time level (array passes of the
  FP, Newton updates of the HJB), ``Nx * (Nt+1)``;
- ``steps``: one time level, whatever its size (a Python loop turn, a
  kernel launch);
- ``kernel_work``: one Gaussian weight applied. The binned KDE spreads each
  node's mass over ``2 * half + 1`` nodes, and ``half`` grows with Nx and
  with the bandwidth, so this term moves with N (through the bandwidth) and
  Nx at once; the direct KDE applies one weight per particle, node and image.

The coupled solvers repeat that work once per Picard iteration. How many
iterations a solve takes is not known before it runs (10 to 27 across the
presets at the default tolerances), so their features count ``max_iter``
iterations, the most a solve can take, and their ``work_done`` the
iterations each solve really ran. Their size spaces vary the tolerances
with the other fields a user sets, so the samples show the work at each.
A problem that converges sooner does less work on every backend alike, so
the choice between backends holds while the features are an upper bound.

The HJB's Newton iterations per step are estimated before the solve (see
:func:`expected_newton_iterations`) and counted after it, in the same way.

Nothing here imports numba, torch or Triton: planning must stay cheap.
"""

from __future__ import annotations

import math

import numpy as np

from plugins.mfg import kde
from plugins.mfg.fp.common import all_steps_unsupported
from plugins.mfg.fp.layout import all_steps_bytes, slotted_histogram_bytes
from plugins.mfg.hjb.layout import fused_bytes
from plugins.mfg.problem import CommonNoiseProblem, HJBProblem, MFGModel, MFGProblem

# -- features --------------------------------------------------------------------------


def expected_bandwidth(problem: MFGModel) -> float:
    """The widest KDE bandwidth the solve is likely to use, without running it.

    Free diffusion from ``m0`` adds ``sigma^2 T`` to the particles' variance,
    up to that of the uniform law on the domain, ``L^2/12``, which bounded
    diffusion tends to. A drift that gathers the crowd makes the true spread
    smaller; the estimate only needs the right order, since it sizes a
    kernel's reach.
    """
    if not isinstance(problem.bandwidth, str):
        return float(problem.bandwidth)
    cached = problem.__dict__.get("_expected_bandwidth")
    if cached is None:  # once per problem: each plan asks for it once per implementation (0.2 ms a solve at Nx=31)
        cached = _spread_bandwidth(problem)
        object.__setattr__(problem, "_expected_bandwidth", cached)
    return cached


def _spread_bandwidth(problem: MFGModel) -> float:
    mass = problem.m0 * problem.weights()
    mean = float(np.sum(problem.x * mass))
    variance0 = float(np.sum((problem.x - mean) ** 2 * mass))
    # products, not **: Python's float ** raises OverflowError where * gives inf, which min() handles
    spread = math.sqrt(min(variance0 + problem.sigma * problem.sigma * problem.T, problem.length * problem.length / 12))
    iqr = 1.349 * spread  # a Gaussian's interquartile range, for Silverman's rule
    return kde.bandwidth_from_stats(problem.bandwidth, problem.N, spread, iqr)


def kernel_reach(problem: MFGModel) -> int:
    """Grid nodes one node's mass is spread over by the binned KDE, ``2 * half + 1``."""
    return 2 * kde.half_width(expected_bandwidth(problem), problem.dx) + 1


def periodic_images(problem: MFGModel) -> int:
    """How many periodic copies of the particles the direct KDE sums over (as kde.periodic_shifts, uncounted)."""
    return 2 * math.ceil(kde.TRUNCATION * expected_bandwidth(problem) / problem.length) + 1


def kernel_work(problem: MFGModel) -> float:
    """Gaussian weights applied to build the density at every time level (see the module docstring)."""
    levels = (problem.Nt + 1) * problem.Nx
    if problem.kde == "direct":
        images = periodic_images(problem) if problem.boundary == "periodic" else 3
        return float(levels) * problem.N * images
    return float(levels) * kernel_reach(problem)


def fp_features(problem: MFGModel) -> dict[str, float]:
    steps = problem.Nt + 1
    particle_steps = float(problem.N * steps)
    return {"particle_steps": particle_steps,
            "periodic_particle_steps": particle_steps if problem.boundary == "periodic" else 0.0,
            "grid_steps": float(problem.Nx * steps), "steps": float(steps), "kernel_work": kernel_work(problem)}


def expected_newton_iterations(problem: HJBProblem) -> float:
    """Newton iterations per time step, before the solve: ``log2(-log10(newton_tol))``, in [1, newton_max].

    Newton converges quadratically, doubling its correct digits with each
    iteration, so the count grows like the log of the digits asked for.
    Measured with numba over the three presets, Nx 21-801 and Nt 10-400, the
    mean per step was 2.0-3.2 at newton_tol 1e-4, 2.5-4.4 at 1e-10 (the
    default) and 3.0-5.8 at 1e-14; the rule gives 2.0, 3.3 and 3.8. What a
    solve really ran is its ``hjb_work_done``.
    """
    digits = -math.log10(problem.newton_tol)
    return float(min(problem.newton_max, max(1.0, math.log2(digits) if digits > 1 else 1.0)))


def hjb_features(problem: HJBProblem, newton_iterations: float | None = None) -> dict[str, float]:
    """Newton iterations over every level (``newton_iterations``, all steps together, expected unless given).

    Each iteration updates every node (the residual, the Jacobian, one
    Thomas sweep: ``newton_grid_steps``); a periodic grid solves a second
    tridiagonal system, as Sherman-Morrison turns the cyclic system into two
    Thomas sweeps (``cyclic_newton_grid_steps``, zero on a reflecting grid).
    ``newton_iterations`` prices an iteration's fixed cost (a Python loop
    turn, a torch launch), ``steps`` a level's.
    """
    if newton_iterations is None:
        newton_iterations = problem.Nt * expected_newton_iterations(problem)
    grid = float(problem.Nx * newton_iterations)
    return {"newton_grid_steps": grid, "cyclic_newton_grid_steps": grid if problem.boundary == "periodic" else 0.0,
            "newton_iterations": float(newton_iterations), "steps": float(problem.Nt)}


def hjb_work_done(problem: HJBProblem, outputs) -> dict[str, float]:
    """The features of the Newton iterations a finished solve really ran (its history sample)."""
    return hjb_features(problem, float(np.sum(np.asarray(outputs["newton_iterations"]))))


def fixed_point_features(problem: MFGProblem, iterations: float | None = None) -> dict[str, float]:
    """One FP and one HJB solve per iteration, ``max_iter`` iterations (see the module docstring)."""
    # the HJB's levels are the FP's, so they share grid_steps and steps; its Newton iterations run at the
    # HJB's default tolerance (an MFGProblem sets none), so their count is priced into those features
    cyclic = float(problem.Nx * problem.Nt) if problem.boundary == "periodic" else 0.0
    per_iteration = {**fp_features(problem), "cyclic_grid_steps": cyclic}
    iterations = float(problem.max_iter if iterations is None else iterations)
    return {**{name: iterations * value for name, value in per_iteration.items()}, "iterations": iterations}


def fixed_point_work_done(problem: MFGProblem, outputs) -> dict[str, float]:
    """The features of the iterations a finished solve really ran (its history sample)."""
    return fixed_point_features(problem, float(np.asarray(outputs["iterations"])))


def common_noise_work_done(problem: CommonNoiseProblem, outputs) -> dict[str, float]:
    """Path work summed over the iterations each path ran; batch work over the longest path."""
    iterations = np.asarray(outputs["iterations"], dtype=float).reshape(-1)
    per_iteration = fixed_point_features(problem, 1.0)
    features = {f"path_{name}": float(iterations.sum()) * value for name, value in per_iteration.items()}
    features["grid_steps"] = float(iterations.max()) * per_iteration["grid_steps"]
    features["iterations"] = float(iterations.max())
    return features


def common_noise_features(problem: CommonNoiseProblem) -> dict[str, float]:
    """K conditional fixed points; the batched GPU solver also pays per iteration of the whole batch.

    ``path_*`` features are the fixed point's summed over the K paths. The
    torch solvers run every path's iteration at once, so they pay some work
    per batch iteration whatever K is: ``iterations`` (a launch of the fused
    FP kernel) and ``grid_steps`` (the device HJB's row-by-row sweep).
    """
    per_path = fixed_point_features(problem)
    features = {f"path_{name}": problem.K * value for name, value in per_path.items()}
    features["grid_steps"] = per_path["grid_steps"]
    features["iterations"] = per_path["iterations"]
    return features


# -- memory ----------------------------------------------------------------------------


def _grid_bytes(problem: MFGModel) -> float:
    return 8.0 * (problem.Nt + 1) * problem.Nx


def _smoothing_bytes(problem: MFGModel) -> float:
    """The GPU smoothing's (steps, Nx, 2*half+1) contributions, float64, for every step at once."""
    return 8.0 * kernel_work(problem) if problem.kde == "binned" else 0.0


def _direct_bytes(problem: MFGModel) -> float:
    """The GPU direct KDE's (Nx, particles) temporaries, a chunk of at most 2**20 particles at a time."""
    return 4 * 8.0 * problem.Nx * min(problem.N, 1 << 20) if problem.kde == "direct" else 0.0


def _smoothing_host_bytes(problem: MFGModel, implementation: str) -> float:
    """The host KDE's temporaries (see plugins.mfg.kde).

    numpy builds each step's (Nx, Nx) smoothing matrix from (Nx, reach)
    index and weight arrays; numba smooths every step at once by FFT, with
    (steps, reach) kernels and a few (steps, 2 Nx) complex spectra.
    """
    if problem.kde != "binned":
        return 0.0
    reach, steps = float(kernel_reach(problem)), float(problem.Nt + 1)
    if implementation == "numpy":
        return 8.0 * problem.Nx * problem.Nx + 24.0 * problem.Nx * reach
    return 8.0 * steps * reach + 48.0 * steps * problem.Nx


def fp_memory(problem: MFGModel, implementation: str) -> float:
    """Peak bytes of one FP solve on the implementation's device."""
    grid = _grid_bytes(problem)
    if implementation == "numba:fused":
        return 24.0 * problem.N + 3 * grid + all_steps_bytes(problem) + _smoothing_host_bytes(problem, "numba")
    if implementation == "numba:steps":
        return 24.0 * problem.N + 3 * grid + _smoothing_host_bytes(problem, "numba")
    # per particle, as measured on an H100 at N = 2e6 (torch.cuda.max_memory_allocated), rounded up:
    # drawing the start (two float64 uniforms, int64 cells) peaks at 48 bytes; an eager step's
    # whole-array temporaries (indices in int64, the deposit in float64) at 106
    if implementation == "torch:fused":
        return 56.0 * problem.N + slotted_histogram_bytes(problem, problem.Nt + 1) + 4 * grid + _smoothing_bytes(
            problem)
    if implementation == "torch:eager":
        return (128.0 * problem.N + slotted_histogram_bytes(problem, 1) + 4 * grid + _smoothing_bytes(problem)
                + _direct_bytes(problem))
    return 64.0 * problem.N + 3 * grid + _smoothing_host_bytes(problem, "numpy")  # numpy's whole-array temporaries


def hjb_memory(problem: MFGModel, implementation: str) -> float:
    """The inputs and output on the space-time grid (M, V, f(M), U), plus per-step work arrays.

    torch also holds the per-iteration temporaries of the batched Thomas
    sweep; numpy and numba about a dozen vectors of Nx per step. The Triton
    kernel holds V and M, the source, U and one program's scratch
    (:func:`plugins.mfg.hjb.layout.fused_bytes`).
    """
    per_step = 8.0 * problem.Nx
    if implementation == "torch:fused":
        return 2 * _grid_bytes(problem) + fused_bytes(problem.Nx, problem.Nt, 1)
    return 4 * _grid_bytes(problem) + (40 if implementation.startswith("torch") else 20) * per_step


def _coupled_fp_variant(problem: MFGModel, implementation: str) -> str:
    """The FP kernel a coupled solver runs: the all-steps one wherever the KDE allows (a capability)."""
    if implementation == "numpy":
        return "numpy"
    device = "torch" if implementation.startswith("torch") else "numba"
    if all_steps_unsupported(problem):
        return "torch:eager" if device == "torch" else "numba:steps"
    return f"{device}:fused"


# the mfg.hjb_fdm implementation each coupled GPU variant runs on the device; every other runs numba's
COUPLED_HJB = {"torch:hjb_device": "torch", "torch:hjb_fused": "torch:fused", "torch:resident": "torch:fused"}


def fixed_point_memory(problem: MFGModel, implementation: str) -> float:
    """One FP and one HJB solve, plus the iterates U and M and their damped updates.

    ``torch:resident`` holds the same arrays, on the device only: V, U and
    M of every path, and per iteration the live paths' copies and damped
    updates, about the eight grids counted here beside the kernels' own.
    """
    fp = fp_memory(problem, _coupled_fp_variant(problem, implementation))
    hjb = hjb_memory(problem, COUPLED_HJB.get(implementation, "numba"))
    return fp + hjb + 8 * _grid_bytes(problem)


def common_noise_memory(problem: CommonNoiseProblem, implementation: str) -> float:
    """One path at a time on the CPU (a worker holds one path), plus the K results.

    On the GPU the paths run as batches that fit each device's free memory
    (``common_noise.solve_paths``), so what a device needs is room for one
    path; the K results are kept on the host.
    """
    results = 2 * problem.K * _grid_bytes(problem)
    if implementation.startswith("torch"):
        return fixed_point_memory(problem, implementation)
    serial = implementation if implementation in ("numpy", "numba") else "numba"  # parallel backends run numba
    return fixed_point_memory(problem, serial) + 4 * _grid_bytes(problem) + results
