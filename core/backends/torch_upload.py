"""Large host arrays to a CUDA device through pinned memory that several threads fill.

From pageable memory the driver copies through its own staging buffer on
one thread, at about 6-8 GB/s on the H200 host: a batch of 4,096 spectra
(260 MB of float32) took 41 ms, and linreg's torch variants spent about
2 ns a sample of a solve copying X and y (float64) at every size. One
thread filling a pinned buffer did little better (38 ms for the spectra):
the host's copy, not the bus, was the limit. Here several threads copy
the array into a pinned buffer, converting it to the dtype asked for as
they go, and one asynchronous copy takes it to the device (15 ms for the
spectra).

Two pinned buffers per dtype are kept per process and used in turn, grown
to the largest array seen (pinning memory is slow: once per size); a
buffer's last copy to the device is waited for before it is filled again,
so two arrays of one call (linreg's X and y) overlap their copies.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

UPLOAD_FROM = 1 << 22  # arrays of at least this many bytes go through pinned memory; smaller ones as they are
UPLOAD_THREADS = 8  # threads filling a pinned buffer (numpy copies without the GIL, so they run together)

_staging: dict[Any, dict[str, Any]] = {}
_pool: list[ThreadPoolExecutor] = []


def upload(values: np.ndarray, device: Any, dtype: Any) -> Any:
    """``values`` as a ``dtype`` tensor on ``device`` (the copy may still be in flight on the current stream).

    Large floating-point arrays on a CUDA device go through a pinned buffer
    (the module's docstring); anything else is copied as torch copies it.
    The values are converted as numpy converts them (round to nearest), the
    same as a conversion on the device. Where no pinned memory can be had,
    it warns and copies from pageable memory.
    """
    import torch

    if (getattr(device, "type", str(device)) != "cuda" or values.nbytes < UPLOAD_FROM
            or values.dtype.kind != "f"):
        return _as_torch_copies(values, device, dtype)
    source = np.ascontiguousarray(values).reshape(-1)
    try:
        buffer, copied = _next_buffer(torch, dtype, source.size)
    except RuntimeError as error:  # no pinned memory to be had (the driver's limit): the pageable copy still works
        warnings.warn(f"pinned host memory for a {values.nbytes / 2**20:.0f} MiB upload failed ({error}); "
                      "copying from pageable memory", RuntimeWarning, stacklevel=2)
        return _as_torch_copies(values, device, dtype)
    out = torch.empty(values.shape, dtype=dtype, device=device)
    copied.synchronize()  # this buffer's previous copy to the device has finished
    target = buffer.numpy()
    bounds = np.linspace(0, source.size, UPLOAD_THREADS + 1).astype(np.int64)

    def fill(part: int) -> None:
        target[bounds[part]:bounds[part + 1]] = source[bounds[part]:bounds[part + 1]]

    list(_threads().map(fill, range(UPLOAD_THREADS)))
    out.view(-1).copy_(buffer[:source.size], non_blocking=True)
    copied.record()
    return out


def _as_torch_copies(values: np.ndarray, device: Any, dtype: Any) -> Any:
    import torch

    with warnings.catch_warnings():
        # a problem's arrays are read-only; the tensor over them is only read, by the copy to the device
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        host = torch.as_tensor(np.ascontiguousarray(values))
    return host.to(device=device, dtype=dtype, non_blocking=True)


def _threads() -> ThreadPoolExecutor:
    if not _pool:
        _pool.append(ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="crossover-upload"))
    return _pool[0]


def _next_buffer(torch: Any, dtype: Any, size: int) -> tuple[Any, Any]:
    """The next of two pinned host buffers of at least ``size`` elements, with the event of its last copy."""
    slots = _staging.setdefault(dtype, {"turn": 0, "slots": [None, None]})
    turn = slots["turn"]
    slots["turn"] = 1 - turn
    held = slots["slots"][turn]
    if held is None or held[0].numel() < size:
        if held is not None:
            held[1].synchronize()
        held = slots["slots"][turn] = (torch.empty(size, dtype=dtype, pin_memory=True), torch.cuda.Event())
    return held
