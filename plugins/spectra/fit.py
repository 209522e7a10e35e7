"""Fitting: a cross-correlation start, then a damped Gauss-Newton (Levenberg-Marquardt) fit; errors from the curvature.

Everything here is written once against :mod:`plugins.spectra.ops`, so the
numpy, numba and torch backends run the same algorithm on their own arrays:

1. :func:`ccf_start`: each spectrum, flattened by its own running mean, is
   cross-correlated with a dozen flattened templates spread over the grid,
   over +-1000 km/s, as one matrix product with the templates read at every
   pixel and lag (built once per wavelength grid); the best (template,
   shift) gives the starting v and theta.
2. :func:`lm_batch`: Levenberg-Marquardt on all spectra at once, each with
   its own damping, acceptance and convergence test; converged spectra drop
   out of the batch, so the work shrinks as they finish.
3. :func:`reference_fit`: the numpy reference, ``scipy.optimize.least_squares``
   one spectrum at a time on the same model and starting point.
4. :func:`fit_clipped`: iterative outlier clipping around 2 or 3 (below);
5. :func:`finish`: errors from the inverse of the projected Fisher matrix at
   the optimum, flags, and the output table's columns.

Convergence (:func:`converged_below`): a spectrum has converged when an
accepted step lowers chi-square, or the next step is predicted to, by at
most ``tol * (chi2 + dof)``: relative, plus an absolute part in units of the
noise, so near noise-free fits (chi-square tending to 0) converge too.
``ITERATIONS`` counts trial steps (one model evaluation each, accepted or
not) on every backend, summed over the clipping rounds.

Outlier clipping: after a fit, every usable pixel's normalised residual
``r = sqrt(ivar) (flux - model)`` is compared with ``CLIP_SIGMA`` (5) times
``max(s, 1)``, where ``s = 1.4826 median|r|`` is the spectrum's robust noise
level in units of its stated noise. Pixels beyond it get weight 0 and the
spectrum is refitted from its optimum; each round judges every usable pixel
afresh (a pixel clipped while a gross outlier distorted the fit comes back),
at most ``CLIP_ROUNDS`` (4) refits, stopping when the clipped set no longer
changes. 5 sigma: a Gaussian pixel exceeds it with probability 5.7e-7, so a
7,958-pixel spectrum loses a good pixel about once in 200 spectra. ``NCLIP``
reports the clipped pixels; ``NPIX`` and the degrees of freedom exclude them.

Flags: BAD_FIT when the reduced chi-square exceeds :func:`bad_fit_limit`
(the chi-square law's 1e-6 quantile for the degrees of freedom, at least 2);
NOT_FINITE when the normal equations overflowed (that spectrum stops where
it is; the rest of the batch is untouched). Both are failures.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugins.spectra.model import N_PARAMS, PARAM_NAMES, Prepared, covariance, evaluate, float64_dtype
from plugins.spectra.ops import NumpyOps
from plugins.spectra.templates import C_KMS, V_MAX

# per-spectrum flags (bits of the FLAGS column); SUCCESS means none of FAILURE's bits
NO_DATA = 1  # too few usable pixels (all masked, all NaN, zero signal): not fitted
MISSING_ARM = 2  # an arm had no usable pixel; the others were fitted
NOT_CONVERGED = 4  # the iteration limit came first
AT_BOUND = 8  # a parameter ended on its bound (the grid's edge, |v| = 1000 km/s)
UNCONSTRAINED = 16  # the velocity error is not finite or above 100 km/s: the data cannot say
BAD_FIT = 32  # chi-square far beyond the noise: see bad_fit_limit
NOT_FINITE = 64  # the fit's arithmetic overflowed (flux ~1e18 with ordinary ivar on float32): not fitted
FAILURE = NO_DATA | NOT_CONVERGED | UNCONSTRAINED | BAD_FIT | NOT_FINITE
MIN_PIXELS = 50
BAD_FIT_FALSE_ALARM = 1e-6  # the chance that an exact model's chi-square exceeds the BAD_FIT limit
BAD_FIT_RCHISQ = 2.0  # the tolerated model mismatch: residuals up to as large again as the noise
CLIP_SIGMA = 5.0  # outlier clipping threshold, in robust standard deviations (see outliers)
CLIP_ROUNDS = 4  # refits after clipping, at most
START_VSINI = 15.0  # km/s: above the kernel's one-pixel width, so the vsini gradient is not zero at the start
CCF_SMOOTH = 50  # half-width, in data pixels, of the running mean that flattens a spectrum for the CCF
TEMPLATE_SMOOTH = 150  # the same for templates, in template pixels (~1800 km/s)


# -- the cross-correlation start -----------------------------------------------------------


def coarse_nodes(prep: Prepared) -> np.ndarray:
    """About a dozen grid nodes spread over teff (3), logg (2) and [Fe/H] (2) at the middle [alpha/Fe]."""
    axes = [prep.ops.to_numpy(a) for a in prep.axes]

    def pick(axis: np.ndarray, quantiles: tuple[float, ...]) -> list[int]:
        return sorted({int(np.argmin(np.abs(axis - np.quantile(axis, q)))) for q in quantiles})

    chosen = [pick(axes[0], (0.1, 0.5, 0.9)), pick(axes[1], (0.3, 0.9)), pick(axes[2], (0.2, 0.9)),
              [len(axes[3]) // 2]]
    mesh = np.stack(np.meshgrid(*chosen, indexing="ij"), axis=-1).reshape(-1, 4)
    return mesh @ np.array(prep.strides)


def _running_mean(ops: Any, x: Any, half: int) -> Any:
    """Mean over a window of 2 half + 1 along the last axis (shrinking at the ends), by cumulative sums."""
    xp = ops.xp
    n = x.shape[-1]
    zero = ops.zeros((*x.shape[:-1], 1), dtype=x.dtype)
    csum = xp.cumsum(_cat(ops, [zero, x], -1), -1)
    hi = ops.asint(np.minimum(np.arange(n) + half + 1, n))
    lo = ops.asint(np.maximum(np.arange(n) - half, 0))
    return csum[..., hi] - csum[..., lo]


def _cat(ops: Any, arrays: list, axis: int) -> Any:
    return ops.torch.cat(arrays, dim=axis) if ops.name == "torch" else np.concatenate(arrays, axis=axis)


_HOST = NumpyOps(np.float32)  # the design's arithmetic, whatever the fit's backend (flatten_templates)


def flatten_templates(prep: Prepared, nodes: np.ndarray) -> np.ndarray:
    """The coarse templates divided by their running mean, minus 1: lines only (float32, on the host).

    On the host whatever the ops' device: the rows are the library's own
    float32 values on every device, so every backend's design is the same
    (:func:`ccf_design` shares one between them).
    """
    rows = prep.ops.to_numpy(prep.table[prep.ops.asint(nodes)]).astype(np.float32, copy=False)
    flux = np.exp(rows)
    return flux / (_running_mean(_HOST, flux, TEMPLATE_SMOOTH) / (2 * TEMPLATE_SMOOTH + 1)) - 1


@dataclass(frozen=True)
class CCFDesign:
    """What the cross-correlation start needs that does not depend on the spectra, built once per wavelength grid.

    ``shifted[i, k * L + l]`` is flattened coarse template k read at data pixel
    i's template position moved by ``lags[l]`` (linear interpolation, zero
    beyond the templates), so the correlation of a whole batch over every
    template and lag is one matrix product. The FFT route it replaces
    transformed ~30,000-point rows to read 169 lags, and recomputed a dozen
    template transforms per call: that was two thirds of a small fit on the
    CPU, and a product parallelises on any backend where per-row FFTs did not.
    """

    nodes: np.ndarray  # (K,) the coarse grid nodes
    lags: np.ndarray  # (L,) template-pixel lags covering +-V_MAX
    shifted: Any  # (P, K * L) float32 on the ops' device
    squared: Any  # (P, K) float32: each flattened template squared at the pixel, at lag 0 (the norms)


def build_ccf_design(prep: Prepared) -> CCFDesign:
    """The shifted flattened templates at the data's pixels, as host (NumPy) arrays: :func:`on_device` moves them."""
    ops = prep.ops
    nodes = coarse_nodes(prep)
    templates = flatten_templates(prep, nodes)  # (K, T)
    max_lag = int(math.ceil(math.atanh(V_MAX / C_KMS) / prep.dlnw))
    lags = np.arange(-max_lag, max_lag + 1)
    # pad by max_lag + 1 each side: every read below lands in the array, on a zero beyond the templates
    pad = max_lag + 1
    padded = np.zeros((len(nodes), templates.shape[1] + 2 * pad), dtype=np.float32)
    padded[:, pad:-pad] = templates
    u0 = ops.to_numpy(prep.u0)
    j0 = np.floor(u0).astype(np.int64)
    frac = (u0 - j0).astype(np.float32)[:, None]
    # the correlation at lag l pairs data pixel u with template position u - l: for pixel i the reads
    # j0_i + pad - lags run backwards through one window of the padded row, so each pixel's row of
    # lags is a reversed window (a contiguous copy, not a gather of P x L scattered indices)
    first = j0 + pad - max_lag
    shifted = np.empty((len(u0), len(nodes), len(lags)), dtype=np.float32)
    for k, row in enumerate(padded):  # one template at a time keeps the peak memory at (P, L)
        windows = np.lib.stride_tricks.sliding_window_view(row, len(lags) + 1)[first][:, ::-1]
        shifted[:, k, :] = (1 - frac) * windows[:, 1:] + frac * windows[:, :-1]
    squared = padded * padded
    lag0 = j0 + pad
    norms = (1 - frac) * squared[:, lag0].T + frac * squared[:, lag0 + 1].T  # (P, K)
    return CCFDesign(nodes=nodes, lags=lags, shifted=shifted.reshape(len(u0), -1), squared=norms.astype(np.float32))


