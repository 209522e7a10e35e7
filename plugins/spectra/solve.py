"""The implementations of spectra.fit, one per backend, all through :func:`fit_batch`.

- ``numpy``: the reference, scipy's least_squares one spectrum at a time;
- ``numba:threads`` and ``numba:serial``: the batched Levenberg-Marquardt on
  NumPy arrays with Numba's hot loops, threaded over spectra or not (a
  parallel region's wake-up outweighs a small batch's work: measured, not guessed);
- ``torch``: the same batched fit on the GPU, every spectrum and iteration on
  the device (the templates stay there between calls); ``torch:fused`` with
  the model's two template kernels fused in Triton (``triton_kernels.py``);
- ``process`` (and any backend with a ``map``): chunks of spectra as tasks
  through ``core.tasks.map_tasks``, each fitted by the numba path.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from core import tasks
from plugins.spectra.fit import ccf_design, ccf_start, finish, fit_clipped, usable
from plugins.spectra.model import ARMS, N_PARAMS, Spectra, check_spectra, prepare
from plugins.spectra.ops import NumpyOps, TorchOps
from plugins.spectra.problem import SpectraProblem
from plugins.spectra.templates import TemplateLibrary


def fit_batch(spectra: Spectra, library: TemplateLibrary, ops: Any, *, method: str = "lm", degree: int = 3,
              max_iter: int = 30, tol: float = 1e-7, table: Any = None) -> dict[str, np.ndarray]:
    """Fit every spectrum of ``spectra``; the output columns (see :func:`plugins.spectra.fit.finish`).

    ``spectra`` is validated first (:func:`plugins.spectra.model.check_spectra`); the fit clips
    outlying pixels (:func:`plugins.spectra.fit.fit_clipped`).
    """
    spectra = check_spectra(spectra)
    prep = prepare(ops, library, spectra.wave, spectra.arm, degree, table)
    flux, weight = clean(ops, spectra.flux, spectra.ivar)  # on the device: the host never converts a batch
    arm_pixels, signal = usable_measures(prep, flux, weight)
    fitted, flags = usable(arm_pixels, signal)
    rows = np.flatnonzero(fitted)
    npix = arm_pixels.sum(axis=1)
    ncoef = (arm_pixels > 0).sum(axis=1) * (degree + 1)
    result: dict[str, Any] = {}
    if rows.size:
        if rows.size < len(fitted):
            index = ops.asint(rows)
            flux, weight = flux[index], weight[index]
        p0 = ccf_start(prep, flux, weight, ccf_design(prep, library))
        result = fit_clipped(prep, flux, weight, p0, method=method, max_iter=max_iter, tol=tol,
                             dof=(npix - N_PARAMS - ncoef)[rows].astype(np.float64))
        npix[rows] -= result["clipped"]
    out = finish(prep, result, npix, flags, fitted, ncoef)
    out["TARGETID"] = np.asarray(spectra.targetid)
    return out


def clean(ops: Any, flux: Any, ivar: Any) -> tuple[Any, Any]:
    """(flux, weight) on the ops' device, every unusable pixel (NaN or infinite flux, ivar <= 0 or not finite)
    weighted 0 and its flux set to 0."""
    xp = ops.xp
    f, iv = ops.asarray(flux), ops.asarray(ivar)
    good = xp.isfinite(f) & xp.isfinite(iv) & (iv > 0)
    zero = ops.asarray(0.0)
    return xp.where(good, f, zero), xp.where(good, iv, zero)


def usable_measures(prep: Any, flux: Any, weight: Any) -> tuple[np.ndarray, np.ndarray]:
    """Usable pixels per arm (B, arms) and the weighted signal sum(ivar flux^2) (B,), on the host."""
    ops, xp = prep.ops, prep.ops.xp
    used = weight > 0
    per_arm = xp.stack([xp.sum(used[:, a:b], 1) for a, b in prep.arm_slices], 1)
    return ops.to_numpy(per_arm).astype(np.int64), ops.to_numpy(xp.sum(ops.float64(weight * flux * flux), 1))


def numba_ops(parallel: bool | None = None) -> NumpyOps:
    """NumPy arithmetic with every batch-sized loop compiled by Numba (imported on first use).

    ``parallel``: threaded (True) or serial (False) kernels; None picks by batch size.
    """
    from plugins.spectra.numba_kernels import NumbaOps

    return NumbaOps(parallel)


def _outputs(columns: dict[str, np.ndarray], seconds: float) -> dict[str, np.ndarray]:
    columns["fit_seconds"] = np.float64(seconds)
    return columns


def _solve(problem: SpectraProblem, ops: Any, method: str, table: Any = None) -> dict[str, np.ndarray]:
    started = time.perf_counter()
    columns = fit_batch(problem.data(), problem.library(), ops, method=method, degree=problem.degree,
                        max_iter=problem.max_iter, tol=problem.tol, table=table)
    return _outputs(columns, time.perf_counter() - started)


def solve_numpy(problem: SpectraProblem) -> dict[str, np.ndarray]:
    return _solve(problem, NumpyOps(), "scipy")


def solve_numba(problem: SpectraProblem, parallel: bool) -> dict[str, np.ndarray]:
    from core.backends.numba_threads import threads_at_most

    with threads_at_most(problem.n_spectra if parallel else 1) as threads:  # the kernels are parallel over spectra
        # on one thread a parallel region is all overhead: on the H200 host a 1-spectrum fit took 7.5 ms with
        # the threaded kernels and 5.5 ms with the serial ones, and the models chose the threaded (35.6 % regret)
        return _solve(problem, numba_ops(threads > 1), "lm")


_DEVICE_TABLES: dict[tuple, Any] = {}


def device_table(library: TemplateLibrary, ops: TorchOps) -> Any:
    """The library's templates on the device, copied once per process (a realistic grid is ~400 MB)."""
    key = (id(library), str(ops.device), str(ops.dtype))
    if key not in _DEVICE_TABLES:
        _DEVICE_TABLES.clear()  # one library on the device at a time
        _DEVICE_TABLES[key] = ops.asarray(library.logflux)
    return _DEVICE_TABLES[key]


