"""Torch implementations of gradient-descent linear regression: one epoch, run three ways.

The data go to the device once per solve as float32 (half the bytes of
float64: the epoch is bound by memory bandwidth), for eager and compile laid
out as ``[blocks, block]`` (x as ``[d, blocks, block]``, one slab per feature)
and padded with NaN; every arithmetic step is float64,
so the trajectory matches the float64 reference (the rounding of x and y
to float32 moves the final ``(w, b)`` by about 1e-10 relative on the
preset). The sums are a deterministic two-stage reduction: stage one sums
each block (a fixed-shape reduction), stage two sums the block partials in
a fixed order; no atomics, so every run gives the same bits.

- ``eager``: the epoch function op by op (several kernels an epoch);
- ``compile``: the same function through ``torch.compile`` (Inductor fuses
  stage one into one pass that reads x and y once; Triton on a GPU);
- ``graph``: every epoch as two Triton kernels (``linreg_triton``: a
  streaming stage one, a one-program stage two), all of them captured in
  one CUDA graph and replayed with a single launch. Its kernels fit one
  feature without weights; other problems are excluded from it (see
  :func:`unsupported`), and eager and compile run them.

Storing in float32 needs every value of X, y and the weights within
float32's range (3.4e38): beyond it a value becomes inf and the loss NaN,
where float64 is finite. Such problems are excluded from every torch
variant, with the reason shown.

No variant synchronises with the host between epochs: parameters and the
loss curve stay on the device until the end of the solve.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from plugins.ml.linreg_numpy import outputs
from plugins.ml.linreg_problem import FLOAT32_MAX, LinRegProblem

# samples per stage-one block: the smallest power of two that makes at most TARGET_BLOCKS blocks (128-256,
# enough to keep every SM of a GPU busy), within MIN_BLOCK..MAX_BLOCK. On an H200 the preset's 4M-point
# epoch replayed in 2.73 ms at 16,384 (245 blocks) against 3.92 ms at 4,096 (977 blocks): docs/ml.md.
MIN_BLOCK, MAX_BLOCK, TARGET_BLOCKS = 1024, 16_384, 256
VARIANTS = ("eager", "compile", "graph")


def epoch(x, y, state, scalars, weights=None):
    """One pass at ``state = (w_1 .. w_d, b)``: (the next state, the loss at ``state``).

    ``x`` is ``[d, blocks, block]``, ``y`` and ``weights`` (None: every weight 1) ``[blocks, block]``;
    ``scalars = (1 / total weight, learning rate)``.
    """
    import torch

    padding = torch.isnan(y)
    xd = torch.where(padding, 0.0, x.double())  # padding contributes nothing to any of the sums
    # one feature: w x itself, without the sum over one slab (one kernel fewer an epoch for eager)
    predicted = state[0] * xd[0] if xd.shape[0] == 1 else (state[:-1, None, None] * xd).sum(0)
    err = torch.where(padding, 0.0, predicted + state[-1] - y.double())
    weighted = err if weights is None else torch.where(padding, 0.0, weights.double()) * err
    # stage one: [d + 2, blocks] (sum s err^2, sum s err x_j, sum s err)
    partial = torch.cat(((weighted * err).sum(1)[None], (weighted * xd).sum(2), weighted.sum(1)[None]))
    total = partial.sum(1) * scalars[0]  # stage two: the means
    gradient = 2.0 * total[1:]
    return state - scalars[1] * gradient, total[0]


def advance(x, y, state, scalars, losses, counter, weights=None) -> None:
    """One epoch in place: ``state`` steps, ``losses[counter]`` gets the loss, ``counter`` counts up.

    Everything stays on the device, and compiled it is two kernels an epoch
    (stage one; stage two fused with the updates), not a kernel per small copy.
    """
    new_state, loss = epoch(x, y, state, scalars, weights)
    losses.index_put_((counter,), loss.reshape(1))
    state.copy_(new_state)
    counter.add_(1)


@functools.cache
def compiled_advance():
    """The in-place epoch through torch.compile, once per process (dynamic: one compile serves every size)."""
    from core.backends.torch_gpu import compile_in_process

    return compile_in_process(advance, dynamic=True, fullgraph=True)


def block_size(n_samples: int) -> int:
    """The stage-one block for ``n_samples``: a power of two giving about TARGET_BLOCKS blocks, within bounds."""
    wanted = max(1, math.ceil(n_samples / TARGET_BLOCKS))
    return int(min(MAX_BLOCK, max(MIN_BLOCK, 1 << (wanted - 1).bit_length())))


def layout(n_samples: int) -> tuple[int, int]:
    """(blocks, block) of the padded ``[blocks, block]`` layout of ``n_samples`` values."""
    block = block_size(n_samples)
    return math.ceil(n_samples / block), block


def upload(X: np.ndarray, y: np.ndarray, device: Any, weights: np.ndarray | None = None):
    """x as a NaN-padded float32 ``[d, blocks, block]`` tensor, y (and the weights, if any) as ``[blocks, block]``.

    A 1-D X is one feature. Padded and converted on the device
    (:func:`to_device`): the host holds no copy.
    """
    import torch

    X = X.reshape(len(X), -1)
    blocks, block = layout(len(X))
    padded = torch.full((X.shape[1], blocks * block), torch.nan, dtype=torch.float32, device=device)
    padded[:, :len(X)] = to_device(X, device).T
    tensors = [padded.view(X.shape[1], blocks, block)]
    for values in (y, weights) if weights is not None else (y,):
        padded = torch.full((blocks * block,), torch.nan, dtype=torch.float32, device=device)
        padded[:len(values)] = to_device(values, device)
        tensors.append(padded.view(blocks, block))
    return tensors


def to_device(values: np.ndarray, device: Any):
    """``values`` on the device in float32, converted on the host as the pinned copy is filled.

    The torch variants' cost at large sizes is this copy: from pageable
    memory, about 2 ns a sample on the H200 host at every size from 1M to
    16M samples (X and y in float64), where their epochs cost next to
    nothing (``docs/results/gpu-2026-11-27l/a-graph-probe.txt``). Through
    pinned memory filled by several threads, in float32
    (:func:`core.backends.torch_upload.upload`), half the bytes cross the bus
    and the host's copy runs on several cores. The rounding is the one the
    device's conversion made before. (A float32 copy of the data made on the
    host for each solve, as before that, paged its memory in afresh past
    glibc's reused blocks: 1.8-2.5x the model at 16M-32M samples.)
    """
    import torch

    from core.backends.torch_upload import upload

    return upload(values, device, torch.float32)


def _initial(problem: LinRegProblem, device: Any):
    """(state, scalars, losses, counter) of a run's start, on ``device``."""
    import torch

    state = torch.tensor([*problem.coef0(), problem.b0], dtype=torch.float64, device=device)
    scalars = torch.tensor([1.0 / problem.weight_total(), problem.learning_rate], dtype=torch.float64, device=device)
    losses = torch.empty(problem.n_epochs, dtype=torch.float64, device=device)
    return state, scalars, losses, torch.zeros(1, dtype=torch.int64, device=device)