def on_device(design: CCFDesign, ops: Any) -> CCFDesign:
    """A host design (:func:`build_ccf_design`) as the ops' float32 arrays (the same arrays on the CPU)."""
    f32 = ops.torch.float32 if ops.name == "torch" else np.float32
    return CCFDesign(nodes=design.nodes, lags=design.lags, shifted=ops.asarray(design.shifted, dtype=f32),
                     squared=ops.asarray(design.squared, dtype=f32))


_DESIGNS: dict[tuple, tuple[Any, CCFDesign, dict[tuple[str, str], CCFDesign]]] = {}
_KEEP_DESIGNS = 4  # a few wavelength grids (a survey's files share one); a realistic one is ~65 MB
BUILDS = {"built": 0}  # host designs built in this process (tests read it)


def ccf_design(prep: Prepared, library: Any) -> CCFDesign:
    """:func:`build_ccf_design`, remembered per library and wavelength grid, and its copy per device.

    Successive batches of one file share the grid, so after the first the
    start costs one matrix product. The host design is every backend's (one
    build per grid, then a copy to each device): kept per backend, a GPU
    variant's first fit of two spectra that numba had just fitted built it
    again, 129-172 ms against 19-28 ms warm with 4,255-5,630 pixels on the
    H200 host (51-72 ms with the design shared: its copy to the device and
    a graph's capture remain), which no compile key declared. The library
    itself is kept in the entry: its ``id`` alone could be reused by a new
    library once the old is freed.
    """
    ops = prep.ops
    pixels = np.ascontiguousarray(ops.to_numpy(prep.u0))
    key = (id(library), prep.n_template, hashlib.blake2b(pixels.tobytes(), digest_size=16).hexdigest())
    hit = _DESIGNS.get(key)
    if hit is None or hit[0] is not library:
        BUILDS["built"] += 1
        while len(_DESIGNS) >= _KEEP_DESIGNS:
            _DESIGNS.pop(next(iter(_DESIGNS)))  # the oldest first
        hit = _DESIGNS[key] = (library, build_ccf_design(prep), {})
    _, host, placed = hit
    place = (ops.name, str(getattr(ops, "device", "cpu")))
    if place not in placed:
        placed[place] = on_device(host, ops)
    return placed[place]


