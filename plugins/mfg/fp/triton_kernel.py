"""The fused Triton FP kernel: every time step of a block of particles in one program.

Positions live in registers from the first step to the last; the only
memory traffic per step is the drift row (Nx floats, cached) and the
atomic deposits into this program's histogram slot. The slots spread the
adds over ``SLOTS`` copies of each step's histogram (:mod:`plugins.mfg.fp.layout`).

Deposits and moment sums are int64 fixed point (the scale, its bound and
the rounding are in :mod:`plugins.mfg.fp.fixed_point`): integer atomic
adds give the same sums in whatever order they land, so a step's mass is
exactly N * SCALE units and two runs with one seed give the same bits.
The adds are relaxed: nothing reads a bin before the kernel ends, so they
need atomicity and no ordering. (Triton's default, acq_rel, puts a
GPU-wide fence and an L1 invalidation around every add: on an H200 the
kernel ran 1.65x slower with it, docs/results/gpu-2026-11-27-fp.)

A particle's units go (SCALE - w, w) to its left and right nodes. The
kernel does not add them to the nodes: it counts the particles per left
cell and adds each particle's w to its left cell, then
:func:`run_fused_counts` forms ``mass[j] = SCALE * count[j] - W[j] + W[j-1]``
(the right node of cell j - 1 is j, periodic or not), the same integers.
The counts need no global add per particle: ``tl.histogram`` counts a
block's cells in shared memory and the program adds one total per cell.
That leaves one global atomic add per particle step instead of two; the
two had taken about half of the kernel's time.

Each Philox draw gives four normals, used by four consecutive steps.
"""

from __future__ import annotations

import triton
import triton.language as tl

from plugins.mfg.fp.layout import BLOCK, SLOTS, histogram_bins


