"""Functions the per-GPU processes of the multi-GPU tests run; those processes import them by name."""

from __future__ import annotations

import os


def who_am_i(part: int) -> tuple[int, str | None, int]:
    """The part, the GPUs this process may see, and its process id."""
    return part, os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid()


def fail_on_one(part: int) -> int:
    if part == 1:
        raise ValueError("part one refuses")
    return part


def die_on_one(part: int) -> int:
    if part == 1:
        os._exit(3)
    return part


def gpu_seen(part: int) -> tuple[int, int, str | None]:
    """How many CUDA devices this process sees, and the UUID of its device 0 (None where torch does not say)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    return torch.cuda.device_count(), part, None if uuid is None else str(uuid)


def on_cpu_torch() -> None:
    """Point the MFG torch kernels at CPU torch in this process (the tests' stand-in for a GPU)."""
    import torch

    from core.backends import torch_gpu
    from plugins.mfg.fp import torch_kernel as fp_torch
    from plugins.mfg.hjb import torch_kernel as hjb_torch

    fp_torch.gpu_device = hjb_torch.gpu_device = lambda: torch.device("cpu")
    torch_gpu.free_for_batches = lambda: None


def solve_paths_on_cpu_torch(part: tuple) -> list:
    """``common_noise.solve_paths`` in a device process, on CPU torch."""
    from plugins.mfg.common_noise import solve_paths

    on_cpu_torch()
    return solve_paths(part)


def interrupt_on_zero(part: int) -> int:
    """Part 0 is interrupted at once; the others would run for a minute."""
    import time

    if part == 0:
        raise KeyboardInterrupt
    time.sleep(60)
    return part
