"""The spectrum fitter: batched stellar radial velocities, vsini and parameters (after rvspecfit).

``spectra.fit`` fits a batch of spectra (v, vsini, teff, logg, [Fe/H],
[alpha/Fe], with errors from the curvature) on numpy (scipy, one spectrum
at a time: the reference), numba (the batched Levenberg-Marquardt on CPU,
threaded or serial), any parallel backend (chunks of spectra as tasks) and
torch (the batched fit on the GPU, eager or with its model kernels fused in
Triton). :func:`fit_spectra` is the entry point for users; ``crossover
fit-spectra`` runs it on a DESI-style coadd FITS file.
See docs/spectra.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core import SolverSpec, hookimpl
from core.solver import SizeSpace, lazy
from plugins.spectra import work
from plugins.spectra.model import Spectra
from plugins.spectra.problem import FULL_PIXELS, SpectraProblem

__version__ = "0.14.0"  # 0.2: the "steps" feature; 0.3: balanced process chunks; 0.4: the CCF start by one product;
# 0.5: a fifth of the torch launches per step, process chunks of at most 16 spectra; 0.6: numba:threads's span;
# 0.7: tol and degree in the space, the continuum's feature; 0.8: outlier clipping, absolute convergence,
# ITERATIONS as trial steps everywhere; 0.9: the cubic read and the rotation kernel on the cubic basis (vsini
# unbiased at low values); 0.10: torch:fused (Triton), clipping judged on the device; 0.11: numba:threads runs
# the serial kernels on a batch of one; 0.12: a parallel backend's grid is its compile key (its workers load each
# grid once: calibration measures that one-off apart); 0.13: and the data's wavelength grid (each worker builds
# the CCF start's design for it; in one process every backend shares one build), and the per-call "pixels"
# feature; 0.14: torch:graph's eager steps and capture as features of its own (older timings mismeasure the newer
# code or lack the newer features: a version change recalibrates)
__all__ = ["Spectra", "SpectraProblem", "fit_spectra"]


def _space(quick: bool) -> SizeSpace:
    """Every field a user sets that moves the cost varies, so each feature's price is identified.

    Batch size, pixels, the iteration cap, the tolerance, the continuum's
    degree and the template grid. ``tol`` (a decade either side of its
    default, 1e-7) moves the work only through the iterations each spectrum
    runs, which every solve reports (``work_done``). The signal-to-noise of
    synthetic spectra and the seed make the data, not the work. Quick keeps
    most problems under calibration's 0.5 s sample cap on a 2-core VM (the
    numpy reference fits one spectrum at a time: 8 spectra x 5 iterations
    take about a second there, and degree 5 about twice degree 3); full goes
    to 4,096 spectra and the realistic grid.
    """
    if quick:
        return SizeSpace(ranges={"n_spectra": (1, 8), "n_pixels": (500, FULL_PIXELS), "max_iter": (1, 5),
                                 "tol": (1e-9, 1e-5), "degree": (2, 5)},
                         choices={"grid": ["small", "medium"]})
    return SizeSpace(ranges={"n_spectra": (1, 4_096), "n_pixels": (1_000, FULL_PIXELS), "max_iter": (2, 40),
                             "tol": (1e-9, 1e-5), "degree": (1, 10)},
                     choices={"grid": ["small", "medium", "realistic"]})


def _summarize(problem: SpectraProblem, outputs: Any) -> str:
    ok = np.asarray(outputs["SUCCESS"], dtype=bool)
    median_error = float(np.nanmedian(outputs["VRAD_ERR"])) if ok.any() else float("nan")
    text = f"{problem.n_spectra} spectra, {int(ok.sum())} fitted; median VRAD_ERR {median_error:.2f} km/s"
    truth = problem.data().truth
    if truth is not None and ok.any():
        pull = (np.asarray(outputs["VRAD"]) - truth[:, 0])[ok] / np.asarray(outputs["VRAD_ERR"])[ok]
        text += f", RV pull std {np.std(pull):.2f} (1 expected)"
    return text


SPEC = SolverSpec(
    name="spectra.fit",
    problem_type=SpectraProblem,
    implementations={"numpy": lazy("plugins.spectra.solve", "solve_numpy"),
                     "numba:threads": lazy("plugins.spectra.solve", "solve_numba", parallel=True),
                     "numba:serial": lazy("plugins.spectra.solve", "solve_numba", parallel=False),
                     "torch": lazy("plugins.spectra.solve", "solve_torch"),
                     "torch:fused": lazy("plugins.spectra.solve", "solve_torch", fused=True),
                     "torch:graph": lazy("plugins.spectra.solve", "solve_torch", graph=True)},
    supports=lambda problem, implementation: _supports(problem, implementation),
    parallel=lazy("plugins.spectra.solve", "solve_parallel"),
    parallel_tasks=lambda problem: float(len(_chunks(problem.n_spectra))),
    compile_key=lambda problem, implementation: _compile_key(problem, implementation),
    # the Triton variants' keys are Triton's compiles, which its disk cache keeps for later processes; the pool's
    # (its workers' templates and designs) are paid again by every process's workers
    compile_cached=frozenset({"torch:fused", "torch:graph"}),
    span_feature="template_iterations",
    # numba:threads shares the batch's spectra among Numba's threads (solve_numba)
    thread_items={"numba:threads": lambda problem: float(problem.n_spectra)},
    # torch:graph's first steps launch kernel by kernel and one step is captured (work.graph_features)
    implementation_features={"torch:graph": work.graph_features},
    features=work.features,
    work_done=work.work_done,
    size_axis="n_spectra",
    space=_space,
    memory=work.memory,
    # small: the core builds the default problem whenever it loads the registry (synthetic spectra are made then)
    default_problem=lambda: SpectraProblem(n_spectra=16),
    default_params=lambda: {"n_spectra": 16},
    summarize=_summarize,
    description="stellar RV, vsini, teff, logg, [Fe/H], [alpha/Fe] of a batch of 3-arm spectra (CCF + LM)",
    version=__version__,
)


def _supports(problem: SpectraProblem, implementation: str) -> str:
    from plugins.spectra.solve import supports

    return supports(problem, implementation)


def _compile_key(problem: SpectraProblem, implementation: str) -> tuple:
    from plugins.spectra.solve import compile_key

    # an implementation the spec does not list is its parallel one, under a mapping backend's name
    return compile_key(problem, implementation, parallel=implementation not in SPEC.implementations)


def _chunks(n: int) -> list[tuple[int, int]]:
    from plugins.spectra.solve import chunks

    return chunks(n)


def fit_spectra(spectra: Spectra, *, backend: str = "auto", grid: str = "small", degree: int = 3,
                max_iter: int = 30, tol: float = 1e-7) -> Any:
    """Fit ``spectra`` on ``backend`` (``auto``: the cost model's choice); returns a ``core.Result``.

    ``result.outputs`` holds one column per output (TARGETID, VRAD, VRAD_ERR, VSINI, TEFF, LOGG, FEH,
    ALPHA, their _ERR, CHISQ, RCHISQ, FLAGS, SUCCESS ...), one row per spectrum, in input order.
    """
    import core

    problem = SpectraProblem(grid=grid, degree=degree, max_iter=max_iter, tol=tol, spectra=spectra)
    return core.solve(problem, backend=backend)


@hookimpl
def crossover_solvers() -> list[SolverSpec]:
    return [SPEC]


@hookimpl
def crossover_cli(subparsers) -> None:
    from plugins.spectra.cli import add_commands

    add_commands(subparsers)