@triton.jit
def _cell(x, xmin, inverse_dx, nx, PERIODIC: tl.constexpr):
    s = (x - xmin) * inverse_dx
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
def _floor_to_int64(v):
    # floor and conversion in one instruction (cvt.rmi): the same integer as tl.floor(v).to(tl.int64), which
    # compiles to two on the conversion unit, whose rate is an eighth of the float32 units
    return tl.inline_asm_elementwise("cvt.rmi.s64.f64 $0, $1;", "=l,d", [v], dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def _approx(instruction: tl.constexpr, v):
    return tl.inline_asm_elementwise(instruction + " $0, $1;", "=f,f", [v], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _normals(seed, offsets):
    """Four standard normals per offset from one Philox draw: Box-Muller on two pairs of uniforms.

    The hardware's approximate log2, sine and cosine, the angle in
    [-pi, pi) where their error is at most 2**-20.5 (a sign flip of a
    symmetric law): on an H200 the libdevice versions made the kernel only
    1 % slower, but they also compile to several times the instructions.
    """
    u1, u2, u3, u4 = tl.rand4x(seed, offsets)
    r1 = tl.sqrt(-1.3862943611198906 * _approx("lg2.approx.f32", tl.maximum(1.0e-7, u1)))  # -2 ln u = -2 ln 2 lg2 u
    r2 = tl.sqrt(-1.3862943611198906 * _approx("lg2.approx.f32", tl.maximum(1.0e-7, u3)))
    t1 = 6.283185307179586 * u2 - 3.141592653589793
    t2 = 6.283185307179586 * u4 - 3.141592653589793
    return (r1 * _approx("cos.approx.f32", t1), r1 * _approx("sin.approx.f32", t1),
            r2 * _approx("cos.approx.f32", t2), r2 * _approx("sin.approx.f32", t2))


@triton.jit
def _step(x, z, row, xmin, inverse_dx, nx, length, dt, noise, PERIODIC: tl.constexpr):
    left, right, frac = _cell(x, xmin, inverse_dx, nx, PERIODIC)
    velocity = (1.0 - frac) * tl.load(row + left) + frac * tl.load(row + right)
    x = x + velocity * dt + noise * z
    y = x - xmin
    if PERIODIC:
        y = y - length * tl.floor(y / length)
        y = tl.where(y >= length, 0.0, y)
    else:
        period = 2.0 * length
        y = y - period * tl.floor(y / period)
        y = tl.where(y > length, period - y, y)
    return xmin + y


@triton.jit
def _deposit(x, counts, moment, mask, nx, xmin64, inverse_dx64, inverse_length64, scale, PERIODIC: tl.constexpr,
             BINS: tl.constexpr):
    # counts: this step's slot, particles per left cell then right units w per left cell (Nx int64 each);
    # w = floor(frac * scale + 0.5) as fixed_point.split_units rounds it
    scale64 = scale.to(tl.float64)
    x64 = x.to(tl.float64)
    left, _, frac = _cell(x64, xmin64, inverse_dx64, nx, PERIODIC)  # the right node: the roll in run_fused_counts
    right_units = _floor_to_int64(frac * scale64 + 0.5)
    if BINS > 0:
        per_cell = tl.histogram(tl.where(mask, left, BINS - 1), BINS)  # masked lanes land in a bin >= nx: not added
        cells = tl.arange(0, BINS)
        tl.atomic_add(counts + cells, per_cell.to(tl.int64), mask=(cells < nx) & (per_cell != 0), sem="relaxed")
    else:  # too many cells for a block's histogram (run_fused_counts): one add per particle
        tl.atomic_add(counts + left, tl.full(left.shape, 1, tl.int64), mask=mask, sem="relaxed")
    tl.atomic_add(counts + nx + left, right_units, mask=mask, sem="relaxed")
    # moments as int64 sums of u and u**2, u = (x - xmin) * (1 / L): fixed_point.moment_units
    u = (x64 - xmin64) * inverse_length64
    first = tl.where(mask, _floor_to_int64(u * scale64 + 0.5), 0)
    second = tl.where(mask, _floor_to_int64(u * u * scale64 + 0.5), 0)
    tl.atomic_add(moment, tl.sum(first, axis=0), sem="relaxed")
    tl.atomic_add(moment + 1, tl.sum(second, axis=0), sem="relaxed")


# the seed is not specialised: Triton compiles an integer argument again when it turns 1 or a multiple of 16,
# and a new seed (each common-noise path has its own) then cost a process 0.75 s on the H200 host
@triton.jit(do_not_specialize=["seed"])
def _fp_all_steps(pos_ptr, drift_ptr, hist_ptr, mom_ptr, frame_ptr, n_particles, nx, nt, slots, xmin, inverse_dx,
                  length, dt, noise, seed, scale, PERIODIC: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  BINS: tl.constexpr):
    pid = tl.program_id(0)
    path = tl.program_id(1)  # batch of instances (common-noise paths) as a second grid axis
    pos_ptr += path * n_particles
    drift_ptr += path * (nt + 1) * nx
    hist_ptr += path * (nt + 1) * slots * 2 * nx
    mom_ptr += path * (nt + 1) * slots * 2
    # the grid in float64 for the deposits: a Python float argument reaches the kernel as float32
    xmin64 = tl.load(frame_ptr)
    inverse_dx64 = tl.load(frame_ptr + 1)
    inverse_length64 = tl.load(frame_ptr + 2)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_particles
    x = tl.load(pos_ptr + offsets, mask=mask, other=xmin)
    slot = pid % slots
    _deposit(x, hist_ptr + slot * 2 * nx, mom_ptr + slot * 2, mask, nx, xmin64, inverse_dx64, inverse_length64,
             scale, PERIODIC, BINS)
    # steps first+1 .. first+4 take the four normals of one Philox draw, keyed by (seed + first, particle)
    for first in range(0, nt, 4):
        z0, z1, z2, z3 = _normals(seed + first, offsets)
        for j in range(0, 4):
            n = first + 1 + j
            if n <= nt:
                z = tl.where(j == 0, z0, tl.where(j == 1, z1, tl.where(j == 2, z2, z3)))
                x = _step(x, z, drift_ptr + (n - 1) * nx, xmin, inverse_dx, nx, length, dt, noise, PERIODIC)
                _deposit(x, hist_ptr + (n * slots + slot) * 2 * nx, mom_ptr + (n * slots + slot) * 2, mask, nx,
                         xmin64, inverse_dx64, inverse_length64, scale, PERIODIC, BINS)
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
    histogram = torch.zeros(*batch, steps, SLOTS, 2, problem.Nx, dtype=torch.int64, device=positions.device)
    moments = torch.zeros(*batch, steps, SLOTS, 2, dtype=torch.int64, device=positions.device)
    frame = torch.tensor([problem.xmin, 1.0 / problem.dx, 1.0 / problem.length], dtype=torch.float64,
                         device=positions.device)
    grid = (triton.cdiv(problem.N, BLOCK), k)
    _fp_all_steps[grid](positions, drift, histogram, moments, frame, problem.N, problem.Nx, problem.Nt, SLOTS,
                        float(problem.xmin), float(1.0 / problem.dx), float(problem.length), float(problem.dt),
                        float(problem.sigma * problem.dt**0.5), int(seed) % (2**31 - problem.Nt - 2),
                        FIXED_POINT_SCALE, PERIODIC=problem.boundary == "periodic", BLOCK_SIZE=BLOCK,
                        BINS=histogram_bins(problem.Nx), num_warps=4)
    summed = histogram.sum(dim=-3)
    count, right_units = summed[..., 0, :], summed[..., 1, :]
    # node j: its own cell's particles give SCALE - w, cell j - 1's give w (a reflecting grid's last cell holds
    # no left ends, so the roll brings in zeros at node 0; a periodic one's wraps as its cells do)
    return FIXED_POINT_SCALE * count - right_units + torch.roll(right_units, 1, dims=-1), moments.sum(dim=-2)


def run_fused(problem, positions, drift, seed: int):
    """Binned mass (..., Nt+1, Nx) in particles and moments (..., Nt+1, 2) as (sum, sum of squares), float64.

    :func:`run_fused_counts` converted once, at the end: the mass divides
    by a power of two, so each bin is its count's nearest float64.
    """
    import torch

    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE, moments_from_units

    counts, units = run_fused_counts(problem, positions, drift, seed)
    return counts.to(torch.float64).div_(FIXED_POINT_SCALE), moments_from_units(problem, units)
