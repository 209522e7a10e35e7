"""The torch backend's model and normal equations fused in Triton (``spectra.fit``'s ``torch:fused``).

The eager torch model writes out every intermediate of an evaluation: the 16
corner rows of each spectrum's templates (a (B, 16, P) gather), their
contraction, the rotational convolution of 5 channels over the template grid,
then 6 cubic taps, each a gather and three multiply-adds over (B, 5, N), and
the projected Jacobian (B, 6, N) with its weighted copy. On the GPU most of an
evaluation's time was those arrays going to memory and back. Here:

- :func:`_interpolate_exp_kernel`: the 16 corner rows of the library read
  once per template pixel and contracted in registers with the multilinear
  weights and their 4 derivatives, then exponentiated: (B, 1 or 5, P)
  written once;
- :func:`_resample_kernel`: for each data pixel the rotation kernel and the
  cubic read combined into one set of weights over the template pixels they
  reach (the kernel convolved with the 6 cubic taps), applied to the
  channels in one pass, with the velocity (the cubic's slopes) and vsini
  (the kernel's derivative) channels from the same reads: (B, 1 or 7, N)
  written once;
- :func:`_continuum_cross_kernel` and :func:`_projected_normal_kernel`:
  chi-square and the Jacobian's products with the continuum's columns, then,
  after the projection's solve, J^T W J and J^T W r of the projected
  Jacobian, formed pixel by pixel (summed in float64) and never written.

Each spectrum's rotation kernel is read only as far as it is not zero (its
own vsini's reach), so the kernels are built at the grid's largest vsini and
no wait for the device sizes them (:meth:`TritonModelOps.vsini_bound`).

The arithmetic is the eager model's, float32 as it is, summed in another
order: the fused model agrees with the eager one to float32 rounding
(tests/test_spectra_triton.py runs the kernels in Triton's interpreter on the
CPU; tests/test_spectra_gpu.py on a GPU). The interpreter runs the Python as
written, so it cannot see how Triton's compiler reads a loop: see the note on
the window of kernel taps in :func:`_resample_kernel`.

Sizes that change from problem to problem (pixels, template pixels, kernel
width, batch rows) are not specialised (``do_not_specialize``): Triton
otherwise compiles a kernel again for an integer argument that is 1 or a
multiple of 16, so a loop over problems of varied sizes would pay
compiles the planner never declared. What does compile per problem, the
constants (the continuum's terms, the parameter count, the kernel's
half-width), is the solver's ``compile_key``: a new degree, grid or arm
count is a one-off the cost model charges (``solve.compile_key``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import triton
import triton.language as tl

from core.backends.torch_upload import UPLOAD_FROM, upload
from plugins.spectra.model import CUBIC, CUBIC_FIRST, CUBIC_LAST, EPSILON, continuum_solve, corners, kernel_half_width
from plugins.spectra.model import profile as eager_profile
from plugins.spectra.ops import TorchOps
from plugins.spectra.templates import C_KMS, VSINI_MAX

INTERPOLATE_BLOCK = 512  # template pixels a program interpolates
RESAMPLE_BLOCK = 128  # data pixels a program reads
NORMAL_BLOCK = 128  # data pixels a normal-equations program takes at a time
_UPPER = [(p, q) for p in range(6) for q in range(p, 6)]  # the 21 products' order in _projected_normal_kernel
CORNERS = 16


@triton.jit
def _add_corner(table, row_stride, idx, w, dw, b, c, offsets, inside, log_flux, d0, d1, d2, d3,
                DERIVATIVES: tl.constexpr):
    """Corner c of spectrum b: its ln F row times its weight (and the weight's 4 derivatives), added."""
    row = tl.load(idx + b * 16 + c)
    values = tl.load(table + row * row_stride + offsets, mask=inside, other=0.0)
    log_flux += tl.load(w + b * 16 + c) * values
    if DERIVATIVES:
        base = dw + (b * 16 + c) * 4
        d0 += tl.load(base) * values
        d1 += tl.load(base + 1) * values
        d2 += tl.load(base + 2) * values
        d3 += tl.load(base + 3) * values
    return log_flux, d0, d1, d2, d3


@triton.jit(do_not_specialize=["row_stride", "n_template"])
def _interpolate_exp_kernel(table, row_stride, idx, w, dw, out, n_template, active,
                            DERIVATIVES: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr = False):
    """Program (block, spectrum): F = exp(sum_c w_c lnF_c) and F * sum_c dw_ck lnF_c at BLOCK template pixels.

    ``MASKED``: a spectrum whose ``active`` entry is 0 reads and writes nothing (its output is left as it was).
    """
    block = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n_template
    if MASKED:
        inside = inside & (tl.load(active + b + offsets * 0) != 0)  # a vector: the interpreter's masks
    log_flux = tl.zeros((BLOCK,), dtype=tl.float32)
    d0 = tl.zeros((BLOCK,), dtype=tl.float32)
    d1 = tl.zeros((BLOCK,), dtype=tl.float32)
    d2 = tl.zeros((BLOCK,), dtype=tl.float32)
    d3 = tl.zeros((BLOCK,), dtype=tl.float32)
    if MASKED:  # an inactive spectrum's programs run no corner at all
        for c in range(0, tl.where(tl.load(active + b) != 0, 16, 0)):
            log_flux, d0, d1, d2, d3 = _add_corner(table, row_stride, idx, w, dw, b, c, offsets, inside, log_flux,
                                                   d0, d1, d2, d3, DERIVATIVES)
    else:
        for c in tl.static_range(16):
            log_flux, d0, d1, d2, d3 = _add_corner(table, row_stride, idx, w, dw, b, c, offsets, inside, log_flux,
                                                   d0, d1, d2, d3, DERIVATIVES)
    flux = tl.exp(log_flux)
    if DERIVATIVES:
        first = out + b * 5 * n_template + offsets
        tl.store(first, flux, mask=inside)
        tl.store(first + n_template, flux * d0, mask=inside)
        tl.store(first + 2 * n_template, flux * d1, mask=inside)
        tl.store(first + 3 * n_template, flux * d2, mask=inside)
        tl.store(first + 4 * n_template, flux * d3, mask=inside)
    else:
        tl.store(out + b * n_template + offsets, flux, mask=inside)


@triton.jit(do_not_specialize=["n_pixels", "n_template", "width"])
def _resample_kernel(channels, kernel, dkernel, reach, u0, shift, du_dv, out, n_pixels, n_template, width, active,
                     dlnw, HALF: tl.constexpr, DERIVATIVES: tl.constexpr, BLOCK: tl.constexpr,
                     MASKED: tl.constexpr = False, FROM_V: tl.constexpr = False):
    """Program (block, spectrum): the broadened, shifted template channels read at BLOCK data pixels.

    Pixel i reads template position ``u = u0[i] - shift`` from the pixels ``j0 - 2 .. j0 + 3`` (``j0 =
    floor u``) with the Keys weights of ``t = u - j0``, each of them broadened by the rotation kernel
    (taps ``-h .. h`` of a row of ``2 HALF + 1`` centred on HALF, h the spectrum's reach). Combined, template
    pixel ``j0 - 2 - h + r`` carries ``c_r = sum_o w_o K[HALF - h + r - o]``: 2 h + 6 of them per pixel, the
    kernel taps kept in a window of six scalars that slides by one each step.

    ``FROM_V``: ``shift`` is the parameters (B, 6), and the shift in template pixels and its slope in v
    are computed here from v (:func:`_doppler`, ``dlnw`` a float64 pointer), not read. ``MASKED``: a
    spectrum whose ``active`` entry is 0 reads and writes nothing.
    """
    block = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n_pixels
    if MASKED:
        inside = inside & (tl.load(active + b + offsets * 0) != 0)  # a vector: the interpreter's masks
    if FROM_V:
        pixels_shift, slope_v = _doppler(tl.load(shift + b * 6), tl.load(dlnw))
    else:
        pixels_shift = tl.load(shift + b)
        slope_v = tl.load(du_dv + b)
    u = tl.load(u0 + offsets, mask=inside, other=0.0) - pixels_shift
    u = tl.minimum(tl.maximum(u, 2.0), (n_template - 3).to(tl.float64) - 1e-6)
    j0 = tl.floor(u)
    t = (u - j0).to(tl.float32)
    j0 = j0.to(tl.int32)
    t2 = t * t
    t3 = t2 * t
    # the Keys weights (model.CUBIC, rows for offsets -2 .. 3) and their slopes in t
    w0 = (t - 2.0 * t2 + t3) / 12.0
    w1 = (-8.0 * t + 15.0 * t2 - 7.0 * t3) / 12.0
    w2 = (12.0 - 28.0 * t2 + 16.0 * t3) / 12.0
    w3 = (8.0 * t + 20.0 * t2 - 16.0 * t3) / 12.0
    w4 = (-t - 6.0 * t2 + 7.0 * t3) / 12.0
    w5 = (t2 - t3) / 12.0
    s0 = (1.0 - 4.0 * t + 3.0 * t2) / 12.0
    s1 = (-8.0 + 30.0 * t - 21.0 * t2) / 12.0
    s2 = (-56.0 * t + 48.0 * t2) / 12.0
    s3 = (8.0 + 40.0 * t - 48.0 * t2) / 12.0
    s4 = (-1.0 - 12.0 * t + 21.0 * t2) / 12.0
    s5 = (2.0 * t - 3.0 * t2) / 12.0
    h = tl.load(reach + b)
    if MASKED:
        h = tl.where(tl.load(active + b) != 0, h, -3)  # no taps at all: 2 h + 6 = 0 steps below
    first = HALF - h  # the kernel's first tap that is not zero
    k_row = kernel + b * width
    dk_row = dkernel + b * width
    n_channels = 5 if DERIVATIVES else 1
    row = channels + b * n_channels * n_template
    start = j0 - 2 - h
    acc0 = tl.zeros((BLOCK,), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK,), dtype=tl.float32)
    acc4 = tl.zeros((BLOCK,), dtype=tl.float32)
    dv = tl.zeros((BLOCK,), dtype=tl.float32)
    dvsini = tl.zeros((BLOCK,), dtype=tl.float32)
    # the window: k{o} = K[first + r - o], starting on the taps before the first (zero, or before the row).
    # Each slot starts from its own load: slots that all started as one value would read to Triton's
    # compiler as never reassigned (k2 = k1 = the start value), so it would not carry them from one
    # iteration to the next, and the interpreter, which runs the Python as written, would not show it
    k0 = tl.load(k_row + first - 1, mask=first >= 1, other=0.0)
    k1 = tl.load(k_row + first - 2, mask=first >= 2, other=0.0)
    k2 = tl.load(k_row + first - 3, mask=first >= 3, other=0.0)
    k3 = tl.load(k_row + first - 4, mask=first >= 4, other=0.0)
    k4 = tl.load(k_row + first - 5, mask=first >= 5, other=0.0)
    k5 = tl.load(k_row + first - 6, mask=first >= 6, other=0.0)
    e0 = tl.load(dk_row + first - 1, mask=first >= 1, other=0.0)
    e1 = tl.load(dk_row + first - 2, mask=first >= 2, other=0.0)
    e2 = tl.load(dk_row + first - 3, mask=first >= 3, other=0.0)
    e3 = tl.load(dk_row + first - 4, mask=first >= 4, other=0.0)
    e4 = tl.load(dk_row + first - 5, mask=first >= 5, other=0.0)
    e5 = tl.load(dk_row + first - 6, mask=first >= 6, other=0.0)
    for r in range(0, 2 * h + 6):
        k5 = k4
        k4 = k3
        k3 = k2
        k2 = k1
        k1 = k0
        tap = first + r
        live = r <= 2 * h
        k0 = tl.load(k_row + tap, mask=live, other=0.0)
        c = w0 * k0 + w1 * k1 + w2 * k2 + w3 * k3 + w4 * k4 + w5 * k5
        where = start + r
        ok = inside & (where >= 0) & (where < n_template)
        x0 = tl.load(row + where, mask=ok, other=0.0)
        acc0 += c * x0
        if DERIVATIVES:
            e5 = e4
            e4 = e3
            e3 = e2
            e2 = e1
            e1 = e0
            e0 = tl.load(dk_row + tap, mask=live, other=0.0)
            dv += (s0 * k0 + s1 * k1 + s2 * k2 + s3 * k3 + s4 * k4 + s5 * k5) * x0
            dvsini += (w0 * e0 + w1 * e1 + w2 * e2 + w3 * e3 + w4 * e4 + w5 * e5) * x0
            acc1 += c * tl.load(row + n_template + where, mask=ok, other=0.0)
            acc2 += c * tl.load(row + 2 * n_template + where, mask=ok, other=0.0)
            acc3 += c * tl.load(row + 3 * n_template + where, mask=ok, other=0.0)
            acc4 += c * tl.load(row + 4 * n_template + where, mask=ok, other=0.0)
    if DERIVATIVES:
        target = out + b * 7 * n_pixels + offsets
        tl.store(target, acc0, mask=inside)
        tl.store(target + n_pixels, dv * slope_v.to(tl.float32), mask=inside)
        tl.store(target + 2 * n_pixels, dvsini, mask=inside)
        tl.store(target + 3 * n_pixels, acc1, mask=inside)
        tl.store(target + 4 * n_pixels, acc2, mask=inside)
        tl.store(target + 5 * n_pixels, acc3, mask=inside)
        tl.store(target + 6 * n_pixels, acc4, mask=inside)
    else:
        tl.store(out + b * n_pixels + offsets, acc0, mask=inside)


