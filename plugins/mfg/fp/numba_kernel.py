"""Numba FP solver: fused particle steps (drift, noise, boundary, binning).

The loop over particles runs in parallel chunks; each chunk writes its own
histogram rows, so no two threads ever add to the same bin and the result
does not depend on the thread count. Two kernels compute the same thing,
and each is an implementation of its own (``numba:fused``, ``numba:steps``)
that the cost model measures and chooses between:

- the all-steps kernel (``fused=True``): one call runs every time step,
  each pair of particles going through all steps while it sits in
  registers, into (chunks, steps, Nx) histograms. The particles cross
  memory once per solve instead of once per step and Python is entered once
  instead of Nt times, at the price of holding every step's histograms
  (:func:`plugins.mfg.fp.layout.all_steps_bytes`, which the memory
  estimate counts). It cannot run the direct KDE or Silverman's rule
  (:func:`plugins.mfg.fp.common.all_steps_unsupported`).
- the step-by-step kernel (``fused=False``): one call per step; it runs
  every problem.

Both add the same numbers in the same order and agree bit for bit. Each
particle owns a SplitMix64 stream keyed by (seed, particle), so numba agrees
with numpy in distribution, not bit for bit. The Gaussian smoothing and the
bandwidth rule are the shared ones in :mod:`plugins.mfg.kde`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from core.backends.numba_random import normal_pair, stream_keys
from core.backends.numba_threads import jit, threads_at_most
from plugins.mfg import kde
from plugins.mfg.fp import layout
from plugins.mfg.fp.common import all_steps_unsupported, drift_table, initial_positions
from plugins.mfg.problem import MFGModel

_PERIODIC, _REFLECTING = 0, 1


@jit(error_model="numpy")
def _cell(x, xmin, dx, nx, boundary):
    """(left node, fraction) of an in-domain position; positions are never below xmin."""
    s = (x - xmin) / dx
    if not s >= 0.0:
        # NaN, from a drift or noise that overflowed: int(NaN) is undefined and would index outside
        # the histogram; node 0 keeps memory safe, and the NaN position shows in the moments (flagged)
        s = 0.0
    left = int(s)
    frac = s - left
    if boundary == 0:
        if left >= nx:
            left -= nx
        return left, frac, left + 1 if left + 1 < nx else 0
    if left > nx - 2:
        left = nx - 2
    frac = min(max(s - left, 0.0), 1.0)
    return left, frac, left + 1


@jit(error_model="numpy")
def _place(x, xmin, length, boundary):
    """Wrap or reflect a position back into the domain.

    Without a branch on whether a wall was crossed: where particles cross
    often (wide noise on a small periodic domain) such a branch mispredicts,
    and a particle step then cost up to 1.6x what it costs where they rarely
    do, which no size field predicts. This way every step costs the same.
    """
    y = x - xmin
    if boundary == 0:
        y -= length * math.floor(y / length)
        return xmin + (y if y < length else 0.0)
    # reflecting at both walls is a fold with period 2L
    period = 2.0 * length
    y -= period * math.floor(y / period)
    return xmin + (period - y if y > length else y)


@jit(parallel=True, error_model="numpy")
def _step(positions, states, drift, xmin, dx, length, nx, boundary, dt, noise, mass, moments, move, chunk):
    """Advance every particle one step (unless ``move`` is False) and bin it.

    ``mass[c]`` and ``moments[c]`` are chunk c's private histogram and
    (sum, sum of squares): merged after the loop, never shared in it.
    Particles 2k and 2k+1 share stream k: one polar draw moves both.
    """
    n = positions.size
    chunks = mass.shape[0]
    for c in prange(chunks):
        histogram = np.zeros(nx)
        total = 0.0
        squares = 0.0
        stop = min(n, (c + 1) * chunk)
        for i in range(c * chunk, stop, 2):
            x0 = positions[i]
            x1 = positions[i + 1] if i + 1 < stop else x0
            if move:
                state, z0, z1 = normal_pair(states[i // 2])
                states[i // 2] = state
                x0 = _advance(x0, z0, drift, xmin, dx, length, nx, boundary, dt, noise)
                x1 = _advance(x1, z1, drift, xmin, dx, length, nx, boundary, dt, noise)
                positions[i] = x0
                if i + 1 < stop:
                    positions[i + 1] = x1
            total += x0
            squares += x0 * x0
            _deposit(histogram, x0, xmin, dx, nx, boundary)
            if i + 1 < stop:
                total += x1
                squares += x1 * x1
                _deposit(histogram, x1, xmin, dx, nx, boundary)
        mass[c, :] = histogram
        moments[c, 0] = total
        moments[c, 1] = squares


@jit(parallel=True, error_model="numpy")
def _all_steps(positions, states, drift, xmin, dx, length, nx, boundary, dt, noise, chunk, mass, moments):
    """Every time step, pair by pair: ``mass[c, n]`` and ``moments[c, n]`` are chunk c's at step n.

    Within a chunk the pairs run in order, so each (chunk, step) histogram
    receives the same additions in the same order as in :func:`_step`.
    """
    n = positions.size
    for c in prange(mass.shape[0]):
        stop = min(n, (c + 1) * chunk)
        for i in range(c * chunk, stop, 2):
            second = i + 1 < stop
            x0 = positions[i]
            x1 = positions[i + 1] if second else x0
            state = states[i // 2]
            for step in range(mass.shape[1]):
                if step > 0:  # step n moves particles from t_{n-1} to t_n with the drift of t_{n-1}
                    state, z0, z1 = normal_pair(state)
                    x0 = _advance(x0, z0, drift[step - 1], xmin, dx, length, nx, boundary, dt, noise)
                    x1 = _advance(x1, z1, drift[step - 1], xmin, dx, length, nx, boundary, dt, noise)
                _deposit(mass[c, step], x0, xmin, dx, nx, boundary)
                moments[c, step, 0] += x0
                moments[c, step, 1] += x0 * x0
                if second:
                    _deposit(mass[c, step], x1, xmin, dx, nx, boundary)
                    moments[c, step, 0] += x1
                    moments[c, step, 1] += x1 * x1
            states[i // 2] = state
            positions[i] = x0
            if second:
                positions[i + 1] = x1


@jit(error_model="numpy")
def _advance(x, z, drift, xmin, dx, length, nx, boundary, dt, noise):
    left, frac, right = _cell(x, xmin, dx, nx, boundary)
    a = (1.0 - frac) * drift[left] + frac * drift[right]
    return _place(x + a * dt + noise * z, xmin, length, boundary)


@jit(error_model="numpy")
def _deposit(histogram, x, xmin, dx, nx, boundary):
    left, frac, right = _cell(x, xmin, dx, nx, boundary)
    histogram[left] += 1.0 - frac
    histogram[right] += frac


_STARTS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
_START_BYTES = 16 * 2**20  # the largest starting state kept; four are kept at most


def starting_state(problem) -> tuple[np.ndarray, np.ndarray]:
    """Initial positions and one stream key per pair of particles, as arrays the kernels may overwrite.

    With a seed they are the same at every call, and the fixed point solves
    FP with the same seed at every Picard iteration (common random numbers),
    so they are drawn once and copied after: drawing them took a tenth of a
    20,000-particle solve. Without a seed every call draws anew.
    """
    key = None if problem.seed is None else (
        problem.seed, problem.N, problem.xmin, problem.xmax, problem.Nx, problem.boundary, problem.m0.tobytes())
    if key in _STARTS:
        positions, states = _STARTS[key]
        return positions.copy(), states.copy()
    rng = np.random.default_rng(problem.seed)
    positions = initial_positions(problem, rng.random(problem.N), rng.random(problem.N))
    states = stream_keys(problem.seed, (problem.N + 1) // 2)
    if key is not None and positions.nbytes + states.nbytes <= _START_BYTES:
        if len(_STARTS) >= 4:
            _STARTS.pop(next(iter(_STARTS)))
        _STARTS[key] = (positions.copy(), states.copy())
    return positions, states


def solve_particles(problem, U: np.ndarray | None = None, *, fused: bool) -> dict[str, np.ndarray]:
    """M (Nt+1, Nx) from particles driven by ``U`` (default: the problem's own U).

    ``fused`` takes the all-steps kernel, otherwise one kernel call per step
    (see the module docstring); the caller chooses, by measurement or by
    what the problem needs, never this function.
    """
    if fused and all_steps_unsupported(problem):
        raise ValueError(f"the all-steps numba kernel cannot run this problem: {all_steps_unsupported(problem)}")
    U = problem.U if U is None else U
    # in this process, or in a pool task with idle workers' cores: only the threads the particles can use
    with threads_at_most(layout.threads_worth(problem.N)):
        return _particles(problem, U, fused)


def _particles(problem, U: np.ndarray, fused: bool) -> dict[str, np.ndarray]:
    positions, states = starting_state(problem)
    drift = drift_table(problem, U)
    chunk = layout.chunk_size(problem.N)
    chunks = layout.chunks(problem.N)
    boundary = _PERIODIC if problem.boundary == "periodic" else _REFLECTING
    noise = problem.sigma * math.sqrt(problem.dt)
    steps = problem.Nt + 1
    geometry = (problem.xmin, problem.dx, problem.length, problem.Nx, boundary, problem.dt, noise)
    direct = np.empty((steps, problem.Nx)) if problem.kde == "direct" else None
    if fused:
        mass = np.zeros((chunks, steps, problem.Nx))
        moments = np.zeros((chunks, steps, 2))
        _all_steps(positions, states, drift, *geometry, chunk, mass, moments)
        binned, totals = mass.sum(axis=0), moments.sum(axis=0)
        bandwidths = np.array([_bandwidth(problem, positions, row) for row in totals])
    else:
        mass = np.zeros((chunks, problem.Nx))
        moments = np.zeros((chunks, 2))
        binned, totals, bandwidths = np.empty((steps, problem.Nx)), np.empty((steps, 2)), np.empty(steps)
        for n in range(steps):
            _step(positions, states, drift[max(n - 1, 0)], *geometry, mass, moments, n > 0, chunk)
            binned[n], totals[n] = mass.sum(axis=0), moments.sum(axis=0)
            bandwidths[n] = _bandwidth(problem, positions, totals[n])
            if direct is not None:
                direct[n] = kde.direct_density(positions, bandwidths[n], problem.x, problem.xmin, problem.xmax,
                                               problem.boundary)
    summary = np.array([mean_and_variance(row, problem.N) for row in totals])
    weights = problem.weights()
    # the Gaussian smoothing of every step at once, after the particle loop
    M = direct if direct is not None else (
        kde.smooth_steps(binned / problem.N, bandwidths, problem.dx, problem.boundary) / weights)
    return {"M": M, "bandwidth": bandwidths, "mass": M @ weights, "moments": summary}


def mean_and_variance(totals: np.ndarray, n: int) -> tuple[float, float]:
    """(mean, variance with ddof=1) from (sum, sum of squares)."""
    mean = totals[0] / n
    return mean, max(totals[1] - totals[0] * mean, 0.0) / (n - 1) if n > 1 else 0.0


def _bandwidth(problem: MFGModel, positions: np.ndarray, totals: np.ndarray) -> float:
    """This step's bandwidth from the particles' sums (Silverman also needs their quartiles)."""
    n = problem.N
    std = math.sqrt(max(totals[1] - totals[0] ** 2 / n, 0.0) / (n - 1)) if n > 1 else 0.0
    iqr = 0.0
    if problem.bandwidth == "silverman":
        q75, q25 = np.percentile(positions, [75, 25])
        iqr = float(q75 - q25)
    return kde.bandwidth_from_stats(problem.bandwidth, n, std, iqr)
