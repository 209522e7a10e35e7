"""The ``numpy`` backend: the reference every other backend is checked against."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from core.backend import Availability, Backend, host_free_memory


def _describe() -> dict[str, Any]:
    info: dict[str, Any] = {"device": "cpu", "numpy": np.__version__, "cores": os.cpu_count()}
    try:
        from threadpoolctl import threadpool_info

        blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if blas:
            info["blas"] = f"{blas[0].get('internal_api')} ({blas[0].get('num_threads')} threads)"
    except ImportError:
        pass
    return info


BACKEND = Backend(
    name="numpy",
    summary="NumPy/SciPy reference, single process",
    probe=lambda: Availability(True),
    describe=_describe,
    simplicity=0,
    free_memory=host_free_memory,
)