@triton.jit(do_not_specialize=["n_pixels", "ncoef", "n_arms"])
def _continuum_cross_kernel(shifted, flux, weight, local_basis, coeffs, arm_bounds, chi2_out, cross_out,
                            n_pixels, ncoef, n_arms, active, D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr,
                            MASKED: tl.constexpr = False):
    """Program (arm, spectrum): chi-square and the Jacobian's cross products with the continuum's columns.

    Over the arm's pixels: ``continuum = sum_k c_k phi_k``, ``r = flux - continuum T`` and, for the 6
    parameters' columns ``jp_p = continuum S_p``, ``cross[p, k] = sum w T jp_p phi_k`` (this arm's block of
    model.profile's ``cross``). Chi-square is summed in float64, as model.profile sums it.
    """
    arm = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    start = tl.load(arm_bounds + arm)
    stop = tl.load(arm_bounds + arm + 1)
    if MASKED:
        stop = tl.where(tl.load(active + b) != 0, stop, start)  # an inactive spectrum: no pixels, sums of 0
    terms = tl.arange(0, DP)
    has_term = terms < D
    c = tl.load(coeffs + b * ncoef + arm * D + terms, mask=has_term, other=0.0)
    rows = shifted + b * 7 * n_pixels
    chi2 = tl.zeros((BLOCK,), dtype=tl.float64)
    x0 = tl.zeros((BLOCK, DP), dtype=tl.float32)
    x1 = tl.zeros((BLOCK, DP), dtype=tl.float32)
    x2 = tl.zeros((BLOCK, DP), dtype=tl.float32)
    x3 = tl.zeros((BLOCK, DP), dtype=tl.float32)
    x4 = tl.zeros((BLOCK, DP), dtype=tl.float32)
    x5 = tl.zeros((BLOCK, DP), dtype=tl.float32)
    for first in range(start, stop, BLOCK):
        pixels = first + tl.arange(0, BLOCK)
        inside = pixels < stop
        phi = tl.load(local_basis + pixels[:, None] * D + terms[None, :], mask=inside[:, None] & has_term[None, :],
                      other=0.0)
        continuum = tl.sum(phi * c[None, :], 1)
        template = tl.load(rows + pixels, mask=inside, other=0.0)
        w = tl.load(weight + b * n_pixels + pixels, mask=inside, other=0.0)
        r = tl.load(flux + b * n_pixels + pixels, mask=inside, other=0.0) - continuum * template
        chi2 += (w * r * r).to(tl.float64)
        wtc = (w * template * continuum)[:, None] * phi
        x0 += wtc * tl.load(rows + n_pixels + pixels, mask=inside, other=0.0)[:, None]
        x1 += wtc * tl.load(rows + 2 * n_pixels + pixels, mask=inside, other=0.0)[:, None]
        x2 += wtc * tl.load(rows + 3 * n_pixels + pixels, mask=inside, other=0.0)[:, None]
        x3 += wtc * tl.load(rows + 4 * n_pixels + pixels, mask=inside, other=0.0)[:, None]
        x4 += wtc * tl.load(rows + 5 * n_pixels + pixels, mask=inside, other=0.0)[:, None]
        x5 += wtc * tl.load(rows + 6 * n_pixels + pixels, mask=inside, other=0.0)[:, None]
    slot = b * n_arms + arm
    tl.store(chi2_out + slot, tl.sum(chi2, 0))
    target = cross_out + slot * 6 * DP + terms
    tl.store(target, tl.sum(x0, 0))
    tl.store(target + DP, tl.sum(x1, 0))
    tl.store(target + 2 * DP, tl.sum(x2, 0))
    tl.store(target + 3 * DP, tl.sum(x3, 0))
    tl.store(target + 4 * DP, tl.sum(x4, 0))
    tl.store(target + 5 * DP, tl.sum(x5, 0))


