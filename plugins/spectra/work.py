"""What a spectra.fit solve costs: the work features the cost model is linear in, and the memory per device.

One model evaluation (every LM iteration makes one, with the Jacobian) costs
work on the template grid (16-corner interpolation, the rotational
convolution of 6 channels: ``template_pixels``) and work on the data pixels
(resampling: ``pixel_iterations``; the continuum's normal equations,
``(degree + 1)**2`` products per pixel: ``continuum_pixel_iterations``). The
CCF start costs a product with its design per spectrum (``ccf``), and one
read of that design per call (``pixels``). The template grid's size
(nodes x template pixels) is what the torch backend copies to the device on
its first use and what every corner gather draws from.
"""

from __future__ import annotations

import math
import os
from functools import cache
from typing import Any

import numpy as np

from plugins.spectra.fit import GRAPH_AFTER
from plugins.spectra.model import arm_wavelengths
from plugins.spectra.problem import SpectraProblem
from plugins.spectra.templates import C_KMS, TEMPLATE_STEP_KMS, V_MAX, VSINI_MAX

COARSE_TEMPLATES = 12


@cache
def template_pixels(n_pixels: int) -> int:
    """The cropped template grid's length for data of ``n_pixels`` (see model.prepare)."""
    wave, _ = arm_wavelengths(n_pixels)
    dlnw = math.log1p(TEMPLATE_STEP_KMS / C_KMS)
    span = math.log(wave.max() / wave.min()) / dlnw
    return int(span + 2 * ((V_MAX + VSINI_MAX) / C_KMS / dlnw + 4))


def features(problem: SpectraProblem) -> dict[str, float]:
    return _features(problem, float(problem.n_spectra * problem.max_iter), float(problem.max_iter))


def _features(problem: SpectraProblem, spectrum_iterations: float, steps: float) -> dict[str, float]:
    tp = template_pixels(problem.n_pixels)
    return {
        "spectra": float(problem.n_spectra),
        # a batched fit's step costs a fixed price whatever the batch (the GPU's kernel launches, the
        # CPU threads' fork-join), on top of the per-spectrum work counted below
        "steps": steps,
        "iterations": spectrum_iterations,
        "pixel_iterations": spectrum_iterations * problem.n_pixels,
        "continuum_pixel_iterations": spectrum_iterations * problem.n_pixels * (problem.degree + 1) ** 2,
        "template_iterations": spectrum_iterations * tp,
        "ccf": float(problem.n_spectra) * tp * COARSE_TEMPLATES,
        # once per call whatever the batch: the CCF start reads its whole design (a dozen templates at every
        # pixel and lag, 46 MB with 5,630 pixels: 3-5 ms a fit of two spectra on the VM's CPU) and the
        # continuum's basis is laid out per pixel; priced per spectrum only (``ccf``), fits of two spectra
        # with 4,000-5,600 pixels ran 1.6-1.8x their predictions on the VM and 1.6-2.2x on the H200 host
        "pixels": float(problem.n_pixels),
        "library": float(problem.nodes) * tp,
    }


def graph_features(features: dict[str, float]) -> dict[str, float]:
    """What only ``torch:graph`` pays per call: LM steps launched one kernel at a time, and a step's capture.

    Its static LM runs :data:`~plugins.spectra.fit.GRAPH_AFTER` steps
    eagerly, runs the next one on a side stream and captures it, then replays
    the graph (one launch per step). A step's price is then not one number: a
    fit of 16 spectra with ``max_iter=1`` on the H200 host ran 2.46x the
    prediction of a model that priced every step at the replayed rate. With
    the eager steps and the capture apart, ``steps`` is left the replays' price.
    """
    steps = features["steps"]
    return {"eager_steps": min(steps, GRAPH_AFTER + 1.0), "captures": 1.0 if steps > GRAPH_AFTER else 0.0}


def work_done(problem: SpectraProblem, outputs: Any) -> dict[str, float]:
    """The iterations the fits really ran (a converged spectrum leaves the batch)."""
    iterations = np.asarray(outputs["ITERATIONS"])
    # the batch steps until its slowest spectrum converges
    return _features(problem, float(iterations.sum()), float(iterations.max(initial=0)))


def memory(problem: SpectraProblem, implementation: str) -> float:
    return batch_bytes(problem.n_spectra, problem.n_pixels, problem.nodes, implementation)


def batch_bytes(n_spectra: int, n_pixels: int, nodes: int, implementation: str) -> float:
    """Peak bytes on the implementation's device: the templates plus the batch's working arrays.

    Per spectrum: ~8 template-length arrays (the 5 interpolated channels and
    the broadening's working copies), ~48 data-length ones (the 7 shifted
    channels, the projected Jacobian and its weighted copy, the cleaned data)
    and the CCF's complex spectrum; float32 on the GPU, float64 on the CPU.
    Measured on an H200 (docs/results/spectra-h200): 1.9 MB per 3-arm spectrum
    at the peak, against 2.6 MB here, so a batch sized from this estimate fits
    with a margin. The numpy reference holds one spectrum at a time; a
    parallel worker holds the library and one chunk.
    """
    backend = implementation.split(":", 1)[0]
    tp = template_pixels(n_pixels)
    nfft = 1 << math.ceil(math.log2(tp + V_MAX / TEMPLATE_STEP_KMS + 1))
    itemsize = 4 if backend == "torch" else 8
    per_spectrum = itemsize * (8 * tp + 48 * n_pixels) + 8 * nfft
    library = 4.0 * nodes * tp
    data = 2 * 4.0 * n_spectra * n_pixels
    if backend == "numpy":
        return library + data + per_spectrum
    if backend in ("torch", "numba"):
        return library + data + per_spectrum * n_spectra
    from plugins.spectra.solve import chunks

    workers = min(os.cpu_count() or 1, len(chunks(n_spectra)))
    rows = max(b - a for a, b in chunks(n_spectra))
    return data + workers * (library + per_spectrum * rows)  # every worker loads the library and fits a chunk


def largest_batch(n_pixels: int, nodes: int, implementation: str, free_bytes: float, limit: int,
                  fraction: float = 0.5) -> int:
    """The most spectra (up to ``limit``) whose batch fits in ``fraction`` of ``free_bytes`` (bisection)."""
    budget = fraction * free_bytes
    if batch_bytes(1, n_pixels, nodes, implementation) > budget:
        return 0
    lo, hi = 1, max(1, limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if batch_bytes(mid, n_pixels, nodes, implementation) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo
