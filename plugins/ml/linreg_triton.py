"""The graph variant's epoch as two Triton kernels: a bandwidth-bound stage one and a one-program stage two.

Stage one: a fixed grid of programs (a few per SM), each streaming its own
contiguous chunk of x and y (float32) in tiles and accumulating the three
sums (err^2, err * x, err) in float64 registers; one partial of each per
program. Stage two: a single program sums the partials in a fixed order,
writes the epoch's loss and steps (w, b). The grid and the chunks depend
only on the problem's size and the GPU, and nothing is atomic, so every
run gives the same bits.

Why not the compiled epoch (``torch.compile`` of
:func:`plugins.ml.linreg_torch.epoch`): Inductor's reduction over
``[blocks, block]`` rows kept too few bytes in flight, so on an H100 the
preset's replay ran at 2.2-2.3x the bandwidth floor (docs/ml.md); a
streaming loop with wide tiles and several programs per SM is what a
bandwidth-bound reduction needs.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

TILE = 2048  # elements of x (and of y) per program per loop iteration
PROGRAMS_PER_SM = 4
WARPS = 8


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    # sizes are not specialised on (Triton compiles anew when an int is 1 or a multiple of 16): one
    # compile a process serves every size, where each new specialisation cost a first call 0.2-0.7 s
    # (H200 host) that no per-shape capture accounts for
    @triton.jit(do_not_specialize=["n", "chunk", "programs"])
    def stage_one(x_ptr, y_ptr, state_ptr, partial_ptr, n, chunk, programs, TILE: tl.constexpr):
        pid = tl.program_id(0)
        w = tl.load(state_ptr)
        b = tl.load(state_ptr + 1)
        ee = tl.zeros([TILE], dtype=tl.float64)
        ex = tl.zeros([TILE], dtype=tl.float64)
        e = tl.zeros([TILE], dtype=tl.float64)
        start = pid * chunk
        for offset in range(0, chunk, TILE):
            index = start + offset + tl.arange(0, TILE)
            inside = index < n
            x = tl.load(x_ptr + index, mask=inside, other=0.0).to(tl.float64)
            y = tl.load(y_ptr + index, mask=inside, other=0.0).to(tl.float64)
            err = tl.where(inside, w * x + b - y, 0.0)
            ee += err * err
            ex += err * x
            e += err
        tl.store(partial_ptr + pid, tl.sum(ee, axis=0))
        tl.store(partial_ptr + programs + pid, tl.sum(ex, axis=0))
        tl.store(partial_ptr + 2 * programs + pid, tl.sum(e, axis=0))

    @triton.jit(do_not_specialize=["programs"])
    def stage_two(partial_ptr, state_ptr, scalars_ptr, losses_ptr, counter_ptr, programs, SLOTS: tl.constexpr):
        slot = tl.arange(0, SLOTS)
        inside = slot < programs
        ee = tl.sum(tl.load(partial_ptr + slot, mask=inside, other=0.0), axis=0)
        ex = tl.sum(tl.load(partial_ptr + programs + slot, mask=inside, other=0.0), axis=0)
        e = tl.sum(tl.load(partial_ptr + 2 * programs + slot, mask=inside, other=0.0), axis=0)
        inverse_n = tl.load(scalars_ptr)
        rate = tl.load(scalars_ptr + 1)
        epoch = tl.load(counter_ptr)
        tl.store(losses_ptr + epoch, ee * inverse_n)
        w = tl.load(state_ptr)
        b = tl.load(state_ptr + 1)
        tl.store(state_ptr, w - rate * (2.0 * (ex * inverse_n)))
        tl.store(state_ptr + 1, b - rate * (2.0 * (e * inverse_n)))
        tl.store(counter_ptr, epoch + 1)

    return stage_one, stage_two


def grid(n: int, multiprocessors: int) -> tuple[int, int]:
    """(programs, chunk): at most PROGRAMS_PER_SM per SM, each a whole number of tiles, covering ``n``."""
    programs = max(1, min(PROGRAMS_PER_SM * multiprocessors, math.ceil(n / TILE)))
    chunk = math.ceil(math.ceil(n / programs) / TILE) * TILE
    return math.ceil(n / chunk), chunk


def multiprocessors(device: Any) -> int:
    """The GPU's SM count (the CPU's cores under Triton's interpreter, which the CPU tests use)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return os.cpu_count() or 1


def epoch_step(n: int, device: Any) -> Callable[..., None]:
    """An in-place epoch with :func:`plugins.ml.linreg_torch.advance`'s signature, on flat float32 x and y.

    It owns the partials' buffer, so a CUDA graph that captures it replays into the same memory.
    """
    import torch

    stage_one, stage_two = _kernels()
    most = PROGRAMS_PER_SM * multiprocessors(device)
    programs, chunk = grid(n, most // PROGRAMS_PER_SM)
    partial = torch.zeros(3 * programs, dtype=torch.float64, device=device)
    slots = max(16, 1 << (most - 1).bit_length())  # the device's, not the size's: one compile of stage two

    def step(x, y, state, scalars, losses, counter) -> None:
        stage_one[(programs,)](x, y, state, partial, n, chunk, programs, TILE=TILE, num_warps=WARPS)
        stage_two[(1,)](partial, state, scalars, losses, counter, programs, SLOTS=slots, num_warps=4)

    return step