@triton.jit(do_not_specialize=["n_pixels", "ncoef", "n_arms"])
def _projected_normal_kernel(shifted, flux, weight, local_basis, coeffs, projection, arm_bounds, out, n_pixels,
                             ncoef, n_arms, active, D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr,
                             MASKED: tl.constexpr = False):
    """Program (arm, spectrum): this arm's share of J^T W J and J^T W r for the projected Jacobian.

    ``jproj_p = continuum S_p - T sum_k P[k, p] phi_k`` (P the projection of model.profile, float32 as
    there), then the 21 products ``w jproj_p jproj_q`` and the 6 ``w jproj_p r``, summed in float64: the
    (B, 6, N) projected Jacobian is never written.
    """
    arm = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    start = tl.load(arm_bounds + arm)
    stop = tl.load(arm_bounds + arm + 1)
    if MASKED:
        stop = tl.where(tl.load(active + b) != 0, stop, start)  # an inactive spectrum: no pixels, sums of 0
    terms = tl.arange(0, DP)
    has_term = terms < D
    c = tl.load(coeffs + b * ncoef + arm * D + terms, mask=has_term, other=0.0)
    column = projection + (b * ncoef + arm * D + terms) * 6
    p0 = tl.load(column, mask=has_term, other=0.0)
    p1 = tl.load(column + 1, mask=has_term, other=0.0)
    p2 = tl.load(column + 2, mask=has_term, other=0.0)
    p3 = tl.load(column + 3, mask=has_term, other=0.0)
    p4 = tl.load(column + 4, mask=has_term, other=0.0)
    p5 = tl.load(column + 5, mask=has_term, other=0.0)
    rows = shifted + b * 7 * n_pixels
    # one tl.zeros each: accumulators that start as one shared value are a hazard for the loop's carries
    h00 = tl.zeros((BLOCK,), dtype=tl.float64)
    h01 = tl.zeros((BLOCK,), dtype=tl.float64)
    h02 = tl.zeros((BLOCK,), dtype=tl.float64)
    h03 = tl.zeros((BLOCK,), dtype=tl.float64)
    h04 = tl.zeros((BLOCK,), dtype=tl.float64)
    h05 = tl.zeros((BLOCK,), dtype=tl.float64)
    h11 = tl.zeros((BLOCK,), dtype=tl.float64)
    h12 = tl.zeros((BLOCK,), dtype=tl.float64)
    h13 = tl.zeros((BLOCK,), dtype=tl.float64)
    h14 = tl.zeros((BLOCK,), dtype=tl.float64)
    h15 = tl.zeros((BLOCK,), dtype=tl.float64)
    h22 = tl.zeros((BLOCK,), dtype=tl.float64)
    h23 = tl.zeros((BLOCK,), dtype=tl.float64)
    h24 = tl.zeros((BLOCK,), dtype=tl.float64)
    h25 = tl.zeros((BLOCK,), dtype=tl.float64)
    h33 = tl.zeros((BLOCK,), dtype=tl.float64)
    h34 = tl.zeros((BLOCK,), dtype=tl.float64)
    h35 = tl.zeros((BLOCK,), dtype=tl.float64)
    h44 = tl.zeros((BLOCK,), dtype=tl.float64)
    h45 = tl.zeros((BLOCK,), dtype=tl.float64)
    h55 = tl.zeros((BLOCK,), dtype=tl.float64)
    g0 = tl.zeros((BLOCK,), dtype=tl.float64)
    g1 = tl.zeros((BLOCK,), dtype=tl.float64)
    g2 = tl.zeros((BLOCK,), dtype=tl.float64)
    g3 = tl.zeros((BLOCK,), dtype=tl.float64)
    g4 = tl.zeros((BLOCK,), dtype=tl.float64)
    g5 = tl.zeros((BLOCK,), dtype=tl.float64)
    for first in range(start, stop, BLOCK):
        pixels = first + tl.arange(0, BLOCK)
        inside = pixels < stop
        phi = tl.load(local_basis + pixels[:, None] * D + terms[None, :], mask=inside[:, None] & has_term[None, :],
                      other=0.0)
        continuum = tl.sum(phi * c[None, :], 1)
        template = tl.load(rows + pixels, mask=inside, other=0.0)
        w = tl.load(weight + b * n_pixels + pixels, mask=inside, other=0.0).to(tl.float64)
        r = tl.load(flux + b * n_pixels + pixels, mask=inside, other=0.0) - continuum * template
        j0 = (continuum * tl.load(rows + n_pixels + pixels, mask=inside, other=0.0)
              - template * tl.sum(phi * p0[None, :], 1)).to(tl.float64)
        j1 = (continuum * tl.load(rows + 2 * n_pixels + pixels, mask=inside, other=0.0)
              - template * tl.sum(phi * p1[None, :], 1)).to(tl.float64)
        j2 = (continuum * tl.load(rows + 3 * n_pixels + pixels, mask=inside, other=0.0)
              - template * tl.sum(phi * p2[None, :], 1)).to(tl.float64)
        j3 = (continuum * tl.load(rows + 4 * n_pixels + pixels, mask=inside, other=0.0)
              - template * tl.sum(phi * p3[None, :], 1)).to(tl.float64)
        j4 = (continuum * tl.load(rows + 5 * n_pixels + pixels, mask=inside, other=0.0)
              - template * tl.sum(phi * p4[None, :], 1)).to(tl.float64)
        j5 = (continuum * tl.load(rows + 6 * n_pixels + pixels, mask=inside, other=0.0)
              - template * tl.sum(phi * p5[None, :], 1)).to(tl.float64)
        w0 = w * j0
        w1 = w * j1
        w2 = w * j2
        w3 = w * j3
        w4 = w * j4
        w5 = w * j5
        h00 += w0 * j0
        h01 += w0 * j1
        h02 += w0 * j2
        h03 += w0 * j3
        h04 += w0 * j4
        h05 += w0 * j5
        h11 += w1 * j1
        h12 += w1 * j2
        h13 += w1 * j3
        h14 += w1 * j4
        h15 += w1 * j5
        h22 += w2 * j2
        h23 += w2 * j3
        h24 += w2 * j4
        h25 += w2 * j5
        h33 += w3 * j3
        h34 += w3 * j4
        h35 += w3 * j5
        h44 += w4 * j4
        h45 += w4 * j5
        h55 += w5 * j5
        rr = r.to(tl.float64)
        g0 += w0 * rr
        g1 += w1 * rr
        g2 += w2 * rr
        g3 += w3 * rr
        g4 += w4 * rr
        g5 += w5 * rr
    target = out + (b * n_arms + arm) * 27
    tl.store(target + 0, tl.sum(h00, 0))
    tl.store(target + 1, tl.sum(h01, 0))
    tl.store(target + 2, tl.sum(h02, 0))
    tl.store(target + 3, tl.sum(h03, 0))
    tl.store(target + 4, tl.sum(h04, 0))
    tl.store(target + 5, tl.sum(h05, 0))
    tl.store(target + 6, tl.sum(h11, 0))
    tl.store(target + 7, tl.sum(h12, 0))
    tl.store(target + 8, tl.sum(h13, 0))
    tl.store(target + 9, tl.sum(h14, 0))
    tl.store(target + 10, tl.sum(h15, 0))
    tl.store(target + 11, tl.sum(h22, 0))
    tl.store(target + 12, tl.sum(h23, 0))
    tl.store(target + 13, tl.sum(h24, 0))
    tl.store(target + 14, tl.sum(h25, 0))
    tl.store(target + 15, tl.sum(h33, 0))
    tl.store(target + 16, tl.sum(h34, 0))
    tl.store(target + 17, tl.sum(h35, 0))
    tl.store(target + 18, tl.sum(h44, 0))
    tl.store(target + 19, tl.sum(h45, 0))
    tl.store(target + 20, tl.sum(h55, 0))
    tl.store(target + 21, tl.sum(g0, 0))
    tl.store(target + 22, tl.sum(g1, 0))
    tl.store(target + 23, tl.sum(g2, 0))
    tl.store(target + 24, tl.sum(g3, 0))
    tl.store(target + 25, tl.sum(g4, 0))
    tl.store(target + 26, tl.sum(g5, 0))


