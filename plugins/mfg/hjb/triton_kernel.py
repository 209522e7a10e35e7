"""The Triton HJB kernel: one program per instance runs the whole backward sweep on the device.

Each program keeps its instance's row U^n in registers from the last time
level to the first. Every Newton iteration builds the residual and the
tridiagonal Jacobian of :func:`plugins.mfg.hjb.reference.residual_and_jacobian`
(same scheme, same reflecting fold, same stopping rule, tested per
instance) and solves the system by parallel cyclic reduction: log2 of the
padded row length stages, each one a dependent round trip through the
program's scratch (:mod:`plugins.mfg.hjb.layout`), where a Thomas sweep
would take Nx of them. A periodic row is solved as the reference does, by
Sherman-Morrison on top of the non-cyclic solve, both right-hand sides
reduced together.

Arithmetic is float64: the default Newton tolerance (1e-10 on a U of order
one) is below float32's resolution, so float32 iterations would never meet
the stopping rule the other backends meet. Divisions by dt and dx are
multiplications by their reciprocals (a division in float64 is a long
instruction sequence on the critical path), which moves the results from
the reference's by rounding only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from plugins.mfg.hjb import layout

_PCR_VECTORS = tl.constexpr(layout.PCR_VECTORS)


@triton.jit
def _pcr(lower, upper, rhs, rhs2, scratch, offsets, BLOCK: tl.constexpr, STAGES: tl.constexpr,
         TWO_RHS: tl.constexpr):
    """Parallel cyclic reduction of rows ``lower x[i-1] + x[i] + upper x[i+1] = rhs`` (unit diagonal).

    Stage s combines each row with the rows ``2**s`` away, which removes
    those unknowns and couples it to the rows ``2**(s+1)`` away; after
    STAGES stages each row holds its solution. Rows outside the block read
    as identity rows. The two buffers are written in turn, so a buffer is
    rewritten only after every thread passed the barrier of the stage that
    read it: one barrier a stage.
    """
    for stage in tl.static_range(STAGES):
        stride = 1 << stage
        buffer = scratch + (stage % 2) * (_PCR_VECTORS * BLOCK)
        tl.store(buffer + offsets, lower)
        tl.store(buffer + BLOCK + offsets, upper)
        tl.store(buffer + 2 * BLOCK + offsets, rhs)
        if TWO_RHS:
            tl.store(buffer + 3 * BLOCK + offsets, rhs2)
        tl.debug_barrier()
        below = offsets - stride
        above = offsets + stride
        has_below = below >= 0
        has_above = above < BLOCK
        lower_below = tl.load(buffer + below, mask=has_below, other=0.0)
        upper_below = tl.load(buffer + BLOCK + below, mask=has_below, other=0.0)
        rhs_below = tl.load(buffer + 2 * BLOCK + below, mask=has_below, other=0.0)
        lower_above = tl.load(buffer + above, mask=has_above, other=0.0)
        upper_above = tl.load(buffer + BLOCK + above, mask=has_above, other=0.0)
        rhs_above = tl.load(buffer + 2 * BLOCK + above, mask=has_above, other=0.0)
        scale = 1.0 / (1.0 - lower * upper_below - upper * lower_above)  # the combined row's diagonal, inverted
        if TWO_RHS:
            rhs2_below = tl.load(buffer + 3 * BLOCK + below, mask=has_below, other=0.0)
            rhs2_above = tl.load(buffer + 3 * BLOCK + above, mask=has_above, other=0.0)
            rhs2 = (rhs2 - lower * rhs2_below - upper * rhs2_above) * scale
        rhs = (rhs - lower * rhs_below - upper * rhs_above) * scale
        lower = -lower * lower_below * scale
        upper = -upper * upper_above * scale
    return rhs, rhs2


@triton.jit
def _reflecting_update(lower, diag, upper, rhs, scratch, offsets, nx, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """The Newton update on a reflecting row: the walls' ghosts folded onto their neighbours, one solve."""
    inside = offsets < nx
    first = offsets == 0
    last = offsets == nx - 1
    upper = tl.where(first, upper + lower, upper)
    lower = tl.where(first, 0.0, lower)
    lower = tl.where(last, lower + upper, lower)
    upper = tl.where(last, 0.0, upper)
    inverse = 1.0 / diag
    update, _ = _pcr(tl.where(inside, lower * inverse, 0.0), tl.where(inside, upper * inverse, 0.0),
                     tl.where(inside, rhs * inverse, 0.0), rhs, scratch, offsets, BLOCK, STAGES, False)
    return update


