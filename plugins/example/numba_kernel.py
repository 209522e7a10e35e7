"""Numba kernel of the random-walk example: one thread-parallel loop over walkers.

Every walker owns a stream of :mod:`core.backends.numba_random` keyed by
(seed, walker index): the answer is the same on 1 or 64 threads. It is a
different stream from NumPy's, so numba agrees with numpy in distribution,
not bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from core.backends.numba_random import normal_pair, stream_keys
from core.backends.numba_threads import jit, threads_at_most
from plugins.example.problem import RandomWalkProblem
from plugins.example.reference import chunk_stats, merge


@jit(parallel=True)
def _walk(n_walkers, n_steps, step_std, drift, keys):
    positions = np.empty(n_walkers)
    for w in prange(n_walkers):
        state = keys[w]
        total = 0.0
        for step in range(0, n_steps, 2):
            state, z0, z1 = normal_pair(state)
            total += z0
            if step + 1 < n_steps:
                total += z1
        positions[w] = total * step_std + n_steps * drift
    return positions


def solve_numba(problem: RandomWalkProblem) -> dict[str, np.ndarray]:
    keys = stream_keys(problem.seed, problem.n_walkers)
    with threads_at_most(problem.n_walkers):  # each walker has its own stream: any thread count, same answer
        positions = _walk(problem.n_walkers, problem.n_steps, problem.step_std, problem.drift, keys)
    edges = problem.bin_edges()
    stats = [chunk_stats(positions[start:start + count], edges) for start, count in problem.chunks()]
    return merge(stats, edges)
