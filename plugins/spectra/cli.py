"""``crossover fit-spectra`` and ``crossover synth-coadd``, added through the crossover_cli hook.

fit-spectra reads a coadd in batches whose size comes from the memory model
(:func:`plugins.spectra.work.batch_bytes`) and the chosen backend's free
memory, never from a fixed number; after each batch the output file is
rewritten atomically with every row finished so far, so results stream out
as they finish and an interrupted run keeps them.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from core.errors import ProblemError

FREE_FRACTION = 0.5  # of the device's free memory, for one batch


def add_commands(subparsers: Any) -> None:
    fit = subparsers.add_parser("fit-spectra", help="fit RV, vsini and stellar parameters of a DESI-style coadd")
    fit.add_argument("input", help="coadd FITS file (B_/R_/Z_ WAVELENGTH, FLUX, IVAR, MASK; FIBERMAP)")
    fit.add_argument("-o", "--output", required=True, help="results FITS file (written atomically)")
    fit.add_argument("--backend", default="auto", help="auto (the cost model's choice), numpy, numba, process, torch")
    fit.add_argument("--grid", default="small", help="template grid: small, medium, realistic, or a .npz library")
    fit.add_argument("--degree", type=int, default=3, help="Legendre degree of each arm's continuum")
    fit.add_argument("--max-iter", type=int, default=30, help="Levenberg-Marquardt iterations at most")
    fit.add_argument("--batch", type=int, default=None,
                     help="spectra per batch (default: sized from the memory model and the free memory)")
    fit.set_defaults(handler=cmd_fit_spectra)

    synth = subparsers.add_parser("synth-coadd", help="write a synthetic DESI-style coadd with known parameters")
    synth.add_argument("output", help="coadd FITS file to write")
    synth.add_argument("-n", "--spectra", type=int, default=100)
    synth.add_argument("--grid", default="small")
    synth.add_argument("--snr-min", type=float, default=3.0)
    synth.add_argument("--snr-max", type=float, default=100.0)
    synth.add_argument("--seed", type=int, default=0)
    synth.set_defaults(handler=cmd_synth_coadd)


def cmd_synth_coadd(args: argparse.Namespace) -> int:
    from plugins.spectra.fitsio import write_coadd
    from plugins.spectra.problem import SpectraProblem
    from plugins.spectra.synth import synthetic_spectra

    if not 0 < args.snr_min <= args.snr_max:
        raise ProblemError(f"--snr-min={args.snr_min}, --snr-max={args.snr_max} are invalid: must satisfy "
                           "0 < snr-min <= snr-max")
    if args.spectra < 1:
        raise ProblemError(f"--spectra={args.spectra} is invalid: must be at least 1")
    library = SpectraProblem(n_spectra=1, grid=args.grid).library()
    rng = np.random.default_rng(args.seed)
    snr = np.exp(rng.uniform(np.log(args.snr_min), np.log(args.snr_max), args.spectra))
    spectra = synthetic_spectra(library, args.spectra, snr=snr, seed=args.seed)
    write_coadd(spectra, args.output)
    print(f"wrote {args.spectra} spectra (S/N {args.snr_min:g}..{args.snr_max:g}) to {args.output}")
    return 0


def _problem(spectra, args: argparse.Namespace):
    from plugins.spectra.problem import SpectraProblem

    return SpectraProblem(grid=args.grid, degree=args.degree, max_iter=args.max_iter, spectra=spectra)


def choose(path: str, args: argparse.Namespace, n: int) -> tuple[str, int]:
    """The implementation to run and its batch size (from the memory model and that device's free memory)."""
    import core
    from core.backend import safe_free_memory
    from core.registry import get_registry
    from core.solver import backend_of
    from plugins.spectra import work
    from plugins.spectra.fitsio import read_coadd

    first = read_coadd(path, 0, 1)
    nodes = _problem(first, args).nodes
    backends = get_registry().backends

    def batch_for(implementation: str) -> int:
        if args.batch is not None:
            return max(1, min(args.batch, n))
        backend = backends.get(backend_of(implementation))
        free = safe_free_memory(backend) if backend is not None else None
        if free is None:
            free = 8 * 2**30  # a backend that cannot tell: assume a modest 8 GiB
        size = work.largest_batch(first.n_pixels, nodes, implementation, free, n, FREE_FRACTION)
        if size == 0:
            raise ProblemError(f"backend {implementation!r}: even one spectrum does not fit in {FREE_FRACTION:.0%} "
                               f"of its {free / 2**30:.1f} GiB free memory")
        return size

    if args.backend != "auto":
        return args.backend, batch_for(args.backend)
    # plan on the largest batch any implementation could take; the plan rules out what does not fit
    sizes = {}
    for key in core.solvers()["spectra.fit"].implementations:
        try:
            sizes[key] = batch_for(key)
        except ProblemError:
            continue
    probe = read_coadd(path, 0, max(sizes.values(), default=1))
    decision = core.plan(_problem(probe, args), calibrate=True, explain=False)
    return decision.backend, sizes.get(decision.backend, batch_for(decision.backend))


def cmd_fit_spectra(args: argparse.Namespace) -> int:
    import core
    from plugins.spectra.fitsio import coadd_rows, read_coadd, write_results

    if args.max_iter < 1 or args.degree < 0 or (args.batch is not None and args.batch < 1):
        raise ProblemError(f"--max-iter={args.max_iter}, --degree={args.degree}, --batch={args.batch}: "
                           "max-iter and batch must be at least 1, degree at least 0")
    n = coadd_rows(args.input)
    if n == 0:
        raise ProblemError(f"input {args.input!r} holds no spectra")
    implementation, batch = choose(args.input, args, n)
    print(f"crossover fit-spectra: {n} spectra on {implementation}, batches of {batch}", file=sys.stderr)
    parts: list[dict[str, np.ndarray]] = []
    started = time.perf_counter()
    with _progress(n) as advance:
        for start in range(0, n, batch):
            spectra = read_coadd(args.input, start, start + batch)
            result = core.solve(_problem(spectra, args), backend=implementation)
            parts.append(result.outputs)
            write_results(_merge(parts), args.output)  # every finished row is on disk now
            advance(len(spectra))
    merged = _merge(parts)
    ok = int(np.sum(merged["SUCCESS"]))
    seconds = time.perf_counter() - started
    print(f"{n} spectra fitted in {seconds:.1f} s ({n / seconds:.1f} per second) on {implementation}; "
          f"{ok} succeeded, {n - ok} flagged; results in {args.output}")
    return 0


def _merge(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    keys = [k for k, v in parts[0].items() if np.ndim(v) == 1]
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in keys}


class _progress:
    """A rich progress bar on stderr at a terminal; plain lines per batch otherwise."""

    def __init__(self, total: int):
        self.total, self.done, self.bar, self.task = total, 0, None, None

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("fitting"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task("fit", total=self.total)
        return self.advance

    def advance(self, count: int) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        else:
            print(f"fitted {self.done}/{self.total}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
