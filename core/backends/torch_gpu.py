"""The ``torch`` backend: PyTorch on a CUDA GPU, or Apple's MPS.

It is never a silent fallback to CPU torch: without a GPU the backend is
unavailable and says why, so a user asking for it gets an error rather than
a slow run they did not ask for. torch is imported lazily because importing
it costs seconds.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from core.backend import Availability, Backend
from core.errors import BackendUnavailableError
from core.validation import fail


def _torch():
    import torch

    return torch


def compile_in_process(function: Any, **options: Any) -> Any:
    """``torch.compile(function, **options)`` with Inductor compiling in this process, not in a worker pool.

    Inductor's pool of compile workers kept about 1.5 cores busy for 4-5 s
    after each compile: a 16-thread numba kernel ran 1.2-1.5x slow meanwhile
    (H200 host, ``ml.linreg`` at 7.7M samples: 11.9 ms before, 14-18 ms
    after a compile), and evaluate's loops, which compile per shape, timed
    numba 1.7x slower than the same calls a minute later. Compiles here
    are small graphs, which a pool hardly speeds. A user's own
    ``TORCHINDUCTOR_COMPILE_THREADS`` wins.
    """
    torch = _torch()
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        import torch._inductor.config as inductor

        inductor.compile_threads = 1
    return torch.compile(function, **options)


# device nodes a GPU driver makes on Linux: NVIDIA's, and AMD's for ROCm builds of torch
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


def _no_gpu_driver() -> bool:
    """True where no GPU can be there at all: Linux with no GPU driver's device node.

    Checked before importing torch, which costs a fresh process about a
    second on the 2-core VM, every first plan that asks whether the GPU
    backend is available. Elsewhere (macOS's MPS, Windows) torch is asked.
    """
    return (sys.platform.startswith("linux") and "torch" not in sys.modules
            and not any(os.path.exists(node) for node in GPU_DEVICE_NODES))


def _probe() -> Availability:
    if importlib.util.find_spec("torch") is None:
        return Availability(False, "torch is not installed (from a clone of crossover: pip install '.[gpu]')")
    if _no_gpu_driver():
        return Availability(False, "torch sees no CUDA or MPS device: no GPU driver on this machine "
                                   f"(none of {', '.join(GPU_DEVICE_NODES)})")
    torch = _torch()
    if torch.cuda.is_available():
        return Availability(True)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return Availability(True)
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return Availability(False, f"torch {torch.__version__} ({build}) sees no CUDA or MPS device")


_CUDA_ANSWERS: dict[Any, bool] = {}  # by the torch.cuda.is_available function that gave each


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once a process (torch imported on the first ask).

    A plugin asks it in ``supports`` for each CUDA-only variant, so every
    new problem's plan asked it per variant (and :func:`device` and
    :func:`synchronize`, around every run): each ask reads an environment
    variable and the driver's device count, 10-15 us on the H200 host, 0.1
    ms of a small linreg problem's first plan. Kept by the function that
    answered: a test that patches ``torch.cuda.is_available`` is asked anew.
    ``core.running.forget_probes`` does not reset it (the core names no
    backend): a GPU that appears in a running process needs a new process.
    """
    ask = _torch().cuda.is_available
    found = _CUDA_ANSWERS.get(ask)
    if found is None:
        found = _CUDA_ANSWERS[ask] = bool(ask())
    return found


def device():
    """The torch device to run on; raises if there is no GPU (never falls back to CPU)."""
    availability = _probe()
    if not availability.available:
        raise BackendUnavailableError(f"backend 'torch' is unavailable: {availability.reason}")
    torch = _torch()
    return torch.device("cuda") if cuda_available() else torch.device("mps")


def synchronize() -> None:
    """Wait for queued GPU work, so that timings include it."""
    torch = _torch()
    if cuda_available():
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
                    gpus=torch.cuda.device_count(), gpus_used=gpu_count())
        # the memory model is per device: a batch split across the GPUs must fit each one
        info["free_gib_per_gpu"] = [round(free / 2**30, 1) for free in free_memory_per_gpu()]
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        info.update(device="mps", gpus=1)
    return info


# how many GPUs a batched solver may split its batch across (default: every visible one)
GPUS_VARIABLE = "CROSSOVER_GPUS"


def gpu_count(limit: int | None = None) -> int:
    """GPUs a batched solver splits its batch across: the visible CUDA devices (MPS: one), at most ``limit``.

    ``limit`` defaults to ``CROSSOVER_GPUS`` (an integer >= 1), else every
    visible device. Without a GPU, 0.
    """
    if limit is None:
        configured = os.environ.get(GPUS_VARIABLE, "").strip()
        if configured:
            if not (configured.isascii() and configured.isdigit()) or int(configured) < 1:
                raise fail(GPUS_VARIABLE, os.environ[GPUS_VARIABLE], "must be an integer >= 1, or unset")
            limit = int(configured)
    elif limit < 1:
        raise fail("devices", limit, "must be an integer >= 1, or None for every visible GPU")
    if importlib.util.find_spec("torch") is None:
        return 0
    torch = _torch()
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
    else:
        mps = getattr(torch.backends, "mps", None)
        visible = 1 if mps is not None and mps.is_available() else 0
    return visible if limit is None else min(visible, limit)


def free_memory_per_gpu() -> list[float]:
    """Free bytes on each visible CUDA device (creates a context on each; for ``describe``)."""
    torch = _torch()
    return [float(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())]


def free_for_batches() -> float | None:
    """Bytes a batch may still take on this process's current GPU: free, plus what torch's cache holds unused.

    The caching allocator keeps freed blocks reserved, and the device counts
    them as used; a next sub-batch reuses them. None where the device
    cannot say (MPS).
    """
    torch = _torch()
    if not torch.cuda.is_available():
        return None
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    return float(torch.cuda.mem_get_info()[0] + max(cached, 0))


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
