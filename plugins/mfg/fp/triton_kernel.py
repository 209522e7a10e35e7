"""The fused Triton FP kernel: every time step of a block of particles in one program.

Positions live in registers from the first step to the last; the only
memory traffic per step is the drift row (Nx floats, cached) and the
atomic deposits into this program's histogram slot. The slotted layout is
shared with the torch eager path through :mod:`plugins.mfg.fp.layout`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from plugins.mfg.fp.layout import BLOCK, SLOTS


@triton.jit
def _cell(x, xmin, dx, nx, PERIODIC: tl.constexpr):
    s = (x - xmin) / dx
    left_f = tl.floor(s)
    frac = s - left_f
    left = left_f.to(tl.int32)
    if PERIODIC:
        left = tl.where(left >= nx, left - nx, left)
        left = tl.where(left < 0, left + nx, left)
        right = tl.where(left + 1 >= nx, 0, left + 1)
    else:
        left = tl.minimum(tl.maximum(left, 0), nx - 2)
        frac = tl.minimum(tl.maximum(s - left.to(s.dtype), 0.0), 1.0)
        right = left + 1
    return left, right, frac


@triton.jit
def _fp_all_steps(pos_ptr, drift_ptr, hist_ptr, mom_ptr, n_particles, nx, nt, slots, xmin, dx, length, dt, noise,
                  seed, PERIODIC: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    path = tl.program_id(1)  # batch of instances (common-noise paths) as a second grid axis
    pos_ptr += path * n_particles
    drift_ptr += path * (nt + 1) * nx
    hist_ptr += path * (nt + 1) * slots * nx
    mom_ptr += path * (nt + 1) * slots * 2
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_particles
    x = tl.load(pos_ptr + offsets, mask=mask, other=xmin)
    slot = pid % slots
    for n in range(0, nt + 1):
        if n > 0:
            left, right, frac = _cell(x, xmin, dx, nx, PERIODIC)
            row = drift_ptr + (n - 1) * nx
            velocity = (1.0 - frac) * tl.load(row + left) + frac * tl.load(row + right)
            z = tl.randn(seed + n, offsets)
            x = x + velocity * dt + noise * z
            y = x - xmin
            if PERIODIC:
                y = y - length * tl.floor(y / length)
                y = tl.where(y >= length, 0.0, y)
            else:
                period = 2.0 * length
                y = y - period * tl.floor(y / period)
                y = tl.where(y > length, period - y, y)
            x = xmin + y
        # deposits in float64: (1 - frac) + frac is one to 1e-16, so mass is exact to 1e-12
        left, right, frac = _cell(x.to(tl.float64), xmin.to(tl.float64), dx.to(tl.float64), nx, PERIODIC)
        base = hist_ptr + (n * slots + slot) * nx
        tl.atomic_add(base + left, 1.0 - frac, mask=mask)
        tl.atomic_add(base + right, frac, mask=mask)
        xs = tl.where(mask, x, 0.0).to(tl.float64)
        moment = mom_ptr + (n * slots + slot) * 2
        tl.atomic_add(moment, tl.sum(xs, axis=0))
        tl.atomic_add(moment + 1, tl.sum(xs * xs, axis=0))
    tl.store(pos_ptr + offsets, x, mask=mask)


def run_fused(problem, positions, drift, seed: int):
    """Binned mass (..., Nt+1, Nx) and moments (..., Nt+1, 2), float64, after all steps.

    ``positions`` (N,) with ``drift`` (Nt+1, Nx) is one instance;
    (K, N) with (K, Nt+1, Nx) is a batch of K sharing the particles' seed.
    """
    import torch

    steps = problem.Nt + 1
    batch = positions.shape[:-1]
    k = positions.numel() // problem.N
    positions = positions.contiguous()
    drift = drift.contiguous()
    histogram = torch.zeros(*batch, steps, SLOTS, problem.Nx, dtype=torch.float64, device=positions.device)
    moments = torch.zeros(*batch, steps, SLOTS, 2, dtype=torch.float64, device=positions.device)
    grid = (triton.cdiv(problem.N, BLOCK), k)
    _fp_all_steps[grid](positions, drift, histogram, moments, problem.N, problem.Nx, problem.Nt, SLOTS,
                        float(problem.xmin), float(problem.dx), float(problem.length), float(problem.dt),
                        float(problem.sigma * problem.dt**0.5), int(seed) % (2**31 - problem.Nt - 2),
                        PERIODIC=problem.boundary == "periodic", BLOCK_SIZE=BLOCK, num_warps=4)
    return histogram.sum(dim=-2), moments.sum(dim=-2)