def ccf_start(prep: Prepared, flux: Any, weight: Any, design: CCFDesign | None = None) -> Any:
    """(B, 6) starting parameters: v from the cross-correlation peak, theta of the best coarse template."""
    ops, xp = prep.ops, prep.ops.xp
    design = on_device(build_ccf_design(prep), ops) if design is None else design
    # flatten each arm of each spectrum by its own running mean over usable pixels
    use = ops.cast(weight > 0)
    level = ops.zeros(flux.shape)
    for start, stop in prep.arm_slices:
        num = _running_mean(ops, (flux * use)[:, start:stop], CCF_SMOOTH)
        den = _running_mean(ops, use[:, start:stop], CCF_SMOOTH)
        level[:, start:stop] = num / ops.maximum(den, 1.0)
    ok = (use > 0) & (level > 0)
    safe = xp.where(ok, level, ops.asarray(1.0))
    flat = xp.where(ok, ops.clip(flux / safe - 1, -1.0, 1.0), ops.asarray(0.0))
    f32 = ops.torch.float32 if ops.name == "torch" else np.float32
    n_nodes, width = len(design.nodes), len(design.lags)
    cc = ops.matmul(ops.asarray(flat, dtype=f32), design.shifted).reshape(flux.shape[0], n_nodes, width)
    norms = xp.sqrt(ops.maximum(ops.matmul(ops.asarray(use, dtype=f32), design.squared), 1e-30))  # (B, K)
    scores = (cc / norms[:, :, None]).reshape(flux.shape[0], -1)
    # the peak and its two neighbours on the device: the host gets (B, 3) numbers, not every score
    # (a batch of 4,096 would copy 33 MB to the host and search it there)
    best_at = ops.argmax(scores, 1)
    lag_at = best_at % width
    around = xp.stack([xp.where(lag_at > 0, best_at - 1, best_at), best_at,
                       xp.where(lag_at < width - 1, best_at + 1, best_at)], 1)
    left, centre, right = ops.to_numpy(ops.take_along(scores, around, 1)).astype(np.float64).T
    best = ops.to_numpy(best_at).astype(np.int64)
    k_best, lag_best = best // width, best % width
    curvature = left - 2 * centre + right
    offset = np.where(curvature < 0, 0.5 * (left - right) / np.where(curvature < 0, curvature, -1.0), 0.0)
    lag = design.lags[lag_best] + np.clip(offset, -0.5, 0.5)
    v0 = C_KMS * np.tanh(lag * prep.dlnw)
    theta0 = prep.node_params[design.nodes[k_best]]
    start = np.column_stack([np.clip(v0, -V_MAX, V_MAX), np.full(len(v0), START_VSINI), theta0])
    return ops.asarray(start, dtype=float64_dtype(ops))