# -- torch:graph's kernels: the Doppler shift, the rotation kernels and the small solves, each one launch --------

# the constants below are spelled out as numbers (Triton's interpreter mishandles a global constexpr times a
# tensor): the speed of light in km/s, and model._rotation_moments' c1 = 0.8, c2 = 0.9424777960769379 and area
# 2.5132741228718345 at epsilon 0.6 (checked at import, _check_constants)


@triton.jit
def _log1p(x):
    """log(1 + x) to a few ulp for small x (Goldberg's form): libdevice's log1p has no interpreter version."""
    y = 1.0 + x
    return tl.where(y == 1.0, x, tl.log(y) * (x / (y - 1.0)))


@triton.jit
def _doppler(v, dlnw):
    """(shift, d shift / d v) in template pixels for velocity v (km/s): model.log_doppler / dlnw and du_dv."""
    beta = v / 299792.458
    shift = 0.5 * (_log1p(beta) - _log1p(-beta)) / dlnw
    return shift, -1.0 / (299792.458 * (1 - beta * beta) * dlnw)


@triton.jit
def _asin(x):
    """arcsin on [-1, 1] in float64 (fdlibm's rational form, a few ulp): libdevice's has no interpreter version."""
    a = tl.abs(x)
    small = a < 0.5
    t = tl.where(small, x * x, (1.0 - a) * 0.5)
    p = t * (1.66666666666666657415e-01 + t * (-3.25565818622400915405e-01 + t * (2.01212532134862925881e-01 + t * (
        -4.00555345006794114027e-02 + t * (7.91534994289814532176e-04 + t * 3.47933107596021167570e-05)))))
    q = 1.0 + t * (-2.40339491173441421878e+00 + t * (2.02094576023350569471e+00 + t * (
        -6.88283971605453293030e-01 + t * 7.70381505559019352791e-02)))
    r = p / q
    root = tl.sqrt(t)
    large = 1.57079632679489655800e+00 - (2.0 * (root + root * r) - 6.12323399573676603587e-17)
    return tl.where(small, x + x * r, tl.where(x < 0, -large, large))


