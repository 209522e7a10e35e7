"""What every FP backend shares: the drift table, how particles start, what all-steps kernels can do.

The drift is computed once on the grid, ``alpha = -lam * dU/dx``, and each
backend interpolates it linearly at the particles. Initial positions are
drawn from ``m0`` read as a piecewise-constant density on the cells around
the nodes (half cells at reflecting walls), so every backend starts from the
same law.
"""

from __future__ import annotations

import numpy as np

from plugins.mfg.problem import MFGModel


def all_steps_unsupported(problem: MFGModel) -> str:
    """Why a kernel that runs every time step in one pass cannot solve ``problem`` ("" when it can).

    Such a kernel (numba's all-steps kernel, the Triton kernel) carries each
    particle from the first step to the last and bins it as it goes, so no
    step's particle set ever exists as a whole: the direct KDE (a sum over
    all particles per grid point) and Silverman's rule (their quartiles) need
    exactly that. A capability, not a size rule: these kernels never run
    such problems, whatever their size.
    """
    if problem.kde != "binned":
        return f"kde={problem.kde!r} needs every step's particles at once; the all-steps kernel bins them on the fly"
    if problem.bandwidth == "silverman":
        return "bandwidth='silverman' needs every step's particle quartiles; the all-steps kernel keeps only sums"
    return ""


def drift_table(problem: MFGModel, U: np.ndarray) -> np.ndarray:
    """-lam * dU/dx on the grid, (Nt+1, Nx): central differences, wrapped when periodic."""
    if problem.boundary == "periodic":
        gradient = (np.roll(U, -1, axis=1) - np.roll(U, 1, axis=1)) / (2 * problem.dx)
    else:
        gradient = np.gradient(U, problem.dx, axis=1, edge_order=1)
    return -problem.lam * gradient


def cells(problem: MFGModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cumulative probability, left edge, width) of the cell around each node."""
    x, dx = problem.x, problem.dx
    left = x - dx / 2
    width = np.full(problem.Nx, dx)
    if problem.boundary == "reflecting":
        left[0], width[0], width[-1] = x[0], dx / 2, dx / 2
    probability = problem.m0 * problem.weights()
    cumulative = np.cumsum(probability)
    cumulative /= cumulative[-1]
    return cumulative, left, width


def initial_positions(problem: MFGModel, u_cell: np.ndarray, u_offset: np.ndarray) -> np.ndarray:
    """Positions from two arrays of uniforms: one picks the cell, one the place inside it."""
    cumulative, left, width = cells(problem)
    cell = np.minimum(np.searchsorted(cumulative, u_cell, side="right"), problem.Nx - 1)
    positions = left[cell] + width[cell] * u_offset
    if problem.boundary == "periodic":
        positions = problem.xmin + np.mod(positions - problem.xmin, problem.length)
    return positions


def apply_boundary(positions: np.ndarray, problem: MFGModel) -> np.ndarray:
    """Wrap (periodic) or reflect at the walls, in place where possible."""
    if problem.boundary == "periodic":
        return problem.xmin + np.mod(positions - problem.xmin, problem.length)
    # reflection about both walls is a fold with period 2L
    shifted = np.mod(positions - problem.xmin, 2 * problem.length)
    return problem.xmin + np.where(shifted > problem.length, 2 * problem.length - shifted, shifted)


def interpolate(table_row: np.ndarray, positions: np.ndarray, problem: MFGModel) -> np.ndarray:
    """Linear interpolation of a grid function at the particles."""
    s = (positions - problem.xmin) / problem.dx
    left = np.floor(s).astype(np.int64)
    frac = s - left
    if problem.boundary == "periodic":
        return (1 - frac) * table_row[np.mod(left, problem.Nx)] + frac * table_row[np.mod(left + 1, problem.Nx)]
    left = np.clip(left, 0, problem.Nx - 2)
    frac = np.clip(s - left, 0.0, 1.0)
    return (1 - frac) * table_row[left] + frac * table_row[left + 1]
