"""The model's three hot loops compiled by Numba, parallel over spectra (the rest is NumPy, see ops.py).

Each kernel writes one spectrum's rows per iteration of a ``prange``, so the
answer does not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from core.backends.numba_threads import jit
from plugins.spectra.ops import NumpyOps


@jit(parallel=True)
def _interpolate(table, idx, w, dw, channels):  # pragma: no cover - compiled
    b_count, corners = idx.shape
    pixels = table.shape[1]
    out = np.zeros((b_count, channels, pixels))
    for b in prange(b_count):
        for c in range(corners):
            row = idx[b, c]
            wc = w[b, c]
            for j in range(pixels):
                value = table[row, j]
                out[b, 0, j] += wc * value
                for k in range(channels - 1):
                    out[b, 1 + k, j] += dw[b, c, k] * value
    return out


@jit(parallel=True)
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


@jit(parallel=True)
def _convolve(x, kernel):  # pragma: no cover - compiled
    b_count, channels, n = x.shape
    width = kernel.shape[1]
    half = width // 2
    out = np.zeros_like(x)
    for b in prange(b_count):
        for ch in range(channels):
            for j in range(n):
                acc = 0.0
                lo = max(0, half - j)
                hi = min(width, n + half - j)
                for m in range(lo, hi):
                    acc += kernel[b, m] * x[b, ch, j + m - half]
                out[b, ch, j] = acc
    return out


@jit(parallel=True)
def _gather_pairs(x, j0):  # pragma: no cover - compiled
    b_count, channels, _ = x.shape
    n = j0.shape[1]
    left = np.empty((b_count, channels, n))
    right = np.empty((b_count, channels, n))
    for b in prange(b_count):
        for ch in range(channels):
            for i in range(n):
                left[b, ch, i] = x[b, ch, j0[b, i]]
                right[b, ch, i] = x[b, ch, j0[b, i] + 1]
    return left, right


class NumbaOps(NumpyOps):
    """NumPy float64 with Numba's interpolation, convolution and gather."""

    name = "numba"

    def interpolate(self, table, idx, w, dw):
        if dw is None:
            dw = np.zeros((idx.shape[0], idx.shape[1], 0))
            channels = 1
        else:
            channels = 1 + dw.shape[2]
        return _interpolate(table, np.ascontiguousarray(idx), np.ascontiguousarray(w, dtype=np.float64),
                            np.ascontiguousarray(dw, dtype=np.float64), channels)

    def interpolate_exp(self, table, idx, w, dw):
        derivatives = dw is not None
        if not derivatives:
            dw = np.zeros((idx.shape[0], idx.shape[1], 4))
        return _interpolate_exp(table, np.ascontiguousarray(idx), np.ascontiguousarray(w, dtype=np.float64),
                                np.ascontiguousarray(dw, dtype=np.float64), derivatives)

    def convolve(self, x, kernel):
        return _convolve(np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(kernel, dtype=np.float64))

    def gather_pairs(self, x, j0):
        return _gather_pairs(np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(j0))
