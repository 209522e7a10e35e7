"""A tiny parallel kernel whose only job is to start Numba's thread pool (the backend's start).

Kept in its own module because importing it compiles (or loads from the
on-disk cache) a Numba function; :mod:`core.backends.numba_threads` must
stay importable without paying that.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange


# numba.njit directly, with core.backends.numba_threads.jit's options: that module
# imports this one to start the backend, so this one must not import it back
@numba.njit(cache=True, parallel=True)
def _touch(values):
    total = 0.0
    for i in prange(values.size):
        total += values[i]
    return total


def spin_up_threads() -> None:
    """Run one parallel loop so the threading layer is loaded and its workers exist."""
    _touch(np.ones(64))
