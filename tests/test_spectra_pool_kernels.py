"""The process backend's workers find every Numba kernel variant a chunk may take already compiled.

``solve.compile_worker_kernels`` fits a chunk of one spectrum and one of
``PARALLEL_FROM`` in the calling process, on read-only inputs as the workers
get them, so both variants are in Numba's cache before any worker calls
them (on a fresh 16-core host the workers had compiled the parallel ones
inside a 4,096-spectrum batch, at a quarter of the throughput).
"""

from __future__ import annotations

import numpy as np
import pytest

from plugins.spectra import numba_kernels, solve
from plugins.spectra.synth import synthetic_spectra
from plugins.spectra.templates import named_library


def _readonly_signature(dispatcher) -> bool:
    return any(getattr(arg, "mutable", True) is False for signature in dispatcher.signatures for arg in signature)


def _batch(n: int, seed: int) -> tuple[object, dict[str, np.ndarray]]:
    """``n`` spectra on the small grid, and the arrays solve_parallel shares with its workers."""
    spectra = synthetic_spectra(named_library("small"), n, snr=30, seed=seed)
    return spectra, solve.shared_arrays(spectra)


def _recording_chunks(monkeypatch) -> list[tuple]:
    """A fresh process's state, and the chunk tasks compile_worker_kernels fits from now on."""
    monkeypatch.setattr(solve, "_WORKER_KERNELS_READY", [])
    fitted: list[tuple] = []
    real = solve.fit_chunk
    monkeypatch.setattr(solve, "fit_chunk", lambda task, views, seed: fitted.append(task) or real(task, views, seed))
    return fitted


def test_both_kernel_variants_are_compiled_for_read_only_inputs_once_per_process(monkeypatch):
    spectra, shared = _batch(numba_kernels.PARALLEL_FROM + 2, 3)
    job = (0, len(spectra), "small", 3, 20, 1e-6, spectra.arm_names)
    fitted = _recording_chunks(monkeypatch)
    solve.compile_worker_kernels(job, shared)
    assert sorted(stop - start for start, stop, *_ in fitted) == [1, numba_kernels.PARALLEL_FROM]
    assert all(task[4] == 1 for task in fitted)  # one iteration each: enough to call every kernel
    for variants in (numba_kernels._SERIAL, numba_kernels._PARALLEL):
        for name, dispatcher in variants.items():
            assert dispatcher.signatures, name
    assert _readonly_signature(numba_kernels._SERIAL["profile"])  # the workers' read-only flux, compiled
    solve.compile_worker_kernels(job, shared)  # once per process
    assert len(fitted) == 2
    assert np.asarray(spectra.flux).flags.writeable  # the caller's arrays are left as they were


@pytest.mark.parametrize("n", [1, 3])
def test_a_batch_smaller_than_a_parallel_chunk_compiles_what_it_can(monkeypatch, n):
    spectra, shared = _batch(n, 4)
    fitted = _recording_chunks(monkeypatch)
    solve.compile_worker_kernels((0, n, "small", 3, 20, 1e-6, spectra.arm_names), shared)
    assert sorted(stop - start for start, stop, *_ in fitted) == sorted({1, n})


def test_every_pool_worker_is_warmed_with_the_serial_kernels_on_read_only_inputs(monkeypatch):
    """The pool's warm-up (core.tasks' ``warm_up``, run once in every worker) fits one iteration of a chunk of
    one spectrum on read-only inputs, as a worker's tasks get them: a worker reached by no earlier map then
    loads nothing inside a timed fit (654 ms against 39 warm on the VM). The parallel kernels are not: with no
    Numba cache every worker would compile them at its first map (27 s against 9 on the VM)."""
    fitted = _recording_chunks(monkeypatch)
    solve.warm_worker_kernels()
    assert [(task[1] - task[0], task[4]) for task in fitted] == [(1, 1)]  # one spectrum, one iteration
    assert _readonly_signature(numba_kernels._SERIAL["profile"])


def test_the_process_backend_names_the_warm_up_and_a_cluster_does_not(monkeypatch):
    from core import tasks

    named = []
    monkeypatch.setattr(tasks, "map_tasks", lambda fn, jobs, **kw: named.append(kw.get("warm_up"))
                        or [fn(job, tasks.readonly_views(kw["shared"]), None) for job in jobs])
    monkeypatch.setattr(solve, "compile_worker_kernels", lambda job, shared: None)
    problem = solve.SpectraProblem(n_spectra=3, n_pixels=500, grid="small")
    for backend in ("process", "dask"):
        solve.solve_parallel(problem, backend)
    assert named == [solve.warm_worker_kernels, None]


def test_a_parallel_backend_pays_a_new_grid_once_as_its_compile_key():
    """Every worker of a pool (or a cluster) loads a grid's templates at its first task on it, and the pool's
    warm-up loads the small grid only: a new grid is a one-off of the parallel implementations, declared as
    their compile key so calibration measures it and a plan charges it (a trial of the pool on the medium grid
    paid 154 ms for a 23 ms fit on the VM). The serial implementations share their process's grids."""
    from core.registry import get_solver

    spec = get_solver("spectra.fit")
    small, medium = (solve.SpectraProblem(n_spectra=2, n_pixels=500, grid=grid) for grid in ("small", "medium"))
    for parallel in ("process", "dask"):
        assert spec.compile_key(small, parallel)[0] == "small" and spec.compile_key(medium, parallel)[0] == "medium"
    assert spec.compile_key(medium, "numba:threads") == spec.compile_key(medium, "numpy") == ()


def test_a_parallel_backend_pays_a_new_wavelength_grid_once_as_its_compile_key():
    """Each pool worker builds the cross-correlation start's design for the data's wavelengths at its first
    task on them (trials of the pool on two spectra paid 195-273 ms for a 22 ms fit on the VM), so the
    wavelength grid is part of the parallel implementations' compile key: the pixel count for synthetic data
    (its wavelengths follow from it), a digest of ``wave`` for given spectra, equal for equal grids."""
    from dataclasses import replace

    from core.registry import get_solver

    spec = get_solver("spectra.fit")
    narrow, wide = (solve.SpectraProblem(n_spectra=2, n_pixels=n) for n in (600, 2_000))
    assert spec.compile_key(narrow, "process") != spec.compile_key(wide, "process")
    assert spec.compile_key(narrow, "process") == spec.compile_key(solve.SpectraProblem(n_spectra=9, n_pixels=600),
                                                                   "process")
    given = synthetic_spectra(named_library("small"), 2, snr=30, seed=1)
    moved = replace(given, wave=given.wave * (1 + 1e-5))
    same, shifted = solve.SpectraProblem(spectra=given), solve.SpectraProblem(spectra=moved)
    twin = solve.SpectraProblem(spectra=replace(given, wave=given.wave.copy()))
    assert spec.compile_key(same, "dask") == spec.compile_key(twin, "dask") != spec.compile_key(shifted, "dask")
    assert spec.compile_key(same, "numba:threads") == ()
