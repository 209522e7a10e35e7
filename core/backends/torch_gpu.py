"""The ``torch`` backend: PyTorch on a CUDA GPU, or Apple's MPS.

It is never a silent fallback to CPU torch: without a GPU the backend is
unavailable and says why, so a user asking for it gets an error rather than
a slow run they did not ask for. torch is imported lazily because importing
it costs seconds.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from core.backend import Availability, Backend
from core.errors import BackendUnavailableError


def _torch():
    import torch

    return torch


def _probe() -> Availability:
    if importlib.util.find_spec("torch") is None:
        return Availability(False, "torch is not installed (pip install 'crossover[gpu]')")
    torch = _torch()
    if torch.cuda.is_available():
        return Availability(True)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return Availability(True)
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return Availability(False, f"torch {torch.__version__} ({build}) sees no CUDA or MPS device")


def device():
    """The torch device to run on; raises if there is no GPU (never falls back to CPU)."""
    availability = _probe()
    if not availability.available:
        raise BackendUnavailableError(f"backend 'torch' is unavailable: {availability.reason}")
    torch = _torch()
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("mps")


def synchronize() -> None:
    """Wait for queued GPU work, so that timings include it."""
    torch = _torch()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        torch.mps.synchronize()


def _describe() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {}
    torch = _torch()
    info: dict[str, Any] = {"torch": torch.__version__}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=f"cuda:0 {props.name}", memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda,
                    gpus=torch.cuda.device_count())
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        info.update(device="mps")
    return info


def start() -> None:
    """Create the CUDA context now, so the core can time it once as the backend's one-off cost.

    CUDA creates its context lazily on the first allocation, which would
    otherwise be charged to whichever solve ran first. Without CUDA there is
    nothing to start (MPS has no comparable context), and nothing raises.
    """
    if importlib.util.find_spec("torch") is None:
        return
    torch = _torch()
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()


def _free_device_memory() -> float | None:
    torch = _torch()
    if torch.cuda.is_available():
        return float(torch.cuda.mem_get_info()[0])
    return None


BACKEND = Backend(
    name="torch",
    summary="PyTorch on a CUDA or MPS GPU",
    probe=_probe,
    describe=_describe,
    simplicity=40,
    free_memory=_free_device_memory,
    start=start,
)


def gpu_names() -> list[str]:
    """Names of the visible CUDA devices (for the machine fingerprint); empty without torch."""
    if importlib.util.find_spec("torch") is None:
        return []
    torch = _torch()
    if torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    return ["Apple MPS"] if mps is not None and mps.is_available() else []
