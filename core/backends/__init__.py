"""The built-in backends. Each module defines one ``BACKEND`` record.

They are registered by core itself (not through entry points) so that
turning plugin autoload off never leaves crossover with nothing to run on.
"""

from __future__ import annotations

from core.backend import Backend
from core.backends import dask_cluster, numba_threads, numpy_reference, process_pool, torch_gpu


def builtin_backends() -> list[Backend]:
    return [numpy_reference.BACKEND, numba_threads.BACKEND, process_pool.BACKEND, torch_gpu.BACKEND,
            dask_cluster.BACKEND]
