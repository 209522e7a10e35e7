"""The ``torch_cpu`` backend: PyTorch on this machine's CPU threads.

The core's ``torch`` backend is the GPU and never falls back to the CPU.
A training run of a small model is still worth running on CPU torch (it
is the only CPU implementation of the DotGAT model: NumPy has no autograd,
and rewriting the backward pass by hand for Numba would be a second model
to keep equal to the first). So this plugin registers CPU torch as a
backend of its own, named for what it is, and the cost model measures it
against the GPU like any other.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from core.backend import Availability, Backend, host_free_memory


def _probe() -> Availability:
    if importlib.util.find_spec("torch") is None:
        return Availability(False, "torch is not installed (pip install torch)")
    return Availability(True)


def _describe() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {}
    import torch

    return {"device": "cpu", "torch": torch.__version__, "threads": torch.get_num_threads()}


def start() -> None:
    """Import torch: seconds, paid once per process by whichever solve runs first on this backend."""
    import torch

    torch.zeros(1).sum()


BACKEND = Backend(
    name="torch_cpu",
    summary="PyTorch on the CPU's threads (the ml plugin's)",
    probe=_probe,
    describe=_describe,
    simplicity=45,
    free_memory=host_free_memory,
    start=start,
)
