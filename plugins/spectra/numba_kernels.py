"""The model's hot loops compiled by Numba, parallel over spectra (the rest is NumPy, see ops.py).

Each kernel writes one spectrum's rows per iteration of its outer loop, so
the answer does not depend on the thread count. Every kernel is compiled
twice, serial and parallel: a parallel region costs a thread-pool wake-up
(tens of microseconds on an idle machine, milliseconds on a busy one),
which a batch of a few spectra does not repay.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from core.backends.numba_threads import jit
from plugins.spectra.ops import NumpyOps

PARALLEL_FROM = 4  # spectra: smaller batches run the serial kernels


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


def _broaden_at(x, kernel, j0):  # pragma: no cover - compiled
    # the rotational convolution evaluated only where the resampling reads it: at j0 and j0 + 1 of
    # every data pixel (about half the template's pixels), never the whole broadened template
    b_count, channels, n_template = x.shape
    n = j0.shape[1]
    width = kernel.shape[1]
    half = width // 2
    left = np.empty((b_count, channels, n))
    right = np.empty((b_count, channels, n))
    for b in prange(b_count):
        for i in range(n):
            for side in range(2):
                j = j0[b, i] + side
                lo = max(0, half - j)
                hi = min(width, n_template + half - j)
                for ch in range(channels):
                    acc = 0.0
                    for m in range(lo, hi):
                        acc += kernel[b, m] * x[b, ch, j + m - half]
                    if side == 0:
                        left[b, ch, i] = acc
                    else:
                        right[b, ch, i] = acc
    return left, right


_SERIAL = {"interpolate_exp": jit()(_interpolate_exp), "broaden_at": jit()(_broaden_at)}
_PARALLEL = {"interpolate_exp": jit(parallel=True)(_interpolate_exp), "broaden_at": jit(parallel=True)(_broaden_at)}


def _kernel(name: str, batch: int):
    return (_PARALLEL if batch >= PARALLEL_FROM else _SERIAL)[name]


class NumbaOps(NumpyOps):
    """NumPy float64 with Numba's fused interpolation and convolve-and-gather."""

    name = "numba"

    def interpolate_exp(self, table, idx, w, dw):
        derivatives = dw is not None
        if not derivatives:
            dw = np.zeros((idx.shape[0], idx.shape[1], 4))
        return _kernel("interpolate_exp", idx.shape[0])(
            table, np.ascontiguousarray(idx), np.ascontiguousarray(w, dtype=np.float64),
            np.ascontiguousarray(dw, dtype=np.float64), derivatives)

    def broaden_at(self, x, kernel, j0):
        return _kernel("broaden_at", x.shape[0])(np.ascontiguousarray(x, dtype=np.float64),
                                                 np.ascontiguousarray(kernel, dtype=np.float64),
                                                 np.ascontiguousarray(j0))
