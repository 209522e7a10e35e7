"""The ``numba`` backend: JIT-compiled CPU kernels on Numba's thread pool.

Kernels are written in the plugins with :func:`jit` so that every plugin
gets the same compilation options: an on-disk cache (compiling costs seconds
and is the backend's one-off cost) and ``parallel=True`` only where asked,
because a tiny problem runs faster serially than the thread pool starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from core.backend import Availability, Backend, host_free_memory


def jit(parallel: bool = False, **options: Any) -> Callable:
    """``numba.njit`` with crossover's defaults (cached, fastmath off for reproducibility)."""
    import numba

    return numba.njit(cache=True, parallel=parallel, **options)


def threads() -> int:
    import numba

    return int(numba.get_num_threads())


def _probe() -> Availability:
    if importlib.util.find_spec("numba") is None:
        return Availability(False, "numba is not installed (pip install numba)")
    return Availability(True)


def _describe() -> dict[str, Any]:
    import numba

    info: dict[str, Any] = {"device": "cpu", "numba": numba.__version__, "threads": threads()}
    try:
        info["threading_layer"] = numba.threading_layer()
    except ValueError:  # only known after the first parallel kernel ran
        info["threading_layer"] = "not yet chosen"
    return info


BACKEND = Backend(
    name="numba",
    summary="Numba JIT kernels on CPU threads",
    probe=_probe,
    describe=_describe,
    simplicity=10,
    free_memory=host_free_memory,
)