def fused_unsupported(problem: SpectraProblem | None = None) -> str:
    """Why the Triton kernels (``torch:fused``) cannot run here ("" when they can): Triton, then CUDA."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    from core.backends.torch_gpu import cuda_available

    if not cuda_available():
        return "the Triton spectrum kernels need a CUDA device"
    return ""


def compile_key(problem: SpectraProblem, implementation: str, parallel: bool = False) -> tuple:
    """What a first run pays for again at a new key: the Triton variants compile their kernels for the
    continuum's degree, the grid and the arm count (triton_kernels' constexprs); a parallel backend's workers
    (``parallel``: the pool's, a cluster's) each load a grid's templates at their first task on it, and build
    the cross-correlation start's design for the data's wavelengths (:func:`~plugins.spectra.fit.ccf_design`);
    () for the others.

    The pool's warm-up loads the small grid (:func:`warm_worker_kernels`); a trial of the pool on a fit on the
    medium grid in `crossover evaluate` on the VM paid 154 ms for a 23 ms fit, every worker reading the grid,
    which nothing declared, and the loop took 2.1x the calls naming numba:threads. Trials of the pool on the
    small grid took 195-273 ms where its warm fit took 22 ms: each worker built the design for the new
    wavelengths (5-100 ms a build, with 600-5,600 pixels on the VM). In one process the design is built once
    per wavelength grid for every backend, so it is no one-off of a backend there.
    """
    if parallel:
        return (problem.grid, wavelength_key(problem))
    if implementation not in ("torch:fused", "torch:graph"):
        return ()
    arms = len(problem.spectra.arm_names) if problem.spectra is not None else len(ARMS)  # synthetic: every arm
    return (problem.degree, problem.grid, arms)


def wavelength_key(problem: SpectraProblem) -> Hashable:
    """The data's wavelength grid, as a key: synthetic data's follows from its pixel count
    (:func:`~plugins.spectra.model.arm_wavelengths`); given spectra's is a digest of ``wave``, kept on the
    problem (a plan asks for it once per implementation)."""
    if problem.spectra is None:
        return ("synthetic", problem.n_pixels)
    kept = problem.__dict__.get("_wavelength_key")
    if kept is None:
        wave = np.ascontiguousarray(problem.spectra.wave, dtype=np.float64)
        kept = hashlib.blake2b(wave.tobytes(), digest_size=16).hexdigest()
        object.__setattr__(problem, "_wavelength_key", kept)  # a cache, not a field (equality ignores it)
    return kept


def supports(problem: SpectraProblem, implementation: str) -> str:
    return fused_unsupported(problem) if implementation in ("torch:fused", "torch:graph") else ""


def solve_torch(problem: SpectraProblem, device: Any = None, fused: bool = False,
                graph: bool = False) -> dict[str, np.ndarray]:
    """The batched fit on the torch backend's GPU (``device`` overrides it: ``"cpu"`` in development).

    ``fused``: the model's interpolation and broadening-and-read as Triton kernels
    (:mod:`plugins.spectra.triton_kernels`) instead of eager torch operations. ``graph``
    (``torch:graph``): those kernels with the rotation kernels, the Doppler shift and the small solves
    in Triton too, and the LM iteration at a fixed shape with its step captured as a CUDA graph
    (``triton_kernels.GraphOps``, ``fit.lm_static``).
    """
    fused = fused or graph
    if fused and fused_unsupported(problem):
        raise ValueError(f"the fused spectrum kernels cannot run here: {fused_unsupported(problem)}")
    if graph:
        from plugins.spectra.triton_kernels import GraphOps as make_ops
    elif fused:
        from plugins.spectra.triton_kernels import TritonOps as make_ops
    else:
        make_ops = TorchOps
    if device is None:
        from core.backends.torch_gpu import device as gpu
        from core.backends.torch_gpu import synchronize

        ops = make_ops(gpu())
    else:
        ops, synchronize = make_ops(device), (lambda: None)
    library = problem.library()
    out = _solve(problem, ops, "lm", table=device_table(library, ops))
    synchronize()
    return out


# -- the parallel backends: chunks of spectra as tasks ------------------------------------------


def fit_chunk(task: tuple, shared: Mapping[str, np.ndarray], seed: Any) -> dict[str, np.ndarray]:
    """One chunk of rows, fitted by the numba path; runs in a worker."""
    from core.backends.numba_threads import threads_at_most

    start, stop, grid, degree, max_iter, tol, names = task
    spectra = Spectra(wave=shared["wave"], arm=shared["arm"], flux=shared["flux"][start:stop],
                      ivar=shared["ivar"][start:stop], targetid=shared["targetid"][start:stop], arm_names=names)
    library = SpectraProblem(n_spectra=1, grid=grid, spectra=spectra).library()
    with threads_at_most(stop - start):  # idle workers' cores, shared by the chunk's spectra
        return fit_batch(spectra, library, numba_ops(), degree=degree, max_iter=max_iter, tol=tol)


_WORKER_KERNELS_READY: list[bool] = []


def compile_worker_kernels(job: tuple, shared: Mapping[str, np.ndarray]) -> None:
    """Compile here, once per process, every Numba kernel variant a worker's chunk may take, for its workers.

    A chunk of ``PARALLEL_FROM`` spectra or more runs the parallel kernels,
    a smaller one the serial: which ones a batch meets depends on its size.
    Numba compiles each on its first call in each worker, and saves it to
    its cache for later processes. On a fresh 16-core H200 host the first
    batch of 4,096 (chunks of 16) ran at 115 spectra per second against 477
    in the next process: all 16 workers compiled the three parallel kernels
    at once, about 27 s, inside the batch (``NUMBA_DEBUG_CACHE=1``,
    ``docs/results/gpu-2026-11-27k/a-pool1.log``); the warm-up's smaller
    chunks had compiled the serial ones. Fitted here first (one iteration of
    one spectrum and of ``PARALLEL_FROM``, on read-only inputs as the
    workers get them: Numba types a read-only array apart), both variants
    are in the cache when the workers first call them, which they load.
    """
    from plugins.spectra.numba_kernels import PARALLEL_FROM

    if _WORKER_KERNELS_READY:
        return
    views = tasks.readonly_views(shared)
    start, _, grid, degree, _, tol, names = job
    available = len(views["flux"]) - start
    for count in sorted({1, min(PARALLEL_FROM, available)}):
        fit_chunk((start, start + count, grid, degree, 1, tol, names), views, None)
    _WORKER_KERNELS_READY.append(True)


def warm_worker_kernels() -> None:
    """Load the fit's serial Numba kernels and the small grid in a pool worker (core.tasks' ``warm_up``: every
    worker, at the pool's first map of a fit).

    A worker loads them on its first task otherwise, and a map of few chunks
    reaches few workers: on the 2-core VM a fit of two spectra took 654 ms on
    its second call (the other worker's first task) against 39 warm, and a
    trial of the pool on a new problem in `crossover evaluate` paid 629-759 ms
    for a 46 ms fit (a 5.8-6.2x loop). The parallel kernels are left to the
    first chunk of ``PARALLEL_FROM`` spectra (a batch over 256): warmed here
    too, a process with no Numba cache had every worker compile them at its
    first map, 27 s against 9 on the VM, for fits that never ran them.
    """
    problem = SpectraProblem(n_spectra=1, n_pixels=500, grid="small")
    spectra = problem.data()
    fit_chunk((0, 1, problem.grid, problem.degree, 1, problem.tol, spectra.arm_names),
              tasks.readonly_views(shared_arrays(spectra)), None)


def shared_arrays(spectra: Spectra) -> dict[str, np.ndarray]:
    """The arrays a fit's tasks share (read-only in the workers; :func:`fit_chunk` slices the rows)."""
    return {"wave": np.asarray(spectra.wave), "arm": np.asarray(spectra.arm), "flux": np.asarray(spectra.flux),
            "ivar": np.asarray(spectra.ivar), "targetid": np.asarray(spectra.targetid)}


MAX_CHUNK = 16  # spectra a task fits at most


def chunks(n: int) -> list[tuple[int, int]]:
    """``ceil(n / 4)`` chunks, at most 64 (enough tasks to balance 16 workers, whatever the pool's size)
    unless that makes them larger than ``MAX_CHUNK``, their sizes differing by at most one.

    Equal sizes: fixed chunks of 4 split 6 spectra 4 + 2, and one of two workers idled for a third of
    the run (the cost model's span assumes equal tasks). The cap: 16 workers fitting 64 spectra each
    (a batch of 4,096) ran 3.6x slower per spectrum than with chunks of 16 (155 against 559 spectra
    per second on the H200 host, docs/results/gpu-2026-11-26c/9-*). Part of it on the VM: a
    64-spectrum evaluation's arrays (64 MB of interpolated templates) exceed glibc's 32 MiB mmap limit,
    so every evaluation faulted them in afresh, in every worker at once. The pool's workers now keep
    freed memory (core.backends.worker_memory): on the 2-core VM, chunks of 64 went from 69-77 to
    143-147 spectra per second at a batch of 1,024, against 101-135 for chunks of 16 either way. On
    the H200 host a fresh machine's first run at 4,096 still lost 70 % with it (docs/spectra.md).
    """
    count = max(1, min(64, -(-n // 4)), -(-n // MAX_CHUNK))
    base, extra = divmod(n, count)
    bounds, start = [], 0
    for index in range(count):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return [bound for bound in bounds if bound[1] > bound[0]]


def solve_parallel(problem: SpectraProblem, backend: str) -> dict[str, np.ndarray]:
    started = time.perf_counter()
    spectra = problem.data()
    problem.library()  # a named grid is generated and saved here once, then every worker reads the file
    bounds = chunks(len(spectra))
    jobs = [(a, b, problem.grid, problem.degree, problem.max_iter, problem.tol, spectra.arm_names) for a, b in bounds]
    shared = shared_arrays(spectra)
    if backend == "process":  # workers on this machine load what this process compiles (not a cluster's)
        compile_worker_kernels(jobs[0], shared)
    parts = tasks.map_tasks(fit_chunk, jobs, shared=shared, labels=[f"spectra {a}..{b - 1}" for a, b in bounds],
                            backend=backend, warm_up=warm_worker_kernels if backend == "process" else None)
    columns = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    return _outputs(columns, time.perf_counter() - started)


def parallel_tasks(problem: SpectraProblem) -> float:
    return float(len(chunks(problem.n_spectra)))
