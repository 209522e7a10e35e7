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


def gpu_seen(part: int) -> tuple[int, int, str]:
    """How many CUDA devices this process sees, and the UUID of its device 0."""
    import torch

    return torch.cuda.device_count(), part, str(torch.cuda.get_device_properties(0).uuid)
