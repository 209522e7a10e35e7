"""The fused Triton FP kernel: every time step of a block of particles in one program.

Positions live in registers from the first step to the last; the only
memory traffic per step is the drift row (Nx floats, cached) and the
atomic deposits into this program's histogram slot. The slotted layout is
shared with the torch eager path through :mod:`plugins.mfg.fp.layout`.

Deposits and moment sums are int64 fixed point (the scale, its bound and
the rounding are in :mod:`plugins.mfg.fp.fixed_point`): integer atomic
adds give the same sums in whatever order they land, so a step's mass is
exactly N * SCALE units and two runs with one seed give the same bits.
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
def _fp_all_steps(pos_ptr, drift_ptr, hist_ptr, mom_ptr, frame_ptr, n_particles, nx, nt, slots, xmin, dx, length,
                  dt, noise, seed, scale, PERIODIC: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    path = tl.program_id(1)  # batch of instances (common-noise paths) as a second grid axis
    pos_ptr += path * n_particles
    drift_ptr += path * (nt + 1) * nx
    hist_ptr += path * (nt + 1) * slots * nx
    mom_ptr += path * (nt + 1) * slots * 2
    # the grid in float64 for the deposits: a Python float argument reaches the kernel as float32
    xmin64 = tl.load(frame_ptr)
    dx64 = tl.load(frame_ptr + 1)
    inverse_length64 = tl.load(frame_ptr + 2)
    scale64 = scale.to(tl.float64)
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
        # deposits in int64 units, (scale - w, w) with w = floor(frac * scale + 0.5): fixed_point.split_units
        x64 = x.to(tl.float64)
        left, right, frac = _cell(x64, xmin64, dx64, nx, PERIODIC)
        right_units = tl.floor(frac * scale64 + 0.5).to(tl.int64)
        base = hist_ptr + (n * slots + slot) * nx
        tl.atomic_add(base + left, scale - right_units, mask=mask)
        tl.atomic_add(base + right, right_units, mask=mask)
        # moments as int64 sums of u and u**2, u = (x - xmin) * (1 / L): fixed_point.moment_units
        u = (x64 - xmin64) * inverse_length64
        first = tl.where(mask, tl.floor(u * scale64 + 0.5).to(tl.int64), 0)
        second = tl.where(mask, tl.floor(u * u * scale64 + 0.5).to(tl.int64), 0)
        moment = mom_ptr + (n * slots + slot) * 2
        tl.atomic_add(moment, tl.sum(first, axis=0))
        tl.atomic_add(moment + 1, tl.sum(second, axis=0))
    tl.store(pos_ptr + offsets, x, mask=mask)


def run_fused_counts(problem, positions, drift, seed: int):
    """Fixed-point mass (..., Nt+1, Nx) and moment units (..., Nt+1, 2), int64, after all steps.

    ``positions`` (N,) with ``drift`` (Nt+1, Nx) is one instance;
    (K, N) with (K, Nt+1, Nx) is a batch of K sharing the particles' seed.
    The kernel leaves the last step's positions in ``positions`` (when
    contiguous). Every step's counts sum to exactly N * FIXED_POINT_SCALE;
    the moment units are :func:`plugins.mfg.fp.fixed_point.moment_units`
    of each step's positions.
    """
    import torch

    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE, fixed_point_unsupported

    if fixed_point_unsupported(problem):
        raise ValueError(f"the fused torch FP cannot run this problem: {fixed_point_unsupported(problem)}")
    steps = problem.Nt + 1
    batch = positions.shape[:-1]
    k = positions.numel() // problem.N
    positions = positions.contiguous()
    drift = drift.contiguous()
    histogram = torch.zeros(*batch, steps, SLOTS, problem.Nx, dtype=torch.int64, device=positions.device)
    moments = torch.zeros(*batch, steps, SLOTS, 2, dtype=torch.int64, device=positions.device)
    frame = torch.tensor([problem.xmin, problem.dx, 1.0 / problem.length], dtype=torch.float64,
                         device=positions.device)
    grid = (triton.cdiv(problem.N, BLOCK), k)
    _fp_all_steps[grid](positions, drift, histogram, moments, frame, problem.N, problem.Nx, problem.Nt, SLOTS,
                        float(problem.xmin), float(problem.dx), float(problem.length), float(problem.dt),
                        float(problem.sigma * problem.dt**0.5), int(seed) % (2**31 - problem.Nt - 2),
                        FIXED_POINT_SCALE, PERIODIC=problem.boundary == "periodic", BLOCK_SIZE=BLOCK, num_warps=4)
    return histogram.sum(dim=-2), moments.sum(dim=-2)


def run_fused(problem, positions, drift, seed: int):
    """Binned mass (..., Nt+1, Nx) in particles and moments (..., Nt+1, 2) as (sum, sum of squares), float64.

    :func:`run_fused_counts` converted once, at the end: the mass divides
    by a power of two, so each bin is its count's nearest float64.
    """
    import torch

    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE, moments_from_units

    counts, units = run_fused_counts(problem, positions, drift, seed)
    return counts.to(torch.float64).div_(FIXED_POINT_SCALE), moments_from_units(problem, units)
