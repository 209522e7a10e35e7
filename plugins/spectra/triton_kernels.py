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
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton
import triton.language as tl

from plugins.spectra.model import CUBIC, CUBIC_FIRST, CUBIC_LAST, continuum_solve
from plugins.spectra.model import profile as eager_profile
from plugins.spectra.ops import TorchOps
from plugins.spectra.templates import VSINI_MAX

INTERPOLATE_BLOCK = 512  # template pixels a program interpolates
RESAMPLE_BLOCK = 128  # data pixels a program reads
NORMAL_BLOCK = 128  # data pixels a normal-equations program takes at a time
_UPPER = [(p, q) for p in range(6) for q in range(p, 6)]  # the 21 products' order in _projected_normal_kernel
CORNERS = 16


@triton.jit
def _interpolate_exp_kernel(table, row_stride, idx, w, dw, out, n_template,
                            DERIVATIVES: tl.constexpr, BLOCK: tl.constexpr):
    """Program (block, spectrum): F = exp(sum_c w_c lnF_c) and F * sum_c dw_ck lnF_c at BLOCK template pixels."""
    block = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n_template
    log_flux = tl.zeros((BLOCK,), dtype=tl.float32)
    d0 = tl.zeros((BLOCK,), dtype=tl.float32)
    d1 = tl.zeros((BLOCK,), dtype=tl.float32)
    d2 = tl.zeros((BLOCK,), dtype=tl.float32)
    d3 = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in tl.static_range(16):
        row = tl.load(idx + b * 16 + c)
        values = tl.load(table + row * row_stride + offsets, mask=inside, other=0.0)
        log_flux += tl.load(w + b * 16 + c) * values
        if DERIVATIVES:
            base = dw + (b * 16 + c) * 4
            d0 += tl.load(base) * values
            d1 += tl.load(base + 1) * values
            d2 += tl.load(base + 2) * values
            d3 += tl.load(base + 3) * values
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


@triton.jit
def _resample_kernel(channels, kernel, dkernel, reach, u0, shift, du_dv, out, n_pixels, n_template, width,
                     HALF: tl.constexpr, DERIVATIVES: tl.constexpr, BLOCK: tl.constexpr):
    """Program (block, spectrum): the broadened, shifted template channels read at BLOCK data pixels.

    Pixel i reads template position ``u = u0[i] - shift`` from the pixels ``j0 - 2 .. j0 + 3`` (``j0 =
    floor u``) with the Keys weights of ``t = u - j0``, each of them broadened by the rotation kernel
    (taps ``-h .. h`` of a row of ``2 HALF + 1`` centred on HALF, h the spectrum's reach). Combined, template
    pixel ``j0 - 2 - h + r`` carries ``c_r = sum_o w_o K[HALF - h + r - o]``: 2 h + 6 of them per pixel, the
    kernel taps kept in a window of six scalars that slides by one each step.
    """
    block = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offsets = block * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n_pixels
    u = tl.load(u0 + offsets, mask=inside, other=0.0) - tl.load(shift + b)
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
        tl.store(target + n_pixels, dv * tl.load(du_dv + b).to(tl.float32), mask=inside)
        tl.store(target + 2 * n_pixels, dvsini, mask=inside)
        tl.store(target + 3 * n_pixels, acc1, mask=inside)
        tl.store(target + 4 * n_pixels, acc2, mask=inside)
        tl.store(target + 5 * n_pixels, acc3, mask=inside)
        tl.store(target + 6 * n_pixels, acc4, mask=inside)
    else:
        tl.store(out + b * n_pixels + offsets, acc0, mask=inside)


@triton.jit
def _continuum_cross_kernel(shifted, flux, weight, local_basis, coeffs, arm_bounds, chi2_out, cross_out,
                            n_pixels, ncoef, n_arms, D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr):
    """Program (arm, spectrum): chi-square and the Jacobian's cross products with the continuum's columns.

    Over the arm's pixels: ``continuum = sum_k c_k phi_k``, ``r = flux - continuum T`` and, for the 6
    parameters' columns ``jp_p = continuum S_p``, ``cross[p, k] = sum w T jp_p phi_k`` (this arm's block of
    model.profile's ``cross``). Chi-square is summed in float64, as model.profile sums it.
    """
    arm = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    start = tl.load(arm_bounds + arm)
    stop = tl.load(arm_bounds + arm + 1)
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


@triton.jit
def _projected_normal_kernel(shifted, flux, weight, local_basis, coeffs, projection, arm_bounds, out, n_pixels,
                             ncoef, n_arms, D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr):
    """Program (arm, spectrum): this arm's share of J^T W J and J^T W r for the projected Jacobian.

    ``jproj_p = continuum S_p - T sum_k P[k, p] phi_k`` (P the projection of model.profile, float32 as
    there), then the 21 products ``w jproj_p jproj_q`` and the 6 ``w jproj_p r``, summed in float64: the
    (B, 6, N) projected Jacobian is never written.
    """
    arm = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    start = tl.load(arm_bounds + arm)
    stop = tl.load(arm_bounds + arm + 1)
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


def _check_cubic() -> None:
    """The kernel spells out model.CUBIC's rows for offsets -2 .. 3; refuse to run if they ever part."""
    expected = [[0, 1, -2, 1], [0, -8, 15, -7], [12, 0, -28, 16], [0, 8, 20, -16], [0, -1, -6, 7], [0, 0, 1, -1]]
    if CUBIC_FIRST != -2 or CUBIC_LAST != 3 or (CUBIC * 12.0).round().tolist() != expected:
        raise RuntimeError("plugins.spectra.model.CUBIC changed: update the weights in _resample_kernel")


_check_cubic()


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
        _interpolate_exp_kernel[grid](table, table.stride(0), idx.contiguous(), weights, slopes, out, n_template,
                                      DERIVATIVES=derivatives, BLOCK=INTERPOLATE_BLOCK)
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
        _resample_kernel[grid](channels.contiguous(), kernel, dkernel, reach, u0.to(torch.float64).contiguous(),
                               shift.to(torch.float64).contiguous(), slope.to(torch.float64).contiguous(), out,
                               n_pixels, n_template, width, HALF=half, DERIVATIVES=derivatives,
                               BLOCK=RESAMPLE_BLOCK)
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
        _continuum_cross_kernel[grid](shifted, flux, weight, local, c32, bounds, chi2, blocks, n_pixels, ncoef,
                                      n_arms, D=terms, DP=padded, BLOCK=NORMAL_BLOCK)
        cross = blocks[..., :terms].permute(0, 2, 1, 3).reshape(b, 6, ncoef).to(torch.float64)
        projection = self.solve(gram, cross.transpose(1, 2)).to(torch.float32).contiguous()  # (B, ncoef, 6)
        sums = torch.empty((b, n_arms, 27), dtype=torch.float64, device=shifted.device)
        _projected_normal_kernel[grid](shifted, flux, weight, local, c32, projection, bounds, sums, n_pixels, ncoef,
                                       n_arms, D=terms, DP=padded, BLOCK=NORMAL_BLOCK)
        sums = sums.sum(1)
        upper = prep.constant("upper_pairs", np.array(_UPPER, dtype=np.int64))
        hessian = torch.zeros((b, 6, 6), dtype=torch.float64, device=shifted.device)
        hessian[:, upper[:, 0], upper[:, 1]] = sums[:, :21]
        hessian[:, upper[:, 1], upper[:, 0]] = sums[:, :21]
        return chi2.sum(1), coeffs, None, hessian, sums[:, 21:], None
