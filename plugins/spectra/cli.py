"""``crossover fit-spectra`` and ``crossover synth-coadd``, added through the crossover_cli hook.

Everything a run needs is checked before it writes anything: the options,
the output path (astropy's ``overwrite`` convention: an existing file is
replaced only with ``--overwrite``, a missing directory is never created,
the input is never the output), the input file's structure, the grid and
the backend. A run refused there leaves no trace.

fit-spectra then fits the coadd in batches. Each finished batch is appended
to a checkpoint beside the output, ``OUT.partial.jsonl`` (:mod:`core.checkpoint`),
so an interrupted or killed run keeps every batch it finished; the same
command run again fits only the rows not yet in it and says how many it
skipped. A batch is sized so that a checkpoint means something: the first
holds ``FIRST_BATCH`` spectra, and each next one about ``BATCH_SECONDS`` of
work at the rate the previous batch ran (growing at most ``GROWTH`` times
per batch), never more than the memory model allows on the chosen backend
(:func:`plugins.spectra.work.largest_batch`); ``--batch N`` fixes the size.
Once every row is fitted, the results table is written atomically and the
checkpoint removed. The checkpoint belongs to the input's bytes and the fit
settings (grid, degree, iterations), not to the backend or the batch size,
which may change between runs. A checkpoint that holds no fitted row (a run
stopped before its first batch ended) holds nothing to lose: it never
blocks a run with other settings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ProblemError

FREE_FRACTION = 0.5  # of the device's free memory, for one batch
FIRST_BATCH = 8  # spectra: about 0.3 s on numba and 2 s on numpy on a 2-core machine, before any rate is known
BATCH_SECONDS = 5.0  # the work in one batch: at most this much is lost to a kill, and progress shows this often
GROWTH = 4  # a batch is at most this many times the previous one: one fast batch is not a rate to trust


def add_commands(subparsers: Any) -> None:
    fit = subparsers.add_parser("fit-spectra", help="fit RV, vsini and stellar parameters of a DESI-style coadd")
    fit.add_argument("input", help="coadd FITS file (B_/R_/Z_ WAVELENGTH, FLUX, IVAR, MASK; FIBERMAP)")
    fit.add_argument("-o", "--output", required=True, help="results FITS file (written atomically)")
    fit.add_argument("--backend", default="auto", help="auto (the cost model's choice), numpy, numba, process, torch")
    fit.add_argument("--grid", default="small", help="template grid: small, medium, realistic, or a .npz library")
    fit.add_argument("--degree", type=int, default=3, help="Legendre degree of each arm's continuum")
    fit.add_argument("--max-iter", type=int, default=30, help="Levenberg-Marquardt iterations at most")
    fit.add_argument("--batch", type=int, default=None,
                     help=f"spectra per batch (default: about {BATCH_SECONDS:g} s of work each, within the free "
                          "memory)")
    fit.add_argument("--overwrite", action="store_true", help="replace the output file if it exists")
    fit.set_defaults(handler=cmd_fit_spectra)

    synth = subparsers.add_parser("synth-coadd", help="write a synthetic DESI-style coadd with known parameters")
    synth.add_argument("output", help="coadd FITS file to write")
    synth.add_argument("-n", "--spectra", type=int, default=100)
    synth.add_argument("--grid", default="small")
    synth.add_argument("--snr-min", type=float, default=3.0)
    synth.add_argument("--snr-max", type=float, default=100.0)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--overwrite", action="store_true", help="replace the output file if it exists")
    synth.set_defaults(handler=cmd_synth_coadd)


def cmd_synth_coadd(args: argparse.Namespace) -> int:
    from plugins.spectra.fitsio import check_astropy, check_output, write_coadd
    from plugins.spectra.problem import SpectraProblem
    from plugins.spectra.synth import synthetic_spectra

    if not 0 < args.snr_min <= args.snr_max:
        raise ProblemError(f"--snr-min={args.snr_min}, --snr-max={args.snr_max} are invalid: must satisfy "
                           "0 < snr-min <= snr-max")
    if args.spectra < 1:
        raise ProblemError(f"--spectra={args.spectra} is invalid: must be at least 1")
    check_output(args.output, args.overwrite, "--overwrite")
    check_astropy()
    library = SpectraProblem(n_spectra=1, grid=args.grid).library()
    rng = np.random.default_rng(args.seed)
    snr = np.exp(rng.uniform(np.log(args.snr_min), np.log(args.snr_max), args.spectra))
    spectra = synthetic_spectra(library, args.spectra, snr=snr, seed=args.seed)
    write_coadd(spectra, args.output, overwrite=args.overwrite)
    print(f"wrote {args.spectra} spectra (S/N {args.snr_min:g}..{args.snr_max:g}) to {args.output}")
    return 0


def _problem(spectra, args: argparse.Namespace):
    from plugins.spectra.problem import SpectraProblem

    return SpectraProblem(grid=args.grid, degree=args.degree, max_iter=args.max_iter, spectra=spectra)


def choose(path: str, args: argparse.Namespace, n: int) -> tuple[str, int]:
    """The implementation to run and its largest batch (``--batch``, or what the memory model lets fit in that
    device's free memory)."""
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


def checkpoint_path(output: str) -> Path:
    """Where fit-spectra keeps the batches of an unfinished run: beside the output."""
    return Path(f"{output}.partial.jsonl")


def cmd_fit_spectra(args: argparse.Namespace) -> int:
    from core.cli import Interrupted

    n = _validate(args)
    store = _open_checkpoint(args, n)
    table = _Table(n)
    try:
        for number, record in enumerate(store.records, start=1):
            table.take(*_checked_batch(store.path, number, record, n))
        skipped = table.count()
        if store.records:
            print(f"resumed: {skipped} of {n} spectra already fitted, skipped (from {store.path})", file=sys.stderr)
        started = time.perf_counter()
        implementation = _fit_missing(args, table, store) if skipped < n else None
        seconds = time.perf_counter() - started
        merged = table.assembled()
        _write(args, merged, table.backends, store.path)
    except KeyboardInterrupt as interrupt:
        if type(interrupt) is not KeyboardInterrupt:  # one that already says what it kept (calibration's)
            raise
        if not store.records and table.count() == 0:
            raise Interrupted("stopped before any spectrum was fitted; nothing was kept") from None
        raise Interrupted(f"kept the spectra fitted so far in {store.path}; run the same command again to resume "
                          f"from there") from None
    finally:
        if not store.records and table.count() == 0:
            store.remove()  # it holds no fitted row: nothing to keep, and nothing to block the next run
        else:
            store.close()
    store.remove()  # only once the table is safely on disk
    ok, fitted = int(np.sum(merged["SUCCESS"])), n - skipped
    if implementation is None:
        done = f"no spectra left to fit ({skipped} resumed)"
    else:
        rate = f" ({fitted / seconds:.1f} per second)" if seconds > 0 else ""
        done = f"{fitted} spectra fitted in {seconds:.1f} s{rate} on {implementation}"
        done += f", {skipped} resumed" if skipped else ""
    print(f"{done}; {ok} succeeded, {n - ok} flagged; results in {args.output}")
    return 0


def _write(args: argparse.Namespace, columns: dict[str, np.ndarray], backends: list[str], kept: Path) -> None:
    """Write the results table, with its provenance; the checkpoint stays until this returns."""
    from core.checkpoint import file_fingerprint
    from plugins.spectra import fitsio

    try:  # again: a file may have appeared at the output while the spectra were being fitted
        fitsio.check_output(args.output, args.overwrite, "--overwrite")
    except ProblemError as exc:
        raise ProblemError(f"{exc}; the fitted spectra are kept in {kept}, so that run does no fitting again") \
            from None
    provenance = _provenance(args, backends, file_fingerprint(args.input))
    fitsio.write_results(columns, args.output, provenance, overwrite=True)


def _validate(args: argparse.Namespace) -> int:
    """Check everything a run needs before it writes anything; the number of spectra in the input.

    A run refused here leaves no file behind, so the corrected command starts clean.
    """
    from core.running import check_backend
    from plugins.spectra import fitsio

    if args.max_iter < 1 or args.degree < 0 or (args.batch is not None and args.batch < 1):
        raise ProblemError(f"--max-iter={args.max_iter}, --degree={args.degree}, --batch={args.batch}: "
                           "max-iter and batch must be at least 1, degree at least 0")
    _check_not_input(args.input, args.output)
    fitsio.check_output(args.output, args.overwrite, "--overwrite")
    fitsio.check_astropy()
    n = fitsio.coadd_rows(args.input)
    if n == 0:
        raise ProblemError(f"input {args.input!r} holds no spectra")
    # every arm's HDUs, the grid, the degree and the spectra themselves, as a solve will see them
    _problem(fitsio.read_coadd(args.input, 0, 1), args).nodes  # noqa: B018 (.nodes loads a library file)
    if args.backend != "auto":
        import core

        check_backend(core.solvers()["spectra.fit"], args.backend)
    return n


def _check_not_input(source: str, output: str) -> None:
    """Refuse an output that is the input file itself (by any path, link or symlink): it would be replaced."""
    import os

    try:
        same = os.path.samefile(source, output)
    except OSError:  # one of them does not exist (yet): then they are not the same file
        return
    if same:
        raise ProblemError(f"output {output!r} is the input file {source!r}: writing the results there would "
                           "replace the spectra; give another output path")


def _provenance(args: argparse.Namespace, backends: list[str], digest: str) -> dict[str, tuple[Any, str]]:
    """What made the table, for its primary header: keyword -> (value, comment)."""
    import core

    grid = Path(args.grid).name if args.grid.endswith(".npz") else args.grid
    return {  # each card fits 80 columns: a comment too long would be cut, with a warning
        "ORIGIN": ("crossover", "crossover fit-spectra"),
        "CROSSVER": (core.__version__, "crossover version"),
        "INFILE": (Path(args.input).name, "input coadd"),
        "INSHA256": (digest, ""),  # the SHA-256 of the input: 64 characters leave no room for a comment
        "GRID": (grid, "template grid (--grid)"),
        "DEGREE": (args.degree, "continuum Legendre degree (--degree)"),
        "MAXITER": (args.max_iter, "LM iterations at most (--max-iter)"),
        "BACKREQ": (args.backend, "backend asked for (--backend)"),
        "BACKEND": (", ".join(backends), "implementations that fitted the rows"),
        "BATCH": (args.batch if args.batch is not None else "auto", "spectra per batch (--batch)"),
    }


def _open_checkpoint(args: argparse.Namespace, n: int) -> Any:
    """The run's checkpoint; a repair of a cut-off last line is one ``crossover: warning:`` line.

    A checkpoint of other settings that holds no fitted row (a run stopped
    before its first batch ended) is replaced: it has nothing to lose.
    """
    import warnings

    from core.checkpoint import CheckpointError, CheckpointWarning, open_checkpoint

    path, identity = checkpoint_path(args.output), _run_identity(args, n)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        try:
            store = open_checkpoint(path, identity)
        except CheckpointError:
            if not _holds_no_rows(path):
                raise
            path.unlink()
            store = open_checkpoint(path, identity)
    for warning in caught:  # open_checkpoint warns of nothing else
        print(f"crossover: warning: {warning.message}", file=sys.stderr)
    return store


def _holds_no_rows(path: Path) -> bool:
    """Whether ``path`` is a checkpoint with a header and nothing else (a user's other file never is)."""
    import json

    from core.checkpoint import FORMAT

    try:
        lines = path.read_bytes().splitlines()
        header = json.loads(lines[0]) if len(lines) == 1 else None
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("format") == FORMAT


def _fit_missing(args: argparse.Namespace, table: _Table, store: Any) -> str:
    """Fit the rows not in ``table`` batch by batch, appending each batch to the checkpoint as it finishes."""
    import core
    from plugins.spectra.fitsio import RESULT_COLUMNS, read_coadd

    implementation, largest = choose(args.input, args, table.n)
    size = largest if args.batch is not None else min(FIRST_BATCH, largest)
    sizing = (f"batches of {size}" if args.batch is not None else
              f"batches of about {BATCH_SECONDS:g} s each (the first {size} spectra, at most {largest} by memory)")
    print(f"crossover fit-spectra: {table.n - table.count()} spectra on {implementation}, {sizing}", file=sys.stderr)
    with _progress(table.n, table.count()) as advance:
        for first, last in table.missing():
            start = first
            while start < last:
                stop = min(start + size, last)
                clock = _clock()
                result = core.solve(_problem(read_coadd(args.input, start, stop), args), backend=implementation)
                seconds = _clock() - clock
                outputs = {name: np.asarray(result.outputs[name]) for name in RESULT_COLUMNS}
                store.append({"start": start, "stop": stop, "outputs": outputs, "backend": result.backend,
                              "seconds": seconds})  # on disk now: a crash keeps it
                table.take(start, stop, outputs, result.backend)
                advance(stop - start)
                if args.batch is None:
                    size = next_batch(size, stop - start, seconds, largest)
                start = stop
    return implementation


def _clock() -> float:
    return time.perf_counter()


def next_batch(size: int, rows: int, seconds: float, largest: int) -> int:
    """The next batch's size: about ``BATCH_SECONDS`` of work at the rate ``rows`` spectra took ``seconds``.

    At most ``GROWTH`` times ``size`` (a rate measured on a few spectra is
    rough) and at most ``largest`` (what fits in memory); at least 1.
    """
    grown = min(GROWTH * size, largest)
    if seconds <= 0:  # a clock too coarse to see the batch: it was quick
        return max(1, grown)
    return max(1, min(int(BATCH_SECONDS * rows / seconds), grown))


def _run_identity(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """What makes two fit-spectra runs the same: the input's bytes and the settings that change a fit."""
    from core.checkpoint import file_fingerprint

    grid = file_fingerprint(args.grid) if Path(args.grid).is_file() else args.grid  # a library file: its bytes
    return {"kind": "fit-spectra", "input": file_fingerprint(args.input), "spectra": n, "grid": grid,
            "degree": args.degree, "max_iter": args.max_iter}


def _checked_batch(path: Path, number: int, record: Any, n: int) -> tuple[int, int, dict[str, Any], str]:
    """A checkpoint record as (start, stop, outputs, backend), or a clear error for one this command did not write."""
    from core.checkpoint import CheckpointError
    from plugins.spectra.fitsio import RESULT_COLUMNS

    fields = record if isinstance(record, dict) else {}
    start, stop, outputs = fields.get("start"), fields.get("stop"), fields.get("outputs")
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop <= n
            and isinstance(outputs, dict)
            and all(np.shape(outputs.get(name)) == (stop - start,) for name in RESULT_COLUMNS)):
        raise CheckpointError(f"checkpoint {path} is corrupt: record {number} is not a batch of rows of this input "
                              f"(start={start!r}, stop={stop!r}, {n} spectra, one value per row in each result "
                              f"column); delete it to start afresh")
    backend = fields.get("backend")
    return start, stop, outputs, backend if isinstance(backend, str) else "unknown"


class _Table:
    """The result rows fitted so far, in any order and batch size, and the runs of rows still to fit."""

    def __init__(self, n: int):
        self.n = n
        self.filled = np.zeros(n, dtype=bool)
        self.rows: list[np.ndarray] = []
        self.columns: dict[str, list[np.ndarray]] = {}
        self.backends: list[str] = []  # the implementations that fitted the rows, each once, first use first

    def take(self, start: int, stop: int, outputs: dict[str, Any], backend: str) -> None:
        """Add rows ``start:stop``, but not those already there (two runs at once may fit a row twice)."""
        if backend not in self.backends:
            self.backends.append(backend)
        new = ~self.filled[start:stop]
        self.filled[start:stop] = True
        self.rows.append(np.arange(start, stop)[new])
        for name, values in outputs.items():
            self.columns.setdefault(name, []).append(np.asarray(values)[new])

    def count(self) -> int:
        return int(self.filled.sum())

    def missing(self) -> list[tuple[int, int]]:
        """The runs of consecutive rows not fitted yet, as (start, stop) pairs."""
        edges = np.flatnonzero(np.diff(np.concatenate([[True], self.filled, [True]]).astype(np.int8)))
        return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]

    def assembled(self) -> dict[str, np.ndarray]:
        """Every column in input row order."""
        order = np.argsort(np.concatenate(self.rows), kind="stable")
        return {name: np.concatenate(parts)[order] for name, parts in self.columns.items()}


class _progress:
    """A rich progress bar on stderr at a terminal; plain lines per batch otherwise."""

    def __init__(self, total: int, done: int = 0):
        self.total, self.done, self.bar, self.task = total, done, None, None

    def __enter__(self):
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("fitting"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task("fit", total=self.total, completed=self.done)
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
