"""The NumPy reference FP solver: the original CPU pipeline.

Euler-Maruyama in NumPy; the density by ``scipy.stats.gaussian_kde`` when
``kde="direct"`` (its relative ``bw_method`` converted from the absolute
bandwidth), or by NumPy linear binning when ``kde="binned"``. Speed-ups of
the other backends are quoted against this, side by side.
"""

from __future__ import annotations

import math

import numpy as np

from plugins.mfg import kde
from plugins.mfg.fp.common import apply_boundary, drift_table, initial_positions, interpolate
from plugins.mfg.problem import MFGModel


def scipy_density(positions: np.ndarray, h: float, problem: MFGModel) -> np.ndarray:
    """gaussian_kde with absolute bandwidth h, plus periodic or mirror images."""
    from scipy.stats import gaussian_kde

    std = float(np.std(positions, ddof=1))
    if not std > 0:  # gaussian_kde cannot scale a zero-spread sample: use the exact sum
        return kde.direct_density(positions, h, problem.x, problem.xmin, problem.xmax, problem.boundary)
    estimator = gaussian_kde(positions, bw_method=h / std)
    x = problem.x
    if problem.boundary == "periodic":
        return sum(estimator(x - shift) for shift in kde.periodic_shifts(problem.length, h))
    # mirror images about each wall: kde(2*xmin - x) and kde(2*xmax - x)
    return estimator(x) + estimator(2 * problem.xmin - x) + estimator(2 * problem.xmax - x)


def density(positions: np.ndarray, problem: MFGModel) -> tuple[np.ndarray, float]:
    h = kde.bandwidth(problem.bandwidth, positions)
    if problem.kde == "direct":
        return scipy_density(positions, h, problem), h
    return kde.binned_density(positions, h, problem.xmin, problem.dx, problem.weights(), problem.boundary), h


def solve_numpy(problem, U: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """M (Nt+1, Nx) from particles driven by ``U`` (default: the problem's own U)."""
    U = problem.U if U is None else U
    rng = np.random.default_rng(problem.seed)
    drift = drift_table(problem, U)
    positions = initial_positions(problem, rng.random(problem.N), rng.random(problem.N))
    noise = problem.sigma * math.sqrt(problem.dt)
    M = np.empty((problem.Nt + 1, problem.Nx))
    bandwidths = np.empty(problem.Nt + 1)
    moments = np.empty((problem.Nt + 1, 2))
    for n in range(problem.Nt + 1):
        if n > 0:
            positions = positions + interpolate(drift[n - 1], positions, problem) * problem.dt
            positions += noise * rng.standard_normal(problem.N)
            positions = apply_boundary(positions, problem)
        M[n], bandwidths[n] = density(positions, problem)
        moments[n] = positions.mean(), positions.var(ddof=1) if problem.N > 1 else 0.0
    return {"M": M, "bandwidth": bandwidths, "mass": M @ problem.weights(), "moments": moments}