# -- the batched Levenberg-Marquardt --------------------------------------------------------


def lm_batch(prep: Prepared, flux: Any, weight: Any, p0: Any, max_iter: int, tol: float,
             dof: np.ndarray | None = None) -> dict[str, Any]:
    """Fit every spectrum at once; returns p, chi2, hessian, iterations, converged and broken, per spectrum.

    ``tol``: converged when an accepted step lowers chi2, or any step is predicted to, by at most
    ``tol * (chi2 + dof)`` (see :func:`converged_below`); 0 runs every iteration (what calibration
    measures). ``iterations`` counts trial steps, accepted or not: one evaluation each. A spectrum
    whose normal equations are not finite (data beyond the arithmetic's range: flux of 1e18 with
    ordinary ivar overflows float32) stops where it is, ``broken``; the others go on undisturbed.
    """
    if getattr(prep.ops, "static_lm", False):  # torch:graph: the same iteration at a fixed shape, graph-captured
        return lm_static(prep, flux, weight, p0, max_iter, tol, dof)
    ops, xp = prep.ops, prep.ops.xp
    b = p0.shape[0]
    p = p0.clone() if ops.name == "torch" else p0.copy()
    current = evaluate(prep, p, flux, weight, jac=True)
    chi2, hessian, gradient = current.chi2, current.hessian, current.gradient
    damping = ops.asarray(np.full(b, 1e-2), dtype=chi2.dtype)
    absolute = ops.asarray(np.zeros(b) if dof is None else np.maximum(np.asarray(dof, dtype=np.float64), 0.0),
                           dtype=chi2.dtype)
    done = np.zeros(b, dtype=bool)
    broken = np.zeros(b, dtype=bool)
    iterations = np.zeros(b, dtype=np.int64)
    floor = ops.asarray(1.0 / (10.0 * np.array([100.0, 100.0, 1000.0, 1.0, 1.0, 1.0])) ** 2, dtype=chi2.dtype)
    eye = ops.eye(N_PARAMS)[None]
    span = prep.upper - prep.lower
    at_lower, at_upper = prep.lower + 1e-9 * span, prep.upper - 1e-9 * span
    for _ in range(max_iter):
        active = np.flatnonzero(~done)
        if active.size == 0:
            break
        # while every spectrum is still active, whole arrays (views and copies) instead of gathers and scatters
        a = slice(None) if active.size == b else ops.asint(active)
        h, g, here = hessian[a], gradient[a], p[a]
        # a parameter on its bound that the gradient pushes outwards stays there (an active set): its
        # row and column leave the system, so the step and the predicted decrease are the feasible ones
        free = ~(((here <= at_lower) & (g < 0)) | ((here >= at_upper) & (g > 0)))
        f = ops.float64(free)
        g = g * f
        h = h * f[:, :, None] * f[:, None, :] + eye * (1 - f)[:, None, :]
        diag = xp.diagonal(h, 0, 1, 2)
        lam = damping[a]
        step = ops.solve(h + eye * (lam[:, None] * ops.maximum(diag, floor[None, :]))[:, None, :], g)
        # a non-finite step (overflowed normal equations) must never reach the model: NaN parameters
        # become NaN grid indices. Such a spectrum keeps its parameters and leaves the batch
        finite = xp.all(xp.isfinite(step), 1) & xp.isfinite(chi2[a])
        trial_p = ops.clip(xp.where(finite[:, None], here + step, here), prep.lower[None, :], prep.upper[None, :])
        trial = evaluate(prep, trial_p, flux[a], weight[a], jac=True)
        before = chi2[a]
        gain = before - trial.chi2
        better = (gain > 0) & finite
        # the step's predicted decrease: below the tolerance, neither this step nor a more damped one matters
        predicted = xp.sum(step * g, 1)
        p[a] = xp.where(better[:, None], trial_p, here)
        chi2[a] = xp.where(better, trial.chi2, before)
        hessian[a] = xp.where(better[:, None, None], trial.hessian, hessian[a])
        gradient[a] = xp.where(better[:, None], trial.gradient, gradient[a])
        lam = xp.where(better, lam * 0.3, lam * 5.0)
        damping[a] = lam
        iterations[active] += 1
        finished = (lam > 1e8) | ~finite  # stuck (no step of any size lowers chi2), or broken
        if tol > 0:
            limit = converged_below(tol, before, absolute[a])
            finished = finished | (better & (gain <= limit)) | (predicted <= limit)
        verdict = ops.to_numpy(xp.stack([finished, finite]))  # the loop's one wait for the device
        done[active] = verdict[0]
        broken[active] = ~verdict[1]
    return {"p": p, "chi2": chi2, "hessian": hessian, "iterations": iterations, "converged": done & ~broken,
            "broken": broken}


