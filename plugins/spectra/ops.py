"""The few array operations the spectrum model needs, once per array library.

The model (:mod:`plugins.spectra.model`) and the batched fit
(:mod:`plugins.spectra.fit`) are written once against this small interface;
NumPy, Numba and PyTorch each supply it. Everything elementwise comes from
``ops.xp`` (``numpy`` or ``torch``: both spell ``exp``, ``where``,
``einsum`` and ``floor`` alike); what the two spell differently, and the
hot loops (template interpolation, the rotational convolution read at the
template pixels around each resampled pixel), are methods here.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np


class NumpyOps:
    """Plain NumPy, float64: the reference arithmetic."""

    name = "numpy"
    xp = np

    def __init__(self, dtype: Any = np.float64):
        self.dtype = dtype

    # -- creation and conversion --
    def asarray(self, x: Any, dtype: Any = None) -> np.ndarray:
        return np.asarray(x, dtype=self.dtype if dtype is None else dtype)

    def asint(self, x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.int64)

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray:
        return np.zeros(shape, dtype=self.dtype if dtype is None else dtype)

    def arange(self, n: int) -> np.ndarray:
        return np.arange(n)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def float64(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64, copy=False)

    def cast(self, x: np.ndarray) -> np.ndarray:
        return x.astype(self.dtype, copy=False)

    # -- spelled differently in torch --
    def clip(self, x, lo, hi):
        return np.clip(x, lo, hi)

    def take_along(self, x: np.ndarray, idx: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.take_along_axis(x, idx, axis=axis)

    def solve(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Batched a x = b for b of shape (..., n) or (..., n, k)."""
        if b.ndim == a.ndim - 1:
            return np.linalg.solve(a, b[..., None])[..., 0]
        return np.linalg.solve(a, b)

    def inv(self, a: np.ndarray) -> np.ndarray:
        return np.linalg.inv(a)

    def eye(self, n: int) -> np.ndarray:
        return np.eye(n)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a @ b

    def argmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        return np.argmax(x, axis=axis)

    def maximum(self, a, b):
        return np.maximum(a, b)

    def vsini_bound(self, vsini: Any) -> float:
        """The largest vsini of a batch, on the host: it sizes the batch's rotation kernels (a wait for a device)."""
        return float(self.xp.max(vsini))

    def nanmedian(self, x: np.ndarray) -> np.ndarray:
        """The median of each row's values that are not NaN (NaN for a row of NaN)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice": a row without a usable pixel
            return np.nanmedian(x, axis=1)

    # -- the hot loops --
    def interpolate(self, table: np.ndarray, idx: np.ndarray, w: np.ndarray, dw: np.ndarray | None) -> np.ndarray:
        """sum_c w[b, c] table[idx[b, c]] -> (B, 1, P); with ``dw`` also its 4 derivatives -> (B, 5, P)."""
        channels = 1 if dw is None else 1 + dw.shape[2]
        out = np.zeros((idx.shape[0], channels, table.shape[1]), dtype=self.dtype)
        for c in range(idx.shape[1]):
            rows = table[idx[:, c]]
            out[:, 0] += w[:, c, None] * rows
            if dw is not None:
                out[:, 1:] += dw[:, c, :, None] * rows[:, None, :]
        return out

    def interpolate_exp(self, table, idx, w, dw):
        """The template channels: F = exp(interpolated ln F), and F * d ln F / d theta_k with ``dw``."""
        logf = self.interpolate(table, idx, w, dw)
        flux = self.xp.exp(logf[:, :1])
        if dw is None:
            return flux
        logf[:, 1:] *= flux
        logf[:, :1] = flux
        return logf

    def convolve(self, x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
        """Same-size convolution of x (B, C, P) with each row's symmetric kernel (B, K), zero beyond the ends."""
        half = kernel.shape[1] // 2
        if half == 0:
            return x * kernel[:, :1, None]
        padded = np.concatenate([np.zeros((*x.shape[:2], half), x.dtype), x,
                                 np.zeros((*x.shape[:2], half), x.dtype)], axis=2)
        out = np.zeros_like(x)
        n = x.shape[2]
        for m in range(kernel.shape[1]):
            out += kernel[:, m, None, None] * padded[:, :, m : m + n]
        return out

    def cat(self, arrays, axis: int):
        return np.concatenate(arrays, axis=axis)

    def add_product(self, acc: np.ndarray | None, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``acc + a * b`` (broadcasting), or ``a * b`` where ``acc`` is None."""
        return a * b if acc is None else acc + a * b

    def gather(self, x: np.ndarray, index: np.ndarray) -> np.ndarray:
        """x (B, C, P) at template pixels ``index`` (B, N), the same for every channel -> (B, C, N)."""
        return np.take_along_axis(x, np.broadcast_to(index[:, None, :], (x.shape[0], x.shape[1], index.shape[1])),
                                  axis=2)


class TorchOps(NumpyOps):
    """PyTorch on ``device`` (a GPU for the registered backend, the CPU in development), float32 by default."""

    name = "torch"

    def __init__(self, device: Any = "cpu", dtype: Any = None):
        import torch

        self.torch = torch
        self.xp = torch
        self.device = torch.device(device)
        self.dtype = torch.float32 if dtype is None else dtype

    def asarray(self, x: Any, dtype: Any = None):
        torch = self.torch
        dtype = self.dtype if dtype is None else dtype
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=dtype)
        return torch.as_tensor(np.asarray(x), device=self.device, dtype=dtype)

    def asint(self, x: Any):
        return self.asarray(x, dtype=self.torch.int64)

    def zeros(self, shape, dtype=None):
        return self.torch.zeros(shape, dtype=self.dtype if dtype is None else dtype, device=self.device)

    def arange(self, n: int):
        return self.torch.arange(n, device=self.device)

    def to_numpy(self, x):
        if isinstance(x, self.torch.Tensor):
            return x.detach().cpu().numpy()
        return np.asarray(x)

    def float64(self, x):
        return x.to(self.torch.float64)

    def cast(self, x):
        return x.to(self.dtype)

    def clip(self, x, lo, hi):
        return self.torch.clamp(x, lo, hi)

    def take_along(self, x, idx, axis=-1):
        return self.torch.take_along_dim(x, idx, dim=axis)

    # the _ex forms skip the singularity check, which waits for the device on every call; the systems here
    # are ridged or damped, and a failed one gives non-finite values that the fit rejects like a bad step
    def solve(self, a, b):
        if b.ndim == a.ndim - 1:
            return self.torch.linalg.solve_ex(a, b[..., None])[0][..., 0]
        return self.torch.linalg.solve_ex(a, b)[0]

    def inv(self, a):
        return self.torch.linalg.inv_ex(a)[0]

    def eye(self, n: int):
        return self.torch.eye(n, dtype=self.torch.float64, device=self.device)

    def cat(self, arrays, axis: int):
        return self.torch.cat(arrays, dim=axis)

    def argmax(self, x, axis: int):
        return self.torch.argmax(x, dim=axis)

    def maximum(self, a, b):
        torch = self.torch
        if not isinstance(b, torch.Tensor):
            return torch.clamp_min(a, b)  # a number stays on the host: no copy to the device per call
        return torch.maximum(a, b)

    def nanmedian(self, x):
        # numpy's rule (the mean of the two middle values for an even count), not torch.nanmedian's
        # lower middle value, so that every backend clips the same pixels: NaN sorts last
        torch = self.torch
        count = torch.sum(~torch.isnan(x), 1, keepdim=True)
        ordered = torch.sort(x, 1).values
        low = torch.gather(ordered, 1, torch.clamp((count - 1) // 2, min=0))
        high = torch.gather(ordered, 1, torch.clamp(count // 2, max=x.shape[1] - 1))
        return torch.where(count > 0, (low + high) / 2, torch.nan)[:, 0]

    def interpolate(self, table, idx, w, dw, rows_per_chunk: int = 256):
        # gather the 16 corner rows of a chunk of spectra and contract them with one batched matmul:
        # the rows are read once, not once per output channel as 16 separate axpys would
        torch = self.torch
        weights = w[:, None, :] if dw is None else torch.cat([w[:, None, :], dw.transpose(1, 2)], dim=1)
        out = torch.empty((idx.shape[0], weights.shape[1], table.shape[1]), dtype=self.dtype, device=self.device)
        for start in range(0, idx.shape[0], rows_per_chunk):
            sl = slice(start, start + rows_per_chunk)
            corners = table.index_select(0, idx[sl].reshape(-1)).reshape(-1, idx.shape[1], table.shape[1])
            torch.bmm(weights[sl], corners, out=out[sl])
        return out

    def convolve(self, x, kernel):
        # a grouped conv1d: every (spectrum, channel) row with its spectrum's kernel (cuDNN on a GPU)
        import torch.nn.functional as F

        b, c, n = x.shape
        half = kernel.shape[1] // 2
        if half == 0:
            return x * kernel[:, :1, None]
        weight = kernel[:, None, None, :].expand(b, c, 1, kernel.shape[1]).reshape(b * c, 1, -1)
        out = F.conv1d(x.reshape(1, b * c, n), weight, padding=half, groups=b * c)
        return out.reshape(b, c, n)

    def add_product(self, acc, a, b):
        return a * b if acc is None else self.torch.addcmul(acc, a, b)  # one launch, not two

    def gather(self, x, index):
        return self.torch.gather(x, 2, index[:, None, :].expand(x.shape[0], x.shape[1], index.shape[1]))