@triton.jit
def _cyclic_update(lower, diag, upper, rhs, scratch, offsets, nx, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """The Newton update on a periodic row, by Sherman-Morrison (the reference's ``cyclic_thomas``).

    The corners ``A[0, n-1] = lower[0]`` and ``A[n-1, 0] = upper[n-1]`` and
    the solutions' end values live in one thread each; every thread needs
    them, so they pass through the scratch's scalar slots.
    """
    inside = offsets < nx
    first = offsets == 0
    last = offsets == nx - 1
    corners = scratch + (2 * _PCR_VECTORS + 1) * BLOCK
    anywhere = offsets * 0  # every lane aims at one slot; the mask picks the lane that holds the value
    tl.store(corners + anywhere, lower, mask=first)
    tl.store(corners + 1 + anywhere, upper, mask=last)
    tl.store(corners + 2 + anywhere, diag, mask=first)
    tl.debug_barrier()
    beta = tl.load(corners)
    alpha = tl.load(corners + 1)
    gamma = -tl.load(corners + 2)  # subtracting gamma < 0 keeps the tridiagonal part diagonally dominant
    modified = tl.where(first, diag - gamma, diag)
    modified = tl.where(last, diag - alpha * beta / gamma, modified)
    inverse = 1.0 / modified
    sherman = tl.where(first, gamma, tl.where(last, alpha, 0.0))
    y, z = _pcr(tl.where(inside & ~first, lower * inverse, 0.0), tl.where(inside & ~last, upper * inverse, 0.0),
                tl.where(inside, rhs * inverse, 0.0), tl.where(inside, sherman * inverse, 0.0),
                scratch, offsets, BLOCK, STAGES, True)
    tl.store(corners + 3 + anywhere, y, mask=first)
    tl.store(corners + 4 + anywhere, y, mask=last)
    tl.store(corners + 5 + anywhere, z, mask=first)
    tl.store(corners + 6 + anywhere, z, mask=last)
    tl.debug_barrier()
    y_first, y_last = tl.load(corners + 3), tl.load(corners + 4)
    z_first, z_last = tl.load(corners + 5), tl.load(corners + 6)
    factor = (y_first + beta * y_last / gamma) / (1.0 + z_first + beta * z_last / gamma)
    return y - factor * z


@triton.jit(do_not_specialize=["newton_max"])
def _hjb_sweep(U_ptr, iterations_ptr, converged_ptr, source_ptr, g_ptr, params_ptr, scratch_ptr, nx, nt, newton_max,
               scratch_stride, PERIODIC: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    instance = tl.program_id(0).to(tl.int64)
    U_ptr += instance * (nt + 1) * nx
    source_ptr += instance * (nt + 1) * nx
    iterations_ptr += instance * nt
    converged_ptr += instance * nt
    scratch_ptr += instance * scratch_stride
    row = scratch_ptr + 2 * _PCR_VECTORS * BLOCK  # where a row's values are shared with the neighbours
    # the scalars in float64 from memory: a Python float argument reaches the kernel as float32
    dt = tl.load(params_ptr)
    dx = tl.load(params_ptr + 1)
    nu = tl.load(params_ptr + 2)
    lam = tl.load(params_ptr + 3)
    tol = tl.load(params_ptr + 4)
    inv_dt = 1.0 / dt
    inv_dx = 1.0 / dx
    diffusion = nu / (dx * dx)
    offsets = tl.arange(0, BLOCK)
    inside = offsets < nx
    if PERIODIC:
        left_index = tl.where(offsets == 0, nx - 1, offsets - 1)
        right_index = tl.where(offsets == nx - 1, 0, offsets + 1)
    else:  # the homogeneous-Neumann ghosts U_{-1} = U_1, U_{n} = U_{n-2}
        left_index = tl.where(offsets == 0, 1, offsets - 1)
        right_index = tl.where(offsets == nx - 1, nx - 2, offsets + 1)
    u = tl.load(g_ptr + offsets, mask=inside, other=0.0)
    tl.store(U_ptr + nt * nx + offsets, u, mask=inside)
    n = nt - 1
    while n >= 0:  # not range(nt): Triton 3.6's interpreter cannot take a scalar argument as range's bound
        u_next = u  # Newton starts from the later time level
        source = tl.load(source_ptr + n * nx + offsets, mask=inside, other=0.0)  # V and M at level n (implicit)
        k = newton_max * 0
        largest = tol
        searching = newton_max > 0
        while searching:
            tl.store(row + offsets, u)
            tl.debug_barrier()
            left = tl.load(row + left_index, mask=inside, other=0.0)
            right = tl.load(row + right_index, mask=inside, other=0.0)
            back = tl.maximum((u - left) * inv_dx, 0.0)
            fwd = tl.minimum((right - u) * inv_dx, 0.0)
            residual = ((u - u_next) * inv_dt - diffusion * (left - 2.0 * u + right)
                        + 0.5 * lam * (back * back + fwd * fwd) - source)
            lower = -diffusion - lam * back * inv_dx
            upper = -diffusion + lam * fwd * inv_dx
            diag = inv_dt + 2.0 * diffusion + lam * (back - fwd) * inv_dx
            if PERIODIC:
                update = _cyclic_update(lower, diag, upper, -residual, scratch_ptr, offsets, nx, BLOCK, STAGES)
            else:
                update = _reflecting_update(lower, diag, upper, -residual, scratch_ptr, offsets, nx, BLOCK, STAGES)
            u = u + update
            k += 1
            largest = tl.max(tl.where(inside, tl.abs(update), 0.0), axis=0)
            # "not below" rather than "at or above": a NaN update keeps iterating, as the reference does
            searching = (k < newton_max) & ~(largest < tol)
        tl.store(U_ptr + n * nx + offsets, u, mask=inside)
        tl.store(iterations_ptr + n, k)
        tl.store(converged_ptr + n, (largest < tol).to(tl.int8))
        n -= 1


def sweep_fused(problem, source, num_warps: int | None = None):
    """``(U, newton_iterations, converged)`` of K instances: (K, Nt+1, Nx) float64, (K, Nt) int64, (K, Nt) bool.

    ``source`` is ``V + f(M)`` of each instance, a (K, Nt+1, Nx) float64
    tensor on the device the kernel runs on; ``g``, the grid and the scalars
    come from ``problem``. ``num_warps`` overrides
    :func:`plugins.mfg.hjb.layout.warps` (for tuning).
    """
    import torch

    reason = layout.too_long(problem.Nx)
    if reason:
        raise ValueError(f"the Triton HJB cannot run this problem: {reason}")
    k, nx, nt = source.shape[0], problem.Nx, problem.Nt
    dev = source.device
    source = source.to(torch.float64).contiguous()
    U = torch.empty_like(source)
    iterations = torch.empty((k, nt), dtype=torch.int64, device=dev)
    converged = torch.empty((k, nt), dtype=torch.int8, device=dev)
    if k == 0:
        return U, iterations, converged.bool()
    stride = layout.scratch_elements(nx)
    scratch = torch.empty((k, stride), dtype=torch.float64, device=dev)
    params = torch.tensor([problem.dt, problem.dx, problem.nu, problem.lam, problem.newton_tol],
                          dtype=torch.float64, device=dev)
    g = torch.tensor(problem.g, dtype=torch.float64, device=dev)
    _hjb_sweep[(k,)](U, iterations, converged, source, g, params, scratch, nx, nt, problem.newton_max, stride,
                     PERIODIC=problem.boundary == "periodic", BLOCK=layout.block_size(nx),
                     STAGES=layout.stages(nx), num_warps=num_warps or layout.warps(nx))
    return U, iterations, converged.bool()
