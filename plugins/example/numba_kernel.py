"""Numba kernel of the random-walk example: one thread-parallel loop over walkers.

Numba's own ``np.random`` keeps one stream per thread, so its results would
change with the thread count. Instead every walker owns a SplitMix64 stream
keyed by (seed, walker index): the answer is the same on 1 or 64 threads.
It is a different stream from NumPy's, so numba agrees with numpy in
distribution, not bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from core.backends.numba_threads import jit
from plugins.example.problem import RandomWalkProblem
from plugins.example.reference import chunk_stats, merge


@jit()
def _splitmix64(state):
    state = state + np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@jit()
def _uniform(state):
    # 53 random bits -> (0, 1]; never 0, so log() below is finite
    state, bits = _splitmix64(state)
    return state, ((bits >> np.uint64(11)) + np.uint64(1)) * (1.0 / 9007199254740992.0)


@jit(parallel=True)
def _walk(n_walkers, n_steps, step_std, drift, key):
    positions = np.empty(n_walkers)
    for w in prange(n_walkers):
        state = key ^ (np.uint64(w) * np.uint64(0x9E3779B97F4A7C15))
        total = 0.0
        step = 0
        while step < n_steps:
            # Marsaglia's polar method: two normals per accepted pair, no sin/cos
            state, u1 = _uniform(state)
            state, u2 = _uniform(state)
            x, y = 2.0 * u1 - 1.0, 2.0 * u2 - 1.0
            radius2 = x * x + y * y
            if radius2 >= 1.0 or radius2 == 0.0:
                continue
            factor = np.sqrt(-2.0 * np.log(radius2) / radius2)
            total += x * factor
            if step + 1 < n_steps:
                total += y * factor
            step += 2
        positions[w] = total * step_std + n_steps * drift
    return positions


def stream_key(seed: int | None) -> np.uint64:
    """A 64-bit key from the problem seed (fresh entropy when the seed is None)."""
    return np.random.SeedSequence(seed).generate_state(1, dtype=np.uint64)[0]


def solve_numba(problem: RandomWalkProblem) -> dict[str, np.ndarray]:
    positions = _walk(problem.n_walkers, problem.n_steps, problem.step_std, problem.drift,
                      stream_key(problem.seed))
    edges = problem.bin_edges()
    stats = [chunk_stats(positions[start:start + count], edges) for start, count in problem.chunks()]
    return merge(stats, edges)
