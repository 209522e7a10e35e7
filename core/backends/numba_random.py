"""Counter-based random numbers for Numba kernels, shared by every plugin.

Numba's own ``np.random`` keeps one stream per thread, so a kernel's answer
would depend on the thread count. A SplitMix64 stream per task (a walker, a
pair of particles), keyed by (seed, index), gives the same numbers on 1 or
64 threads. SplitMix64 passes BigCrush; normals come from Marsaglia's polar
method (two per accepted pair, no trigonometry).

Import this module only from kernel modules: it compiles Numba functions.
"""

from __future__ import annotations

import numpy as np

from core.backends.numba_threads import jit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@jit(error_model="numpy")
def splitmix64(state):
    """(next state, 64 random bits)."""
    state = state + np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@jit(error_model="numpy")
def normal_pair(state):
    """(next state, z0, z1): two independent standard normals."""
    while True:
        state, a = splitmix64(state)
        state, b = splitmix64(state)
        u = 2.0 * ((a >> np.uint64(11)) * (1.0 / 9007199254740992.0)) - 1.0
        v = 2.0 * ((b >> np.uint64(11)) * (1.0 / 9007199254740992.0)) - 1.0
        r = u * u + v * v
        if 0.0 < r < 1.0:
            factor = np.sqrt(-2.0 * np.log(r) / r)
            return state, u * factor, v * factor


def stream_keys(seed: int | None, count: int) -> np.ndarray:
    """One 64-bit stream key per task, from the problem's seed (fresh entropy for None)."""
    key = np.random.SeedSequence(seed).generate_state(1, dtype=np.uint64)[0]
    return key ^ (np.arange(count, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03))
