"""Benchmarks of the spectrum fitter (``spectra.fit``): spectra per second against batch size, per backend.

Every benchmark goes through ``core.solve`` with the backend named, on
3-arm DESI-like spectra (7,958 pixels, S/N 20) and the realistic template
grid. ``setup`` fits once before timing, so Numba's compile, the process
pool's start (and each worker's library load) and the library's copy to the
GPU are paid there. The numpy reference fits one spectrum at a time: it is
timed up to 64 spectra only, which keeps a run inside asv's timeout.
``docs/scripts/spectra_throughput.py`` writes the same figures as a table.
"""

from __future__ import annotations

import core
from core.costmodel.calibrate import median_seconds
from plugins.spectra.problem import SpectraProblem
from plugins.spectra.synth import synthetic_spectra
from plugins.spectra.templates import named_library

BACKENDS = ["numpy", "numba:serial", "numba:threads", "process", "torch", "torch:fused", "torch:graph"]
BATCHES = [1, 8, 64, 512, 4096]
GRID = "realistic"
NUMPY_LIMIT = 64


def _problem(batch: int) -> SpectraProblem:
    spectra = synthetic_spectra(named_library(GRID), batch, snr=20.0, seed=1)
    return SpectraProblem(grid=GRID, spectra=spectra)


def _skip(backend: str, batch: int) -> None:
    status = core.availability(backend.split(":", 1)[0])  # a variant runs on its backend
    if not status.available:
        raise NotImplementedError(f"backend {backend!r} is unavailable here: {status.reason}")
    if backend in ("torch:fused", "torch:graph"):  # the Triton variants
        from plugins.spectra.solve import fused_unsupported

        if fused_unsupported():
            raise NotImplementedError(f"{backend} cannot run here: {fused_unsupported()}")
    if backend == "numpy" and batch > NUMPY_LIMIT:
        raise NotImplementedError(f"the numpy reference is timed up to {NUMPY_LIMIT} spectra")


class _Batches:
    """One backend and batch size per case, warmed up (JIT, pool, library on the device) before timing."""

    params = (BACKENDS, BATCHES)
    param_names = ("backend", "batch")
    timeout = 900

    def setup(self, backend: str, batch: int) -> None:
        _skip(backend, batch)
        self.problem = _problem(batch)
        core.solve(_problem(min(batch, 64)), backend=backend)


class SpectraFit(_Batches):
    """Seconds to fit a batch of spectra on each backend."""

    def time_fit(self, backend: str, batch: int) -> None:
        core.solve(self.problem, backend=backend)


class SpectraThroughput(_Batches):
    """Spectra per second (the issues' goals: >= 10 per CPU core; >= 20,000 on a GPU at batch 4096)."""

    def track_spectra_per_second(self, backend: str, batch: int) -> float:
        seconds = median_seconds(lambda: core.solve(self.problem, backend=backend), repeats=1 if batch > 64 else 3)
        return batch / seconds

    track_spectra_per_second.unit = "spectra/s"
