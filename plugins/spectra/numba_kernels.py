"""The model's hot loops compiled by Numba, parallel over spectra (the rest is NumPy, see ops.py).

Each kernel writes one spectrum's rows per iteration of its outer loop, so
the answer does not depend on the thread count. Every kernel is compiled
twice, serial and parallel: a parallel region costs a thread-pool wake-up
(tens of microseconds on an idle machine, up to tens of milliseconds on a
busy one), which a batch of a few spectra does not repay.
"""

from __future__ import annotations

import types

import numpy as np
from numba import prange

from core.backends.numba_threads import jit, one_blas_thread
from plugins.spectra.model import CUBIC_FIRST
from plugins.spectra.ops import NumpyOps

# spectra: smaller batches run the serial kernels when nobody chose (a process worker's chunk). Each
# evaluation opens four parallel regions; on a busy 2-core VM a region waits 10-30 ms for a descheduled
# thread, which a batch of fewer than ~16 spectra (about 1 ms of work each per region) does not repay.
# spectra.fit's own numba:serial and numba:threads variants choose by measurement instead.
PARALLEL_FROM = 16


def _interpolate_exp(table, idx, w, dw, derivatives):  # pragma: no cover - compiled
    # per pixel, all 16 corners and 5 channels accumulate in registers; each output is written once
    b_count, corners = idx.shape
    pixels = table.shape[1]
    channels = 5 if derivatives else 1
    out = np.empty((b_count, channels, pixels))
    for b in prange(b_count):
        for j in range(pixels):
            acc = 0.0
            d0 = 0.0
            d1 = 0.0
            d2 = 0.0
            d3 = 0.0
            for c in range(corners):
                value = table[idx[b, c], j]
                acc += w[b, c] * value
                if derivatives:
                    d0 += dw[b, c, 0] * value
                    d1 += dw[b, c, 1] * value
                    d2 += dw[b, c, 2] * value
                    d3 += dw[b, c, 3] * value
            flux = np.exp(acc)
            out[b, 0, j] = flux
            if derivatives:
                out[b, 1, j] = flux * d0
                out[b, 2, j] = flux * d1
                out[b, 3, j] = flux * d2
                out[b, 4, j] = flux * d3
    return out


def _resample(channels, kernel, dk, shift, du_dv, u0, cubic, first, jac):  # pragma: no cover - compiled
    # broaden every template pixel the data pixels read (one contiguous span), shift, read by the cubic
    # (model.CUBIC: taps j0 + first, ...) and assemble the model and its derivatives in p's order:
    # value, v, vsini, teff, logg, feh, alpha
    b_count, n_channels, n_template = channels.shape
    n = u0.shape[0]
    width = kernel.shape[1]
    half = width // 2
    n_taps = cubic.shape[0]
    last = first + n_taps - 1
    low_u, high_u = u0.min(), u0.max()
    out = np.empty((b_count, 7 if jac else 1, n))
    for b in prange(b_count):
        # the span read: u = u0 - shift is monotonic in u0, so its ends come from u0's
        j_lo = int(np.floor(min(max(low_u - shift[b], -first), n_template - last - 1e-6))) + first
        j_hi = int(np.floor(min(max(high_u - shift[b], -first), n_template - last - 1e-6))) + last
        # per spectrum (one per thread, never shared): the broadened channels (row 5: the d kernel one),
        # kernel tap by tap over blocks of the span: an inner loop over contiguous pixels (SIMD) whose
        # block of output stays in the L1 cache while every tap adds to it
        broad = np.empty((6, n_template))
        for block in range(j_lo, j_hi + 1, 512):
            block_end = min(block + 512, j_hi + 1)
            for ch in range(6 if jac else 1):
                if ch >= n_channels and ch != 5:
                    continue
                source = channels[b, 0] if ch == 5 else channels[b, ch]
                weights = dk[b] if ch == 5 else kernel[b]
                target = broad[ch]
                for j in range(block, block_end):
                    target[j] = 0.0
                for m in range(width):
                    lo = max(block, half - m)  # zero beyond the template's ends, as ops.convolve pads
                    hi = min(block_end, n_template + half - m)
                    weight_m = weights[m]
                    # slices indexed from 0: a possibly negative index (Python's wrap-around, which
                    # Numba honours) would keep the loop scalar; this form vectorises, 7x faster
                    shifted = source[lo + m - half : hi + m - half]
                    out_block = target[lo:hi]
                    for q in range(hi - lo):
                        out_block[q] += weight_m * shifted[q]
        weight = np.empty(n_taps)
        slope = np.empty(n_taps)
        for i in range(n):
            u = min(max(u0[i] - shift[b], -first), n_template - last - 1e-6)
            j0 = int(np.floor(u))
            t = u - j0
            for o in range(n_taps):
                c = cubic[o]
                weight[o] = c[0] + t * (c[1] + t * (c[2] + t * c[3]))
                slope[o] = c[1] + t * (2.0 * c[2] + t * (3.0 * c[3]))
            start = j0 + first
            value = 0.0
            for o in range(n_taps):
                value += weight[o] * broad[0, start + o]
            out[b, 0, i] = value
            if jac:
                dv = 0.0
                dvsini = 0.0
                for o in range(n_taps):
                    dv += slope[o] * broad[0, start + o]
                    dvsini += weight[o] * broad[5, start + o]
                out[b, 1, i] = dv * du_dv[b]
                out[b, 2, i] = dvsini
                for k in range(4):
                    acc = 0.0
                    for o in range(n_taps):
                        acc += weight[o] * broad[1 + k, start + o]
                    out[b, 3 + k, i] = acc
    return out