@triton.jit
def _moments(u):
    """model._rotation_moments at u in [-1, 1]: the profile's moments t^0 .. t^3 from -1 to u."""
    u2 = u * u
    rest = 1.0 - u2
    root = tl.sqrt(rest)
    arc = _asin(u)
    m0 = (0.8 * ((u * root + arc) / 2 + 0.7853981633974483) + 0.9424777960769379 * (u - u * u2 / 3 + 2.0 / 3)
          ) / 2.5132741228718345
    m1 = (0.8 * (-rest * root / 3) + 0.9424777960769379 * (u2 / 2 - u2 * u2 / 4 - 0.25)) / 2.5132741228718345
    m2 = (0.8 * (u * (2 * u2 - 1) * root / 8 + arc / 8 + 0.19634954084936207)
          + 0.9424777960769379 * (u * u2 / 3 - u * u2 * u2 / 5 + 2.0 / 15)) / 2.5132741228718345
    m3 = (0.8 * (-rest * root / 3 + rest * rest * root / 5)
          + 0.9424777960769379 * (u2 * u2 / 4 - u2 * u2 * u2 / 6 - 1.0 / 12)) / 2.5132741228718345
    return m0, m1, m2, m3


@triton.jit
def _kernel_taps(vsini, step, taps):
    """model.rotation_kernel for one vsini per row: ``vsini`` (R, 1) km/s, ``taps`` (1, W) offsets from the centre.

    Tap m carries, for each cubic offset o, the profile's local moments over the interval k = m - o
    (``[k, k + 1]`` in pixels, ``s = vsini / step`` the half-width) weighted by Keys' row o.
    """
    s = tl.maximum(vsini, 1e-6) / step
    total = tl.zeros(taps.shape, dtype=tl.float64) * s
    for index in tl.static_range(6):
        k = taps - (index - 2.0)
        a0, a1, a2, a3 = _moments(tl.minimum(tl.maximum(k / s, -1.0), 1.0))
        b0, b1, b2, b3 = _moments(tl.minimum(tl.maximum((k + 1.0) / s, -1.0), 1.0))
        y0 = b0 - a0
        y1 = s * (b1 - a1)
        y2 = (s * s) * (b2 - a2)
        y3 = (s * s * s) * (b3 - a3)
        local1 = y1 - k * y0
        local2 = y2 - 2 * k * y1 + k * k * y0
        local3 = y3 - 3 * k * y2 + 3 * k * k * y1 - k * k * k * y0
        if index == 0:  # model.CUBIC's rows, times 12
            total += local1 - 2.0 * local2 + local3
        elif index == 1:
            total += -8.0 * local1 + 15.0 * local2 - 7.0 * local3
        elif index == 2:
            total += 12.0 * y0 - 28.0 * local2 + 16.0 * local3
        elif index == 3:
            total += 8.0 * local1 + 20.0 * local2 - 16.0 * local3
        elif index == 4:
            total += -local1 - 6.0 * local2 + 7.0 * local3
        else:
            total += local2 - local3
    return total / 12.0


