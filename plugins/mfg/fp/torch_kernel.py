"""Torch FP solver: particles, random numbers and densities stay on the GPU.

Two implementations compute the same thing, each keyed on its own
(``torch:fused``, ``torch:eager``) so the cost model measures and chooses:

- ``fused=True``: ONE Triton kernel launch runs every time step. Each
  program keeps its block of particles in registers for the whole solve,
  draws its normals with Philox (four per draw, for four steps),
  interpolates the drift, wraps or reflects, and deposits the
  linear-binning mass into one of ``SLOTS`` private copies of the
  histogram, so a few bins are never hammered by every thread at once. It needs CUDA and Triton, and a problem
  an all-steps kernel can run (:func:`fused_unsupported` says why not).
- ``fused=False`` (eager): the same step as whole-array torch operations,
  with the histogram scattered into the same slotted buffer; it runs every
  problem on CUDA or MPS.

Either way the host receives only the finished (Nt+1, Nx) density.

Both deposit in int64 fixed point (:data:`FIXED_POINT_SCALE` units per
particle) and the fused kernel sums its moments the same way, so the
order in which atomic adds land changes nothing: every step holds exactly
N * SCALE units, and two runs with one seed give bit-identical densities.
The smoothing gathers (no atomic adds) for the same reason.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import numpy as np

from core.backends.torch_gpu import cuda_available
from core.backends.torch_gpu import device as gpu_device
from plugins.mfg import kde
from plugins.mfg.fp.common import all_steps_unsupported, cells, drift_table
from plugins.mfg.fp.fixed_point import (
    FIXED_POINT_SCALE,
    fixed_point_unsupported,
    split_units,
)
from plugins.mfg.fp.layout import SLOTS


def _torch():
    import torch

    return torch


def initial_positions(problem, generator, device):
    """Draw positions from m0 on the device (same cell rule as the CPU backends)."""
    torch = _torch()
    cumulative, left, width = (torch.as_tensor(a, device=device) for a in cells(problem))
    u = torch.rand(2, problem.N, generator=generator, device=device, dtype=torch.float64)
    cell = torch.clamp(torch.searchsorted(cumulative, u[0], right=True), max=problem.Nx - 1)
    positions = left[cell] + width[cell] * u[1]
    if problem.boundary == "periodic":
        positions = problem.xmin + torch.remainder(positions - problem.xmin, problem.length)
    return positions


@functools.lru_cache(maxsize=64)
def _gather_map(nx: int, boundary: str, half: int) -> tuple[np.ndarray, np.ndarray]:
    """For each node, the (source node, kernel offset column) pairs the smoothing adds into it, (Nx, width) each.

    The inverse of scattering each node's mass to ``kde.fold``'s targets:
    every output node then sums its own row in a fixed order, with no atomic
    adds, so the smoothing gives the same bits on every run. Rows shorter
    than the longest (nodes near a reflecting wall receive more) are padded
    with column ``2 * half + 1``, whose kernel weight is zero.
    """
    reach = 2 * half + 1
    targets = kde.fold(np.arange(nx)[:, None] + np.arange(-half, half + 1)[None, :], nx, boundary).ravel()
    order = np.argsort(targets, kind="stable")
    counts = np.bincount(targets, minlength=nx)
    rank = np.arange(targets.size) - np.repeat(np.cumsum(counts) - counts, counts)
    sources = np.zeros((nx, counts.max()), dtype=np.int64)
    columns = np.full((nx, counts.max()), reach, dtype=np.int64)
    sources[targets[order], rank] = order // reach
    columns[targets[order], rank] = order % reach
    return sources, columns


def smooth(problem, mass, bandwidths):
    """Gaussian smoothing of every time step's binned mass at once, on the device.

    Same rule as :func:`plugins.mfg.kde.smoothing_matrix`: kernel sampled on
    the grid, normalised to sum one, folded at the boundary (mass exact).
    Each node gathers its contributions (:func:`_gather_map`), a few columns
    at a time so the (steps, Nx, columns) temporaries stay within the
    (steps, Nx, 2*half+1) the memory estimate counts.
    """
    torch = _torch()
    half = kde.half_width(float(bandwidths.max()), problem.dx)  # one sync, at the end
    offsets = torch.as_tensor(np.arange(-half, half + 1) * problem.dx, device=mass.device, dtype=mass.dtype)
    kernel = torch.exp(-0.5 * (offsets[None, :] / bandwidths[:, None]) ** 2)
    kernel = torch.nn.functional.pad(kernel / kernel.sum(dim=1, keepdim=True), (0, 1))  # the padding's zero
    sources, columns = _gather_map(problem.Nx, problem.boundary, half)
    smoothed = torch.zeros_like(mass)
    width = -(-sources.shape[1] // 4)
    for start in range(0, sources.shape[1], width):
        source = torch.as_tensor(sources[:, start:start + width], device=mass.device)
        column = torch.as_tensor(columns[:, start:start + width], device=mass.device)
        smoothed += mass[:, source].mul_(kernel[:, column]).sum(dim=-1)
    return smoothed / torch.as_tensor(problem.weights(), device=mass.device, dtype=mass.dtype)


def _bandwidths(problem, sums, iqr=None):
    """Bandwidth per time step from (sum, sum of squares) rows, on the device.

    The rules of :func:`plugins.mfg.kde.bandwidth_from_stats`, vectorised;
    ``iqr`` (one per row) is needed for Silverman only.
    """
    torch = _torch()
    n = problem.N
    if not isinstance(problem.bandwidth, str):
        return torch.full((sums.shape[0],), float(problem.bandwidth), dtype=sums.dtype, device=sums.device)
    std = torch.sqrt(torch.clamp(sums[:, 1] - sums[:, 0] ** 2 / n, min=0.0) / max(n - 1, 1))
    spread = std
    if problem.bandwidth == "silverman":
        spread = torch.minimum(std, iqr / 1.34) * 0.9
        spread = torch.where(spread > 0, spread, std)  # all particles in one place: the other statistic
    return torch.clamp(spread, min=1e-12) * n ** (-0.2)


def fused_unsupported(problem) -> str:
    """Why the Triton all-steps kernel cannot solve ``problem`` here ("" when it can).

    The problem's needs are checked first, then Triton, and CUDA last: only
    that step imports torch.
    """
    reason = all_steps_unsupported(problem) or fixed_point_unsupported(problem)
    if reason:
        return reason
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if not cuda_available():
        return "the Triton kernel needs a CUDA device"
    return ""


def solve_torch(problem, U: np.ndarray | None = None, *, fused: bool) -> dict:
    """M (Nt+1, Nx) and the rest as device tensors; ``fused`` takes the Triton kernel (see the module docstring)."""
    if fused and fused_unsupported(problem):
        raise ValueError(f"the fused torch FP cannot run this problem: {fused_unsupported(problem)}")
    if problem.kde == "binned" and fixed_point_unsupported(problem):
        raise ValueError(f"the torch FP cannot run this problem: {fixed_point_unsupported(problem)}")
    dev = gpu_device()
    torch = _torch()
    U = problem.U if U is None else U
    generator = torch.Generator(device=dev)
    seed = problem.seed if problem.seed is not None else int(torch.seed() % 2**31)
    generator.manual_seed(seed)
    drift = torch.as_tensor(drift_table(problem, U), device=dev, dtype=torch.float32)
    positions = initial_positions(problem, generator, dev).to(torch.float32)
    if fused:
        from plugins.mfg.fp.triton_kernel import run_fused  # Triton only loads where this variant runs

        mass, moments = run_fused(problem, positions, drift, seed)
        bandwidths = _bandwidths(problem, moments)
        density = smooth(problem, mass / problem.N, bandwidths)
    else:
        mass, bandwidths, direct, moments = _run_eager(problem, positions, drift, generator)
        density = direct if problem.kde == "direct" else smooth(problem, mass / problem.N, bandwidths)
    n = problem.N
    mean = moments[:, 0] / n
    variance = torch.clamp(moments[:, 1] - moments[:, 0] * mean, min=0.0) / max(n - 1, 1)
    weights = torch.as_tensor(problem.weights(), device=dev, dtype=torch.float64)
    return {"M": density, "bandwidth": bandwidths, "mass": density @ weights,
            "moments": torch.stack([mean, variance], dim=1), "path": np.array("fused" if fused else "eager")}


def deposit_units(problem, positions, histogram, slot_index):
    """Linear binning into the slotted int64 histogram (Nslots, Nx), in fixed-point units (:func:`split_units`).

    The cell and fraction are computed in float64 exactly as the Triton
    kernel computes them (times the inverse of dx: the kernel spares a
    float64 division), so both count the same units for the same positions.
    """
    torch = _torch()
    s = (positions.double() - problem.xmin) * (1.0 / problem.dx)
    left = torch.floor(s)
    frac = s - left
    left = left.long()
    if problem.boundary == "periodic":
        left = torch.remainder(left, problem.Nx)
        right = torch.remainder(left + 1, problem.Nx)
    else:
        left = torch.clamp(left, 0, problem.Nx - 2)
        frac = torch.clamp(s - left, 0.0, 1.0)
        right = left + 1
    left_units, right_units = split_units(frac)
    del s, frac  # freed before the index temporaries, which bounds the deposit's peak memory
    flat = histogram.view(-1)
    flat.index_add_(0, slot_index * problem.Nx + left, left_units)
    flat.index_add_(0, slot_index * problem.Nx + right, right_units)


def _quartile_spread(x):
    """Interquartile range of the positions (torch.quantile takes at most 2**24 values)."""
    torch = _torch()
    q = torch.quantile(x[: 1 << 24], torch.tensor([0.25, 0.75], device=x.device, dtype=x.dtype))
    return (q[1] - q[0]).reshape(1)


def _direct_density(problem, x, h):
    """The exact Gaussian sum on the device, in particle chunks to bound memory."""
    torch = _torch()
    grid = torch.as_tensor(problem.x, device=x.device, dtype=torch.float64)
    density = torch.zeros_like(grid)
    for start in range(0, problem.N, 1 << 20):
        chunk = x[start:start + (1 << 20)]
        # float(h) is one host sync per step: acceptable on this O(N * Nx) path
        for copy in kde.images(chunk, problem.xmin, problem.xmax, float(h), problem.boundary):
            density += torch.exp(-0.5 * ((grid[:, None] - copy[None, :]) / h) ** 2).sum(dim=1)
    return density / (problem.N * h * math.sqrt(2 * math.pi))


def _run_eager(problem, positions, drift, generator):
    torch = _torch()
    dev = positions.device
    steps = problem.Nt + 1
    counts = torch.zeros(steps, problem.Nx, dtype=torch.int64, device=dev)
    bandwidths = torch.zeros(steps, dtype=torch.float64, device=dev)
    direct = torch.zeros(steps, problem.Nx, dtype=torch.float64, device=dev) if problem.kde == "direct" else None
    slot_index = torch.arange(problem.N, device=dev) % SLOTS
    histogram = torch.zeros(SLOTS, problem.Nx, dtype=torch.int64, device=dev)
    sums = torch.zeros(steps, 2, dtype=torch.float64, device=dev)
    noise = problem.sigma * math.sqrt(problem.dt)
    for n in range(steps):
        if n > 0:
            s = (positions - problem.xmin) / problem.dx
            left = torch.floor(s)
            frac = s - left
            left = left.long()
            if problem.boundary == "periodic":
                right = torch.remainder(left + 1, problem.Nx)
                left = torch.remainder(left, problem.Nx)
            else:
                left = torch.clamp(left, 0, problem.Nx - 2)
                frac = torch.clamp(s - left, 0.0, 1.0)
                right = left + 1
            row = drift[n - 1]
            velocity = (1 - frac) * row[left] + frac * row[right]
            z = torch.randn(problem.N, generator=generator, device=dev, dtype=positions.dtype)
            positions = _place(problem, positions + velocity * problem.dt + noise * z)
        x = positions.double()
        sums[n, 0] = x.sum()
        sums[n, 1] = (x * x).sum()
        iqr = _quartile_spread(x) if problem.bandwidth == "silverman" else None
        bandwidths[n] = _bandwidths(problem, sums[n:n + 1], iqr)[0]
        if direct is not None:
            direct[n] = _direct_density(problem, x, bandwidths[n])
        else:
            histogram.zero_()
            deposit_units(problem, positions, histogram, slot_index)
            counts[n] = histogram.sum(dim=0)
    return counts.to(torch.float64).div_(FIXED_POINT_SCALE), bandwidths, direct, sums


def _place(problem, positions):
    torch = _torch()
    if problem.boundary == "periodic":
        return problem.xmin + torch.remainder(positions - problem.xmin, problem.length)
    y = torch.remainder(positions - problem.xmin, 2 * problem.length)
    return problem.xmin + torch.where(y > problem.length, 2 * problem.length - y, y)


def device_drift_table(problem, U):
    """:func:`plugins.mfg.fp.common.drift_table` of a float64 tensor (..., Nt+1, Nx), on its device.

    The same differences in the same order (``torch.gradient`` with
    ``edge_order=1`` is ``np.gradient``'s rule), so the float32 table the
    kernel reads is the one the host would have sent.
    """
    torch = _torch()
    if problem.boundary == "periodic":
        gradient = (torch.roll(U, -1, dims=-1) - torch.roll(U, 1, dims=-1)) / (2 * problem.dx)
    else:
        gradient = torch.gradient(U, spacing=problem.dx, dim=-1, edge_order=1)[0]
    return -problem.lam * gradient


def solve_torch_batch(problem, U_batch, *, fused: bool) -> object:
    """Densities (K, Nt+1, Nx) for K value functions at once, as a device tensor.

    ``U_batch`` is a (K, Nt+1, Nx) array, or a float64 tensor already on the
    device (the resident fixed point's iterate; fused only), whose drift is
    then formed there too.

    The K instances share the particles' seed (common random numbers, as the
    CPU common-noise path uses the problem's seed for every path). The fused
    kernel runs them as a second grid axis; the eager path loops over them.
    """
    torch = _torch()
    on_device = isinstance(U_batch, torch.Tensor)
    if not fused:
        if on_device:
            raise ValueError("the eager torch FP takes U_batch as a NumPy array; a device batch needs fused=True")
        return torch.stack([solve_torch(problem, U=u, fused=False)["M"] for u in np.asarray(U_batch)])
    if fused_unsupported(problem):
        raise ValueError(f"the fused torch FP cannot run this problem: {fused_unsupported(problem)}")
    dev = U_batch.device if on_device else gpu_device()
    seed = problem.seed if problem.seed is not None else 0
    table = device_drift_table(problem, U_batch) if on_device else np.stack(
        [drift_table(problem, u) for u in np.asarray(U_batch)])
    drift = torch.as_tensor(table, device=dev, dtype=torch.float32)
    generator = torch.Generator(device=dev)
    generator.manual_seed(seed)
    start = initial_positions(problem, generator, dev).to(torch.float32)
    positions = start.expand(len(U_batch), -1).clone()
    from plugins.mfg.fp.triton_kernel import run_fused  # Triton only loads where this variant runs

    mass, moments = run_fused(problem, positions, drift, seed)
    k, steps = mass.shape[0], mass.shape[1]
    bandwidths = _bandwidths(problem, moments.reshape(k * steps, 2))
    density = smooth(problem, mass.reshape(k * steps, -1) / problem.N, bandwidths)
    return density.reshape(k, steps, -1)