GRAPH_AFTER = 2  # lm_static's eager steps before it captures one as a CUDA graph (a short fit never pays the capture)
_CAPTURE: list = []  # the side stream that warms up and captures (one per process)
CAPTURES = {"captured": 0, "failed": 0}  # lm_static's graph captures in this process (tests and profiles read it)


def lm_static(prep: Prepared, flux: Any, weight: Any, p0: Any, max_iter: int, tol: float,
              dof: np.ndarray | None = None) -> dict[str, Any]:
    """:func:`lm_batch` at a fixed shape, for torch ops with ``active`` masking (``triton_kernels.GraphOps``).

    The same iteration, step for step: each spectrum's damping, acceptance, convergence and ``broken``
    rule as in lm_batch. But converged spectra stay in the batch, flagged inactive (``ops.active``):
    the kernels skip them and every update leaves them as they are, so every step has the same arrays
    of the same shapes. After ``GRAPH_AFTER`` eager steps, on a CUDA device, one step is captured as a
    CUDA graph and replayed for the rest: one launch per step from the host instead of hundreds. The
    host still reads one flag per step (is any spectrum active?), as lm_batch does.
    """
    ops, xp = prep.ops, prep.ops.xp
    torch = ops.torch
    b = p0.shape[0]
    flux, weight = flux.contiguous(), weight.contiguous()
    p = p0.to(torch.float64).clone().contiguous()
    current = evaluate(prep, p, flux, weight, jac=True)
    chi2, hessian, gradient = current.chi2.clone(), current.hessian.clone(), current.gradient.clone()
    device = chi2.device
    damping = torch.full((b,), 1e-2, dtype=chi2.dtype, device=device)
    absolute = ops.asarray(np.zeros(b) if dof is None else np.maximum(np.asarray(dof, dtype=np.float64), 0.0),
                           dtype=chi2.dtype)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    broken = torch.zeros(b, dtype=torch.bool, device=device)
    iterations = torch.zeros(b, dtype=torch.int64, device=device)
    floor = ops.asarray(1.0 / (10.0 * np.array([100.0, 100.0, 1000.0, 1.0, 1.0, 1.0])) ** 2, dtype=chi2.dtype)
    eye = ops.eye(N_PARAMS)[None]
    span = prep.upper - prep.lower
    at_lower, at_upper = prep.lower + 1e-9 * span, prep.upper - 1e-9 * span
    lower, upper = prep.lower[None, :], prep.upper[None, :]

    def step() -> None:
        act = ~done
        h, g, here, lam = hessian, gradient, p, damping
        free = ~(((here <= at_lower) & (g < 0)) | ((here >= at_upper) & (g > 0)))
        f = ops.float64(free)
        g = g * f
        h = h * f[:, :, None] * f[:, None, :] + eye * (1 - f)[:, None, :]
        diag = xp.diagonal(h, 0, 1, 2)
        delta = ops.solve(h + eye * (lam[:, None] * ops.maximum(diag, floor[None, :]))[:, None, :], g)
        finite = xp.all(xp.isfinite(delta), 1) & xp.isfinite(chi2)
        trial_p = ops.clip(xp.where(finite[:, None], here + delta, here), lower, upper)
        ops.active = act.to(torch.int8)
        try:
            trial = evaluate(prep, trial_p, flux, weight, jac=True)
        finally:
            ops.active = None
        gain = chi2 - trial.chi2
        better = (gain > 0) & finite & act
        predicted = xp.sum(delta * g, 1)
        new_lam = xp.where(better, lam * 0.3, lam * 5.0)
        finished = (new_lam > 1e8) | ~finite
        if tol > 0:
            limit = converged_below(tol, chi2, absolute)
            finished = finished | (better & (gain <= limit)) | (predicted <= limit)
        p.copy_(xp.where(better[:, None], trial_p, here))
        chi2.copy_(xp.where(better, trial.chi2, chi2))
        hessian.copy_(xp.where(better[:, None, None], trial.hessian, hessian))
        gradient.copy_(xp.where(better[:, None], trial.gradient, gradient))
        damping.copy_(xp.where(act, new_lam, lam))
        iterations.add_(act.to(torch.int64))
        broken.logical_or_(act & ~finite)
        done.logical_or_(act & finished)

    graph = None
    can_capture = device.type == "cuda"
    for count in range(max_iter):
        if count and not bool(torch.any(~done)):  # the loop's one wait for the device, as in lm_batch
            break
        if graph is None and can_capture and count >= GRAPH_AFTER:
            graph = _capture(step, torch)  # runs this step, then captures it
            can_capture = False
            continue
        if graph is not None:
            graph.replay()
        else:
            step()
    return {"p": p, "chi2": chi2, "hessian": hessian, "iterations": ops.to_numpy(iterations),
            "converged": ops.to_numpy(done & ~broken), "broken": ops.to_numpy(broken)}