@triton.jit(do_not_specialize=["n_rows"])
def _rotation_kernel(p, kernel_out, dkernel_out, reach_out, n_rows, scalars,
                     HALF: tl.constexpr, WP: tl.constexpr, DERIVATIVE: tl.constexpr, ROWS: tl.constexpr):
    """Program (block of ROWS spectra): model.rotation_kernels and the resample's reach, in one launch.

    The kernel at each spectrum's vsini (``p[:, 1]``) and, with ``DERIVATIVE``, d kernel / d vsini by
    the central difference at vsini +- h (one-sided below h), each (B, 2 HALF + 1) float32; ``reach``
    (B,) int32: the outermost tap either has that is not zero (what TritonModelOps.resample derives).
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    inside = rows < n_rows
    step = tl.load(scalars)  # float64 through memory: a Python float argument would be float32
    h = tl.load(scalars + 1)
    vsini = tl.load(p + rows.to(tl.int64) * 6 + 1, mask=inside, other=0.0)[:, None]
    columns = tl.arange(0, WP)[None, :]
    width = 2 * HALF + 1
    taps = (columns - HALF).to(tl.float64)
    store = inside[:, None] & (columns < width)
    kernel = _kernel_taps(vsini, step, taps).to(tl.float32)
    live = kernel != 0
    target = rows.to(tl.int64)[:, None] * width + columns
    tl.store(kernel_out + target, kernel, mask=store)
    if DERIVATIVE:
        up = vsini + h
        down = tl.maximum(vsini - h, 0.0)
        slope = ((_kernel_taps(up, step, taps) - _kernel_taps(down, step, taps)) / (up - down)).to(tl.float32)
        live = live | (slope != 0)
        tl.store(dkernel_out + target, slope, mask=store)
    distance = tl.abs(columns - HALF)
    reach = tl.max(tl.where(live & (columns < width), distance, 0), 1)
    tl.store(reach_out + rows, reach.to(tl.int32), mask=inside)


@triton.jit(do_not_specialize=["n_batch"])
def _small_solve_kernel(a, rhs, x, n_batch, N: tl.constexpr, NP: tl.constexpr, K: tl.constexpr,
                        KP: tl.constexpr, BLOCK: tl.constexpr):
    """Program (block of BLOCK systems): x = a^-1 rhs for (B, N, N) a and (B, N, K) rhs, float64.

    Gaussian elimination without pivoting, rows reduced in registers: every system solved here is
    symmetric positive definite (a ridged continuum normal matrix, a damped Gauss-Newton matrix), for
    which that is stable. One launch, where torch's batched LU takes several and may not be capturable
    in a CUDA graph. A singular or non-finite system gives non-finite x, as torch's solve_ex does.
    """
    systems = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m3 = systems.to(tl.int64)[:, None, None]
    r3 = tl.arange(0, NP)[None, :, None]
    c3 = tl.arange(0, NP)[None, None, :]
    k3 = tl.arange(0, KP)[None, None, :]
    rows2 = tl.arange(0, NP)[None, :]
    valid = m3 < n_batch
    matrix = tl.load(a + m3 * N * N + r3 * N + c3, mask=valid & (r3 < N) & (c3 < N), other=0.0)
    matrix = tl.where((r3 == c3) & ((r3 >= N) | ~valid), 1.0, matrix)  # identity on the padding
    right = tl.load(rhs + m3 * N * K + r3 * K + k3, mask=valid & (r3 < N) & (k3 < K), other=0.0)
    for k in tl.static_range(N):
        pivot_row = tl.sum(tl.where(r3 == k, matrix, 0.0), 1)  # (BLOCK, NP)
        pivot_right = tl.sum(tl.where(r3 == k, right, 0.0), 1)  # (BLOCK, KP)
        column = tl.sum(tl.where(c3 == k, matrix, 0.0), 2)  # (BLOCK, NP)
        pivot = tl.sum(tl.where(rows2 == k, column, 0.0), 1)  # (BLOCK,)
        factor = tl.where(rows2 > k, column / pivot[:, None], 0.0)
        matrix = matrix - factor[:, :, None] * pivot_row[:, None, :]
        right = right - factor[:, :, None] * pivot_right[:, None, :]
    out = tl.zeros((BLOCK, NP, KP), dtype=tl.float64)
    for i in tl.static_range(N):
        k = N - 1 - i
        pivot_row = tl.sum(tl.where(r3 == k, matrix, 0.0), 1)  # (BLOCK, NP): U[k, :]
        pivot = tl.sum(tl.where(rows2 == k, pivot_row, 0.0), 1)
        known = tl.sum(pivot_row[:, :, None] * out, 1)  # sum over j > k of U[k, j] x[j] (rows <= k still 0)
        value = (tl.sum(tl.where(r3 == k, right, 0.0), 1) - known) / pivot[:, None]
        out = tl.where(r3 == k, value[:, None, :], out)
    tl.store(x + m3 * N * K + r3 * K + k3, out, mask=valid & (r3 < N) & (k3 < K))


def _check_cubic() -> None:
    """The kernel spells out model.CUBIC's rows for offsets -2 .. 3; refuse to run if they ever part."""
    expected = [[0, 1, -2, 1], [0, -8, 15, -7], [12, 0, -28, 16], [0, 8, 20, -16], [0, -1, -6, 7], [0, 0, 1, -1]]
    if CUBIC_FIRST != -2 or CUBIC_LAST != 3 or (CUBIC * 12.0).round().tolist() != expected:
        raise RuntimeError("plugins.spectra.model.CUBIC changed: update the weights in _resample_kernel")