def _profile(shifted, flux, weight, local, arm, n_arms, ridge, jac, keep):  # pragma: no cover - compiled
    # per spectrum: the continuum's normal equations (each pixel touches only its arm's degree + 1
    # Legendre columns), the linear solve, chi-square, and the projected Gauss-Newton normal equations
    b_count, _, n = shifted.shape
    d1 = local.shape[1]
    nc = n_arms * d1
    chi2 = np.empty(b_count)
    coeffs = np.empty((b_count, nc))
    model = np.empty((b_count, n))
    hessian = np.zeros((b_count, 6, 6))
    gradient = np.zeros((b_count, 6))
    jproj = np.empty((b_count if keep else 0, 6, n))
    for b in prange(b_count):
        gram = np.zeros((nc, nc))
        rhs = np.zeros(nc)
        for i in range(n):
            w = weight[b, i]
            if w == 0.0:
                continue
            t = shifted[b, 0, i]
            o = arm[i] * d1
            for x in range(d1):
                ax = local[i, x] * t
                rhs[o + x] += w * ax * flux[b, i]
                for y in range(d1):
                    gram[o + x, o + y] += w * ax * local[i, y] * t
        trace = 0.0
        for x in range(nc):
            trace += gram[x, x]
        for x in range(nc):
            if gram[x, x] <= 0.0:
                gram[x, x] = 1.0  # an arm without usable pixels: its coefficients are pinned to 0
            gram[x, x] += ridge * trace / nc + 1e-300
        c = np.linalg.solve(gram, rhs)
        coeffs[b] = c
        total = 0.0
        for i in range(n):
            o = arm[i] * d1
            cont = 0.0
            for x in range(d1):
                cont += local[i, x] * c[o + x]
            m = cont * shifted[b, 0, i]
            model[b, i] = m
            r = flux[b, i] - m
            total += weight[b, i] * r * r
        chi2[b] = total
        if not jac:
            continue
        cross = np.zeros((nc, 6))
        for i in range(n):
            w = weight[b, i]
            if w == 0.0:
                continue
            o = arm[i] * d1
            cont = model[b, i] / shifted[b, 0, i] if shifted[b, 0, i] != 0.0 else 0.0
            for x in range(d1):
                ax = w * local[i, x] * shifted[b, 0, i]
                for k in range(6):
                    cross[o + x, k] += ax * cont * shifted[b, 1 + k, i]
        proj = np.linalg.solve(gram, cross)
        column = np.empty(6)
        for i in range(n):
            o = arm[i] * d1
            t = shifted[b, 0, i]
            cont = model[b, i] / t if t != 0.0 else 0.0
            for k in range(6):
                back = 0.0
                for x in range(d1):
                    back += local[i, x] * proj[o + x, k]
                column[k] = cont * shifted[b, 1 + k, i] - t * back
                if keep:
                    jproj[b, k, i] = column[k]
            w = weight[b, i]
            if w == 0.0:
                continue
            r = flux[b, i] - model[b, i]
            for k in range(6):
                gradient[b, k] += w * column[k] * r
                for q in range(6):
                    hessian[b, k, q] += w * column[k] * column[q]
    return chi2, coeffs, model, hessian, gradient, jproj