def _capture(step: Any, torch: Any) -> Any:
    """Run ``step`` once on the capture stream (a real step, and the warm-up a capture needs), then capture it.

    Returns the graph, or None where capture failed (the caller goes on eagerly; the warning says why).
    """
    import warnings

    if not _CAPTURE:
        _CAPTURE.append(torch.cuda.Stream())
    stream = _CAPTURE[0]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            step()
    except Exception as exc:  # a capture refused is a slower fit, never a failed one
        warnings.warn(f"spectra.fit: the LM step could not be captured as a CUDA graph ({exc}); running eagerly",
                      RuntimeWarning, stacklevel=3)
        torch.cuda.synchronize()
        CAPTURES["failed"] += 1
        return None
    CAPTURES["captured"] += 1
    return graph


def converged_below(tol: float, chi2: Any, dof: Any) -> Any:
    """The decrease of chi2 below which a fit has converged: ``tol * (chi2 + dof)``.

    Relative (``tol * chi2``) plus absolute (``tol * dof``): a good fit's chi2 is about dof, so the
    absolute part is the same tolerance in units of the noise, and it is what lets a near noise-free
    fit converge, whose chi2 tends to 0 and whose relative decrease never settles below ``tol``.
    """
    return tol * (chi2 + dof)


# -- the scipy reference -----------------------------------------------------------------


def reference_fit(prep: Prepared, flux: np.ndarray, weight: np.ndarray, p0: np.ndarray, max_iter: int,
                  tol: float, dof: np.ndarray | None = None) -> dict[str, Any]:
    """``scipy.optimize.least_squares`` (trust-region reflective, bounded), one spectrum at a time.

    The same convergence rule as :func:`lm_batch`: scipy's test is relative (``dF < ftol F``), so the
    residual vector carries one constant entry sqrt(dof) (its Jacobian row is zero: no step changes),
    which makes ``F`` chi2 + dof. ``iterations`` counts trial steps as lm_batch does: scipy's function
    evaluations less the one at the start, with at most ``max_iter`` of them.
    """
    from scipy.optimize import least_squares

    lower, upper = np.asarray(prep.lower), np.asarray(prep.upper)
    out_p = np.array(p0, dtype=np.float64, copy=True)
    iterations = np.zeros(len(p0), dtype=np.int64)
    converged = np.zeros(len(p0), dtype=bool)
    offsets = np.zeros(len(p0)) if dof is None else np.sqrt(np.maximum(np.asarray(dof, dtype=np.float64), 0.0))
    for i in range(len(p0)):
        d, w = flux[i : i + 1], weight[i : i + 1]
        root_w = np.sqrt(w[0])
        cache: dict[bytes, Any] = {}

        def run(x: np.ndarray, d=d, w=w, cache=cache):
            key = x.tobytes()
            if key not in cache:
                cache.clear()
                cache[key] = evaluate(prep, x[None, :], d, w, jac=True, keep_jacobian=True)
            return cache[key]

        def residual(x, root_w=root_w, d=d, offset=offsets[i]):
            return np.append(root_w * (d[0] - run(x).model[0]), offset)

        def jacobian(x, root_w=root_w):
            return np.vstack([-(run(x).jproj[0] * root_w[None, :]).T, np.zeros((1, N_PARAMS))])

        x0 = np.clip(p0[i], lower + 1e-9 * (upper - lower), upper - 1e-9 * (upper - lower))
        result = least_squares(residual, x0, jac=jacobian, bounds=(lower, upper), method="trf", x_scale="jac",
                               ftol=max(tol, 1e-12), xtol=1e-10, gtol=1e-10, max_nfev=max_iter + 1)
        out_p[i] = result.x
        iterations[i] = result.nfev - 1
        converged[i] = result.status > 0
    final = evaluate(prep, out_p, flux, weight, jac=True)
    broken = ~(np.isfinite(final.chi2) & np.all(np.isfinite(final.hessian), axis=(1, 2)))
    return {"p": out_p, "chi2": final.chi2, "hessian": final.hessian, "iterations": iterations,
            "converged": converged & ~broken, "broken": broken}