_check_cubic()


def _check_constants() -> None:
    """The numbers spelled out in _doppler and _moments; refuse to run if the model's ever part from them."""
    if (C_KMS, 2 * (1 - EPSILON), math.pi * EPSILON / 2, math.pi * (1 - EPSILON / 3)) != (
            299792.458, 0.8, 0.9424777960769379, 2.5132741228718345):
        raise RuntimeError("plugins.spectra's C_KMS or EPSILON changed: update _doppler and _moments")


_check_constants()


class TritonModelOps(TorchOps):
    """TorchOps with the model's interpolation and broadening-and-read in Triton (float32, a CUDA device)."""

    def vsini_bound(self, vsini: Any) -> float:
        # the kernels are built as wide as the grid allows and each spectrum reads only its own reach,
        # so no wait for the device's largest vsini
        return VSINI_MAX

    def interpolate_exp(self, table, idx, w, dw):
        torch = self.torch
        b, n_template = idx.shape[0], table.shape[1]
        derivatives = dw is not None
        if table.stride(1) != 1:
            table = table.contiguous()
        out = torch.empty((b, 5 if derivatives else 1, n_template), dtype=torch.float32, device=table.device)
        weights = w.to(torch.float32).contiguous()
        slopes = dw.to(torch.float32).contiguous() if derivatives else weights
        grid = (triton.cdiv(n_template, INTERPOLATE_BLOCK), b)
        active = getattr(self, "active", None)
        _interpolate_exp_kernel[grid](table, table.stride(0), idx.contiguous(), weights, slopes, out, n_template,
                                      out if active is None else active, DERIVATIVES=derivatives,
                                      BLOCK=INTERPOLATE_BLOCK, MASKED=active is not None)
        return out

    def resample(self, u0, channels, kernel, dk, shift, du_dv, cubic):
        torch = self.torch
        b, _, n_template = channels.shape
        width = kernel.shape[1]
        half = width // 2
        derivatives = dk is not None
        # each spectrum's reach: its outermost tap that is not zero (the kernel is exactly 0 beyond its vsini)
        live = kernel != 0 if dk is None else (kernel != 0) | (dk != 0)
        distance = torch.abs(torch.arange(width, device=kernel.device) - half)
        reach = torch.amax(torch.where(live, distance, 0), 1).to(torch.int32)
        n_pixels = u0.shape[0]
        out = torch.empty((b, 7 if derivatives else 1, n_pixels), dtype=torch.float32, device=channels.device)
        kernel = kernel.to(torch.float32).contiguous()
        dkernel = dk.to(torch.float32).contiguous() if derivatives else kernel
        slope = du_dv if isinstance(du_dv, torch.Tensor) else torch.full((b,), float(du_dv), device=out.device)
        grid = (triton.cdiv(n_pixels, RESAMPLE_BLOCK), b)
        shift = shift.to(torch.float64).contiguous()
        _resample_kernel[grid](channels.contiguous(), kernel, dkernel, reach, u0.to(torch.float64).contiguous(),
                               shift, slope.to(torch.float64).contiguous(), out, n_pixels, n_template, width, out,
                               shift, HALF=half, DERIVATIVES=derivatives, BLOCK=RESAMPLE_BLOCK)
        return out


class TritonOps(TritonModelOps):
    """TritonModelOps with the normal equations in Triton too: the ops of ``torch:fused``."""

    def profile(self, prep, shifted, flux, weight, jac, keep_jacobian, ridge):
        """model.profile with the Jacobian's products in two Triton passes over the shifted channels.

        The continuum's solve stays model.profile's (two matrix products with the basis and a
        batched solve); then one kernel gives chi-square and the cross products with the continuum's
        columns, the projection is solved, and a second kernel forms J^T W J and J^T W r of the
        projected Jacobian pixel by pixel (never written out). Without derivatives, or where the
        Jacobian itself is asked for, model.profile runs as it is.
        """
        if not jac or keep_jacobian:
            out = eager_profile(prep, shifted, flux, weight, jac, keep_jacobian)
            return out.chi2, out.coeffs, out.model, out.hessian, out.gradient, out.jproj
        torch = self.torch
        b, _, n_pixels = shifted.shape
        shifted = shifted.contiguous()
        flux, weight = flux.to(torch.float32).contiguous(), weight.to(torch.float32).contiguous()
        gram, coeffs, _ = continuum_solve(prep, shifted[:, 0], flux, weight)
        n_arms, terms = len(prep.arm_slices), prep.degree + 1
        padded = triton.next_power_of_2(terms)
        ncoef = n_arms * terms
        bounds = prep.constant("arm_bounds", np.array([*[a for a, _ in prep.arm_slices], n_pixels], dtype=np.int32))
        local = prep.constant("local_basis32", np.ascontiguousarray(prep.local_basis, dtype=np.float32))
        c32 = coeffs.to(torch.float32).contiguous()
        chi2 = torch.empty((b, n_arms), dtype=torch.float64, device=shifted.device)
        blocks = torch.empty((b, n_arms, 6, padded), dtype=torch.float32, device=shifted.device)
        grid = (n_arms, b)
        active = getattr(self, "active", None)
        flag = chi2 if active is None else active
        _continuum_cross_kernel[grid](shifted, flux, weight, local, c32, bounds, chi2, blocks, n_pixels, ncoef,
                                      n_arms, flag, D=terms, DP=padded, BLOCK=NORMAL_BLOCK, MASKED=active is not None)
        cross = blocks[..., :terms].permute(0, 2, 1, 3).reshape(b, 6, ncoef).to(torch.float64)
        projection = self.solve(gram, cross.transpose(1, 2)).to(torch.float32).contiguous()  # (B, ncoef, 6)
        sums = torch.empty((b, n_arms, 27), dtype=torch.float64, device=shifted.device)
        _projected_normal_kernel[grid](shifted, flux, weight, local, c32, projection, bounds, sums, n_pixels, ncoef,
                                       n_arms, flag, D=terms, DP=padded, BLOCK=NORMAL_BLOCK,
                                       MASKED=active is not None)
        sums = sums.sum(1)
        upper = prep.constant("upper_pairs", np.array(_UPPER, dtype=np.int64))
        hessian = torch.zeros((b, 6, 6), dtype=torch.float64, device=shifted.device)
        hessian[:, upper[:, 0], upper[:, 1]] = sums[:, :21]
        hessian[:, upper[:, 1], upper[:, 0]] = sums[:, :21]
        return chi2.sum(1), coeffs, None, hessian, sums[:, 21:], None


