"""core.backends.torch_upload: large host arrays to the GPU through pinned buffers that several threads fill."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from core.backends.torch_upload import UPLOAD_FROM, upload  # noqa: E402


def test_off_a_cuda_device_an_array_is_copied_as_torch_copies_it_in_the_dtype_asked_for():
    values = np.random.default_rng(0).normal(size=(300, 3))
    values.setflags(write=False)  # a problem's arrays are read-only: no warning for a tensor only read
    out = upload(values, torch.device("cpu"), torch.float32)
    assert out.dtype == torch.float32 and out.shape == (300, 3)
    assert np.array_equal(out.numpy(), values.astype(np.float32))


@pytest.mark.gpu
def test_large_arrays_arrive_whole_and_rounded_as_on_the_device_while_the_buffers_are_reused_and_grown():
    rng = np.random.default_rng(1)
    device = torch.device("cuda")
    sizes = [UPLOAD_FROM // 8 + 17, UPLOAD_FROM // 8 + 5, 3 * UPLOAD_FROM // 8 + 1]  # two buffers, then a larger one
    arrays = [rng.normal(size=n) * 1e3 for n in sizes] + [rng.normal(size=(UPLOAD_FROM // 16, 3))]
    sent = [upload(values, device, torch.float32) for values in arrays]  # copies in flight while others fill
    torch.cuda.synchronize()
    for values, out in zip(arrays, sent):
        expected = torch.from_numpy(values).to(device).to(torch.float32)  # the device's own conversion
        assert out.shape == values.shape and torch.equal(out, expected)
    again = upload(arrays[0], device, torch.float64)  # another dtype has buffers of its own
    assert torch.equal(again, torch.from_numpy(arrays[0]).to(device))


@pytest.mark.gpu
def test_without_pinned_memory_an_upload_warns_and_copies_from_pageable_memory(monkeypatch):
    from core.backends import torch_upload

    def no_pinned(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(torch_upload, "_next_buffer", no_pinned)
    values = np.random.default_rng(2).normal(size=UPLOAD_FROM // 8 + 3)
    with pytest.warns(RuntimeWarning, match="pinned host memory"):
        out = upload(values, torch.device("cuda"), torch.float32)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.from_numpy(values).to("cuda").to(torch.float32))


def test_the_fallback_to_pageable_memory_is_taken_where_pinning_fails(monkeypatch):
    """The control flow of the test above, on any machine: a large array bound for a CUDA device whose pinned
    buffer cannot be had goes the pageable way, with a warning."""
    from types import SimpleNamespace

    from core.backends import torch_upload

    def no_pinned(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    taken = []
    monkeypatch.setattr(torch_upload, "_next_buffer", no_pinned)
    monkeypatch.setattr(torch_upload, "_as_torch_copies", lambda values, device, dtype: taken.append(values) or "sent")
    values = np.zeros(UPLOAD_FROM // 8 + 3)
    with pytest.warns(RuntimeWarning, match="pinned host memory"):
        assert upload(values, SimpleNamespace(type="cuda"), torch.float32) == "sent"
    assert taken and taken[0] is values