def run_epochs(step, x, y, state, scalars, losses, counter, weights=None) -> None:
    """Every epoch, in place on the device: no value comes back to the host here."""
    extra = () if weights is None else (weights,)  # the Triton step takes no weights (one unweighted feature)
    for _ in range(losses.shape[0]):
        step(x, y, state, scalars, losses, counter, *extra)


def _finish(problem: LinRegProblem, state, losses) -> dict[str, np.ndarray]:
    import torch

    packed = torch.cat([state, losses]).cpu().numpy()  # one device-to-host copy at the very end
    d = problem.n_features
    return outputs(packed[:d], packed[d], packed[d + 1:], problem.n_epochs)


def solve_on(problem: LinRegProblem, device: Any, variant: str) -> dict[str, np.ndarray]:
    """Run ``variant`` (eager, compile, graph) on ``device`` (tests run eager and compile on the CPU)."""
    if variant == "graph":
        return _solve_graph(problem, device)
    x, y, *weights = upload(*problem.data(), device, problem.sample_weight)
    state, scalars, losses, counter = _initial(problem, device)
    run_epochs(advance if variant == "eager" else compiled_advance(), x, y, state, scalars, losses, counter,
               *weights)
    return _finish(problem, state, losses)


class _CapturedRun:
    """Static buffers and the CUDA graph of every epoch of one (size, epochs) shape (Triton's epoch)."""

    def __init__(self, n: int, n_epochs: int, device: Any):
        import torch

        from plugins.ml.linreg_triton import epoch_step

        self.x = torch.zeros(n, dtype=torch.float32, device=device)
        self.y = torch.zeros(n, dtype=torch.float32, device=device)
        self.state = torch.zeros(2, dtype=torch.float64, device=device)
        self.scalars = torch.ones(2, dtype=torch.float64, device=device)
        self.losses = torch.zeros(n_epochs, dtype=torch.float64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        step = epoch_step(n, device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile and warm up outside the capture, as capturing requires
            for _ in range(2):
                step(self.x, self.y, self.state, self.scalars, self.losses, self.counter)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.counter.zero_()  # in the graph: every replay writes losses[0], losses[1], ...
            run_epochs(step, self.x, self.y, self.state, self.scalars, self.losses, self.counter)


_captured: dict[tuple, _CapturedRun] = {}


def _solve_graph(problem: LinRegProblem, device: Any) -> dict[str, np.ndarray]:
    import torch

    X, y = problem.data()
    X = X[:, 0]  # one feature: unsupported() keeps every other problem away from the Triton epoch
    key = (len(X), problem.n_epochs, str(device))
    if key not in _captured:
        _captured.clear()  # one captured shape at a time: its buffers hold the data's size on the device
        _captured[key] = _CapturedRun(len(X), problem.n_epochs, device)
    run = _captured[key]
    for buffer, values in ((run.x, X), (run.y, y)):
        buffer.copy_(to_device(values, device))  # converted on the device (to_device)
    state, scalars, _, _ = _initial(problem, device)
    run.state.copy_(state)
    run.scalars.copy_(scalars)
    run.graph.replay()
    torch.cuda.current_stream().synchronize()
    return _finish(problem, run.state, run.losses)


def solve_torch(problem: LinRegProblem, variant: str) -> dict[str, np.ndarray]:
    """The ``torch:<variant>`` implementation on the torch backend's GPU."""
    from core.backends.torch_gpu import device

    return solve_on(problem, device(), variant)


def unsupported(problem: LinRegProblem, implementation: str) -> str:
    """Why a torch variant cannot run here: float64 needs CUDA (MPS has none), and so do CUDA graphs."""
    import importlib.util

    from core.backends.torch_gpu import cuda_available

    if not cuda_available():
        return "float64 accumulation and CUDA graphs need a CUDA device"
    return unsupported_problem(problem, implementation) or (
        "the graph variant's epoch is a Triton kernel, and triton is not installed"
        if implementation == "torch:graph" and importlib.util.find_spec("triton") is None else "")


def unsupported_problem(problem: LinRegProblem, implementation: str) -> str:
    """Why a torch variant cannot run this problem on any device, or "" (no torch import: the tests call it)."""
    largest = problem.largest_magnitude()
    if largest > FLOAT32_MAX:
        return (f"the data hold values up to {largest:.3g}, beyond float32's range ({FLOAT32_MAX:.3g}) in which "
                "the torch variants store them (float64 backends run it)")
    if implementation == "torch:graph" and (problem.n_features > 1 or problem.weighted):
        return "the graph variant's Triton epoch fits one feature without sample weights (torch:eager runs it)"
    return ""