_NAMES = {"interpolate_exp": _interpolate_exp, "resample": _resample, "profile": _profile}


def _variant(fn, suffix: str):
    """A copy of ``fn`` under its own name: Numba's on-disk cache is keyed by the function's qualified
    name, so a serial and a parallel build of one function would otherwise overwrite each other's entry
    (and a serial call could load the parallel machine code, thread pool and all)."""
    clone = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + suffix, fn.__defaults__, fn.__closure__)
    clone.__qualname__ = fn.__qualname__ + suffix
    return clone


_SERIAL = {name: jit()(_variant(fn, "_serial")) for name, fn in _NAMES.items()}
_PARALLEL = {name: jit(parallel=True)(_variant(fn, "_parallel")) for name, fn in _NAMES.items()}

class NumbaOps(NumpyOps):
    """NumPy float64 with Numba's kernels for everything that scales with the batch's pixels.

    ``parallel``: True runs the threaded kernels (the serial ones on one spectrum), False the serial ones,
    None chooses by batch size.
    """

    name = "numba"

    def __init__(self, parallel: bool | None = None) -> None:
        super().__init__()
        self.parallel = parallel

    def _kernel(self, name: str, batch: int):
        # one spectrum runs on one thread either way, and a parallel region only adds its wake-up: on the H200
        # host numba:threads fitted one spectrum in 10 ms where numba:serial, the same loops, took 7 (48 % regret
        # where the loop kept threads). The active set shrinks to one as a batch converges, too
        parallel = batch >= PARALLEL_FROM if self.parallel is None else self.parallel and batch > 1
        return (_PARALLEL if parallel else _SERIAL)[name]

    def matmul(self, a, b):
        """``a @ b`` by BLAS on one thread: the threads belong to Numba's kernels (see ``one_blas_thread``)."""
        with one_blas_thread():
            return a @ b

    def interpolate_exp(self, table, idx, w, dw):
        derivatives = dw is not None
        if not derivatives:
            dw = np.zeros((idx.shape[0], idx.shape[1], 4))
        return self._kernel("interpolate_exp", idx.shape[0])(
            table, np.ascontiguousarray(idx), np.ascontiguousarray(w, dtype=np.float64),
            np.ascontiguousarray(dw, dtype=np.float64), derivatives)

    def resample(self, u0, channels, kernel, dk, shift, du_dv, cubic):
        jac = dk is not None
        f64 = np.float64
        return self._kernel("resample", channels.shape[0])(
            np.ascontiguousarray(channels, dtype=f64), np.ascontiguousarray(kernel, dtype=f64),
            np.ascontiguousarray(dk if jac else kernel, dtype=f64), np.ascontiguousarray(shift, dtype=f64),
            np.ascontiguousarray(du_dv, dtype=f64), np.ascontiguousarray(u0, dtype=f64),
            np.ascontiguousarray(cubic, dtype=f64), CUBIC_FIRST, jac)

    def profile(self, prep, shifted, flux, weight, jac, keep_jacobian, ridge):
        """model.profile's answer as a tuple: chi2, coeffs, model, hessian, gradient, jproj (None where not asked)."""
        chi2, coeffs, model, hessian, gradient, jproj = self._kernel("profile", shifted.shape[0])(
            np.ascontiguousarray(shifted, dtype=np.float64), np.ascontiguousarray(flux, dtype=np.float64),
            np.ascontiguousarray(weight, dtype=np.float64), np.ascontiguousarray(prep.local_basis, dtype=np.float64),
            prep.arm, len(prep.arm_slices), ridge, jac, keep_jacobian)
        if not jac:
            return chi2, coeffs, model, None, None, None
        return chi2, coeffs, model, hessian, gradient, (jproj if keep_jacobian else None)