# -- outlier clipping ---------------------------------------------------------------------------


def outliers(resid: Any, used: Any, ops: Any = None) -> Any:
    """Pixels to clip, (B, N) bool: ``|r| > CLIP_SIGMA * max(s, 1)`` among the used ones.

    ``r = sqrt(ivar) (flux - model)`` and ``s = 1.4826 * median |r|``, the spectrum's robust noise
    level in units of its stated noise: never below 1, so a spectrum is never clipped harder than its
    own ivar says, and a spectrum whose ivar understates the noise is clipped at its real noise.
    On ``ops``' arrays (NumPy's by default), so a GPU batch is judged where it lives.
    """
    ops = NumpyOps() if ops is None else ops
    xp = ops.xp
    size = xp.abs(resid)
    scale = 1.4826 * ops.nanmedian(xp.where(used, size, float("nan")))
    limit = CLIP_SIGMA * xp.clip(xp.nan_to_num(scale, nan=1.0), 1.0, None)
    return used & (size > limit[:, None])


def fit_clipped(prep: Prepared, flux: Any, weight: Any, p0: Any, *, method: str, max_iter: int, tol: float,
                dof: np.ndarray) -> dict[str, Any]:
    """The fit with iterative outlier clipping: fit, clip the pixels :func:`outliers` names, refit, repeat.

    Each round judges every usable pixel afresh against the latest fit, so a pixel clipped while a
    gross outlier still distorted the fit comes back once it no longer stands out; the spectra whose
    clipped set changed are refitted from their previous optimum. At most ``CLIP_ROUNDS`` refits;
    a round that changes nothing ends it. ``clipped`` counts each spectrum's clipped pixels,
    ``weight`` is the final weight (0 on clipped pixels), ``iterations`` sums the rounds.

    The judging runs on the ops' device (only the rows that changed come back to the host), and
    after the first round only the rows refitted in the last one are judged again: a row's verdict
    depends on its parameters and its weight alone, and neither changed for the others.
    """
    ops = prep.ops

    def run(rows: Any, p: Any, w: Any, rows_dof: np.ndarray) -> dict[str, Any]:
        d = flux if rows is None else flux[rows]
        if method == "scipy":
            return reference_fit(prep, ops.to_numpy(d), ops.to_numpy(w), ops.to_numpy(p), max_iter, tol, rows_dof)
        return lm_batch(prep, d, w, p, max_iter, tol, rows_dof)

    result = run(None, p0, weight, dof)
    base, used = weight, weight > 0
    clip = used & False  # nothing clipped yet, on the ops' device
    n = len(dof)
    rows = np.arange(n)  # the rows to judge this round: every one, then those refitted in the last round
    for _ in range(CLIP_ROUNDS):
        index = slice(None) if rows.size == n else ops.asint(rows)
        model = evaluate(prep, result["p"][index], flux[index], weight[index]).model  # the continuum as fitted
        resid = base[index] ** 0.5 * (flux[index] - model)
        ok = ops.asarray(~result["broken"][rows], dtype=used.dtype)
        new = outliers(resid, used[index], ops) & ok[:, None]
        changed = np.flatnonzero(ops.to_numpy(ops.xp.any(new != clip[index], 1)))
        if changed.size == 0:
            break
        rows = rows[changed]
        index = ops.asint(rows)
        clip[index] = new[ops.asint(changed)]
        weight = ops.xp.where(clip, ops.asarray(0.0), base)
        clipped_rows = ops.to_numpy(ops.xp.sum(ops.float64(clip[index]), 1)).astype(np.int64)
        again = run(index, result["p"][index], weight[index], dof[rows] - clipped_rows)
        for key in ("p", "chi2", "hessian"):
            result[key][index] = again[key]
        result["iterations"][rows] += again["iterations"]
        result["converged"][rows] = again["converged"]
        result["broken"][rows] |= again["broken"]
    result["clipped"] = ops.to_numpy(ops.xp.sum(ops.float64(clip), 1)).astype(np.int64)
    result["weight"] = weight
    return result


# -- errors, flags and the output columns -------------------------------------------------------


