"""Density from particles: ONE bandwidth convention and one smoothing rule for every backend.

- The bandwidth ``h`` is absolute (in units of x). ``"scott"`` means
  ``h = s * N**(-1/5)`` and ``"silverman"`` ``h = 0.9 * min(s, IQR/1.34) *
  N**(-1/5)``, where ``s`` is the particles' standard deviation with
  ``ddof=1`` (as scipy's ``gaussian_kde`` uses). Every backend computes these
  statistics from its own particles with exactly this formula.
- ``binned``: linear binning puts each particle's unit mass on its two
  nearest nodes; a Gaussian of width ``h``, sampled on the grid, normalised to
  sum one and folded at the boundary (wrapped when periodic, mirrored at
  reflecting walls), then spreads each node's mass. Every column of the
  smoothing matrix sums to one, so mass is exact to rounding.
- ``direct``: the exact Gaussian sum over particles, with periodic images or
  mirror images at reflecting walls.
"""

from __future__ import annotations

import math

import numpy as np

TRUNCATION = 6.0  # kernel support in bandwidths; the tail beyond holds < 1e-8 of the mass


def bandwidth_from_stats(rule: float | str, n: int, std: float, iqr: float) -> float:
    """The absolute bandwidth for a rule name or a number (the one convention)."""
    if not isinstance(rule, str):
        return float(rule)
    spread = std if rule == "scott" else min(std, iqr / 1.34) * 0.9
    if not 0 < spread < math.inf:  # all in one place (or NaN, inf from a diverged drift): the other statistic
        spread = max([1e-12] + [s for s in (std, iqr / 1.34) if s < math.inf])
    return spread * n ** (-0.2)


def bandwidth(rule: float | str, positions: np.ndarray) -> float:
    """Bandwidth for NumPy particle positions."""
    if not isinstance(rule, str):
        return float(rule)
    std = float(np.std(positions, ddof=1)) if positions.size > 1 else 0.0
    q75, q25 = np.percentile(positions, [75, 25]) if rule == "silverman" else (0.0, 0.0)
    return bandwidth_from_stats(rule, positions.size, std, float(q75 - q25))


def fold(index: np.ndarray, nx: int, boundary: str) -> np.ndarray:
    """Map node indices outside 0..nx-1 back onto the grid (wrap, or mirror at the walls)."""
    if boundary == "periodic":
        return np.mod(index, nx)
    period = 2 * (nx - 1)
    index = np.mod(index, period)
    return np.where(index > nx - 1, period - index, index)


def half_width(h: float, dx: float) -> int:
    """The kernel's reach in grid nodes: smoothing spreads each node's mass over offsets -half..half."""
    return max(1, math.ceil(TRUNCATION * h / dx))


def smoothing_matrix(h: float, dx: float, nx: int, boundary: str) -> np.ndarray:
    """S with ``mass_smoothed = S @ mass``; each column sums to one (mass is exact)."""
    half = half_width(h, dx)
    offsets = np.arange(-half, half + 1)
    kernel = np.exp(-0.5 * (offsets * dx / h) ** 2)
    kernel /= kernel.sum()
    sources = np.arange(nx)[:, None]
    targets = fold(sources + offsets[None, :], nx, boundary)
    matrix = np.zeros(nx * nx)
    np.add.at(matrix, (targets * nx + sources).ravel(), np.broadcast_to(kernel, targets.shape).ravel())
    return matrix.reshape(nx, nx)


def smooth_steps(mass: np.ndarray, h: np.ndarray, dx: float, boundary: str) -> np.ndarray:
    """:func:`smoothing_matrix` applied to every time step at once: (steps, Nx) mass in and out.

    One kernel width (the widest step's) bounds the offsets; each step's
    kernel is renormalised over them, so every step keeps its mass. Folding
    at the boundary is a circular convolution: on the circle of the period
    (Nx nodes, or the 2(Nx-1) of a grid mirrored at both walls), with each
    step's kernel wrapped onto it, so one FFT per step does the work. Its
    cost no longer grows with the kernel's reach, and it agrees with the
    matrix to rounding (1e-16); the tiny negative values rounding leaves
    where the density is zero are clipped.
    """
    steps, nx = mass.shape
    half = half_width(float(np.max(h)), dx)
    offsets = np.arange(-half, half + 1)
    kernel = np.exp(-0.5 * (offsets[None, :] * dx / h[:, None]) ** 2)
    kernel /= kernel.sum(axis=1, keepdims=True)
    period = nx if boundary == "periodic" else 2 * (nx - 1)
    circle = np.zeros((period, steps))
    places = np.mod(offsets, period)
    # a kernel wider than the period wraps onto itself; within a block of `period` offsets
    # every place is distinct, so each block adds without np.add.at (which is slow per element)
    for start in range(0, offsets.size, period):
        circle[places[start:start + period]] += kernel[:, start:start + period].T
    spectrum = np.fft.rfft(mass, n=period, axis=1) * np.fft.rfft(circle.T, axis=1)
    convolved = np.fft.irfft(spectrum, n=period, axis=1)
    smoothed = convolved[:, :nx].copy()
    if boundary != "periodic":
        # node i of the mirrored grid also receives what landed on its mirror image, 2(Nx-1) - i
        smoothed[:, 1:nx - 1] += convolved[:, period - 1:nx - 1:-1]
    return np.maximum(smoothed, 0.0, out=smoothed)


def linear_binning(positions: np.ndarray, xmin: float, dx: float, nx: int, boundary: str) -> np.ndarray:
    """Mass per node (sums to one): each particle split between its two nearest nodes."""
    s = (positions - xmin) / dx
    left = np.floor(s).astype(np.int64)
    frac = s - left
    if boundary == "periodic":
        left_node, right_node = np.mod(left, nx), np.mod(left + 1, nx)
    else:  # particles sit inside [xmin, xmax]: clamp the last cell's right node
        left = np.clip(left, 0, nx - 2)
        frac = np.clip(s - left, 0.0, 1.0)
        left_node, right_node = left, left + 1
    mass = np.bincount(left_node, weights=1.0 - frac, minlength=nx)
    mass += np.bincount(right_node, weights=frac, minlength=nx)
    return mass / positions.size


def binned_density(positions: np.ndarray, h: float, xmin: float, dx: float, weights: np.ndarray,
                   boundary: str) -> np.ndarray:
    nx = weights.size
    mass = smoothing_matrix(h, dx, nx, boundary) @ linear_binning(positions, xmin, dx, nx, boundary)
    return mass / weights


def periodic_shifts(length: float, h: float) -> list[float]:
    """Shifts by whole periods whose kernels still reach into the domain."""
    reach = math.ceil(TRUNCATION * h / length)
    return [k * length for k in range(-reach, reach + 1)]


def images(positions, xmin: float, xmax: float, h: float, boundary: str) -> list:
    """The particle copies whose kernels reach into the domain (NumPy arrays or torch tensors)."""
    if boundary == "periodic":
        return [positions + shift for shift in periodic_shifts(xmax - xmin, h)]
    return [positions, 2 * xmin - positions, 2 * xmax - positions]


def direct_density(positions: np.ndarray, h: float, x: np.ndarray, xmin: float, xmax: float,
                   boundary: str) -> np.ndarray:
    """The exact Gaussian sum (float64 reference, O(N * Nx))."""
    density = np.zeros_like(x)
    norm = 1.0 / (positions.size * h * math.sqrt(2 * math.pi))
    for copy in images(positions, xmin, xmax, h, boundary):
        for j, xj in enumerate(x):
            density[j] += np.exp(-0.5 * ((xj - copy) / h) ** 2).sum()
    return density * norm