SOLVE_LARGEST = 16  # GraphOps solves systems up to this size in Triton (the continuum's, degree <= 4 on 3 arms)


class GraphOps(TritonOps):
    """The ops of ``torch:graph``: TritonOps with fewer launches per evaluation, for a graph-captured LM step.

    - the rotation kernels, their derivative in vsini and each spectrum's reach in one launch
      (:func:`_rotation_kernel`; the eager form was about 170 small operations on (3 B, 63) arrays);
    - the Doppler shift computed in the resample kernel from v (:func:`_doppler`);
    - the small systems (the continuum's normal matrix, the damped Gauss-Newton step) solved in one
      launch each (:func:`_small_solve_kernel`);
    - ``active``: while the static LM (``fit.lm_static``) evaluates a trial step, a (B,) int8 flag per
      spectrum; the kernels skip the spectra whose flag is 0, so a whole batch kept at a fixed shape (and
      captured once as a CUDA graph) costs the template and pixel work of its active spectra only.
    """

    static_lm = True

    def __init__(self, device: Any = "cpu", dtype: Any = None):
        super().__init__(device, dtype)
        self.active = None

    def asarray(self, x: Any, dtype: Any = None):
        """TorchOps.asarray; a large host array (the spectra) through pinned memory that several threads fill
        (:func:`core.backends.torch_upload.upload`: a batch of 4,096 in 15 ms on the H200, 41 from pageable
        memory)."""
        dtype = self.dtype if dtype is None else dtype
        if (self.device.type != "cuda" or not isinstance(x, np.ndarray) or x.nbytes < UPLOAD_FROM
                or x.dtype.kind != "f"):
            return super().asarray(x, dtype)
        return upload(x, self.device, dtype)

    def solve(self, a, b):
        torch = self.torch
        n = a.shape[-1]
        if a.dtype != torch.float64 or n > SOLVE_LARGEST or a.shape[:-2] != b.shape[:a.ndim - 2]:
            return super().solve(a, b)
        vector = b.ndim == a.ndim - 1
        right = b[..., None] if vector else b
        k = right.shape[-1]
        systems = a.reshape(-1, n, n).to(torch.float64).contiguous()
        right = right.reshape(-1, n, k).to(torch.float64).contiguous()
        out = torch.empty_like(right)
        padded, padded_k = triton.next_power_of_2(n), triton.next_power_of_2(k)
        block = max(1, min(32, 4096 // (padded * max(padded, padded_k))))
        count = systems.shape[0]
        if count:
            _small_solve_kernel[(triton.cdiv(count, block),)](systems, right, out, count, N=n, NP=padded, K=k,
                                                               KP=padded_k, BLOCK=block)
        out = out.reshape(*b.shape[:a.ndim - 2], n, k)
        return out[..., 0] if vector else out

    def rotation(self, prep, p, derivative: bool):
        """(kernel, d kernel / d vsini or None, reach): model.rotation_kernels at p's vsini and the reach."""
        torch = self.torch
        half = kernel_half_width(VSINI_MAX, prep.step_kms)
        width = 2 * half + 1
        b = p.shape[0]
        kernel = torch.empty((b, width), dtype=torch.float32, device=p.device)
        dkernel = torch.empty((b, width), dtype=torch.float32, device=p.device) if derivative else kernel
        reach = torch.empty((b,), dtype=torch.int32, device=p.device)
        scalars = prep.constant("rotation_scalars", np.array([prep.step_kms, 0.5]))
        rows = 8
        _rotation_kernel[(triton.cdiv(b, rows),)](p, kernel, dkernel, reach, b, scalars, HALF=half,
                                                   WP=triton.next_power_of_2(width), DERIVATIVE=derivative,
                                                   ROWS=rows)
        return kernel, (dkernel if derivative else None), reach

    def shifted_templates(self, prep, p, jac: bool):
        """model.shifted_templates: the corners (torch), then three launches (interpolation, rotation, read)."""
        torch = self.torch
        p = p.to(torch.float64).contiguous()
        idx, w, dw = corners(prep, p[:, 2:6], jac)
        channels = self.interpolate_exp(prep.table, idx, w, dw).contiguous()
        kernel, dk, reach = self.rotation(prep, p, jac)
        b, _, n_template = channels.shape
        n_pixels = prep.u0.shape[0]
        out = torch.empty((b, 7 if jac else 1, n_pixels), dtype=torch.float32, device=channels.device)
        u0 = prep.u0.to(torch.float64).contiguous()  # float64 already: no copy
        dlnw = prep.constant("dlnw", np.array([prep.dlnw]))
        active = self.active
        width = kernel.shape[1]
        grid = (triton.cdiv(n_pixels, RESAMPLE_BLOCK), b)
        _resample_kernel[grid](channels, kernel, kernel if dk is None else dk, reach, u0, p, p, out, n_pixels,
                               n_template, width, out if active is None else active, dlnw, HALF=width // 2,
                               DERIVATIVES=jac, BLOCK=RESAMPLE_BLOCK, MASKED=active is not None, FROM_V=True)
        return out