def usable(arm_pixels: np.ndarray, signal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fit this spectrum?, flags) from the data alone: no data, zero signal, a missing arm."""
    flags = np.zeros(len(signal), dtype=np.int32)
    flags[(arm_pixels.sum(axis=1) < MIN_PIXELS) | ~(signal > 0)] |= NO_DATA
    flags[(arm_pixels == 0).any(axis=1)] |= MISSING_ARM
    return (flags & NO_DATA) == 0, flags


def bad_fit_limit(dof: np.ndarray) -> np.ndarray:
    """The reduced chi-square above which a fit is flagged BAD_FIT: ``max(q(dof) / dof, 2)``.

    For an exact model and Gaussian noise of the stated ivar, chi2 follows the chi-square law with
    ``dof`` degrees of freedom; ``q(dof)`` is its quantile exceeded with probability
    ``BAD_FIT_FALSE_ALARM`` (1e-6), so in-model data is flagged about once in a million spectra.
    ``q / dof`` is 1 + ~4.8 sqrt(2 / dof) for large dof: 1.08 for a full 7,958-pixel spectrum, a
    bound no real template grid meets at high signal-to-noise. The floor of 2 tolerates model
    mismatch up to residuals as large again as the noise (errors then understated by up to
    sqrt(2)). Above both, the residuals are not noise (a flux scaled by 1e30 with ordinary ivar,
    unmasked garbage, the wrong kind of star) and the formal errors mean nothing.
    """
    from scipy.stats import chi2

    dof = np.maximum(np.asarray(dof, dtype=np.float64), 1.0)
    return np.maximum(chi2.isf(BAD_FIT_FALSE_ALARM, dof) / dof, BAD_FIT_RCHISQ)


def finish(prep: Prepared, result: dict[str, Any], npix: np.ndarray, flags: np.ndarray,
           fitted: np.ndarray, ncoef_used: np.ndarray) -> dict[str, np.ndarray]:
    """The output columns for every spectrum (NaN where not fitted), with errors and flags.

    ``npix``: the pixels each fit used (clipped ones excluded), which set the degrees of freedom.
    """
    ops = prep.ops
    n = len(flags)
    values = np.full((n, N_PARAMS), np.nan)
    errors = np.full((n, N_PARAMS), np.nan)
    chi2 = np.full(n, np.nan)
    iterations = np.zeros(n, dtype=np.int64)
    clipped = np.zeros(n, dtype=np.int64)
    flags = flags.copy()
    rows = np.flatnonzero(fitted)
    dof = npix - N_PARAMS - ncoef_used
    if rows.size:
        p = ops.to_numpy(result["p"])
        hessian = ops.to_numpy(result["hessian"])
        broken = np.asarray(result["broken"], dtype=bool) | ~np.all(np.isfinite(hessian), axis=(1, 2))
        # an overflowed Hessian is never inverted (numpy may refuse it): the row's errors stay NaN
        safe = np.where(broken[:, None, None], np.eye(N_PARAMS), hessian)
        cov = ops.to_numpy(covariance(prep, ops.asarray(safe, dtype=float64_dtype(ops))))
        values[rows] = p
        errors[rows] = np.where(broken[:, None], np.nan, np.sqrt(np.clip(np.diagonal(cov, 0, 1, 2), 0, None)))
        chi2[rows] = ops.to_numpy(result["chi2"])
        iterations[rows] = result["iterations"]
        clipped[rows] = result.get("clipped", 0)
        lower, upper = ops.to_numpy(prep.lower), ops.to_numpy(prep.upper)
        span = upper - lower
        bound = (np.abs(p - lower) < 1e-6 * span) | (np.abs(p - upper) < 1e-6 * span)
        bound[:, 1] = np.abs(p[:, 1] - upper[1]) < 1e-6 * span[1]  # vsini = 0 is a value, not a failure
        flags[rows[bound.any(axis=1)]] |= AT_BOUND
        flags[rows[~np.asarray(result["converged"], dtype=bool) & ~broken]] |= NOT_CONVERGED
        sigma_v = errors[rows, 0]
        flags[rows[~np.isfinite(sigma_v) | (sigma_v > 100.0)]] |= UNCONSTRAINED
        flags[rows[broken | ~np.isfinite(chi2[rows])]] |= NOT_FINITE
        rchisq = chi2[rows] / np.maximum(dof[rows], 1)
        flags[rows[rchisq > bad_fit_limit(dof[rows])]] |= BAD_FIT
    out = {name.upper(): values[:, i] for i, name in enumerate(PARAM_NAMES)}
    out.update({f"{name.upper()}_ERR": errors[:, i] for i, name in enumerate(PARAM_NAMES)})
    out["VRAD"], out["VRAD_ERR"] = out.pop("V"), out.pop("V_ERR")
    out.update(CHISQ=chi2, RCHISQ=chi2 / np.maximum(dof, 1), NPIX=npix, NCLIP=clipped, ITERATIONS=iterations,
               FLAGS=flags, SUCCESS=(flags & FAILURE) == 0)
    return out
