"""The spectra.fit problem: a batch of spectra, the template grid, the continuum degree and the iteration limit."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.errors import ProblemError
from core.validation import check_float, check_int, check_seed, fail
from plugins.spectra.model import Spectra, arm_wavelengths, check_spectra
from plugins.spectra.templates import GRIDS, TemplateLibrary, load, named_library

FULL_PIXELS = len(arm_wavelengths()[0])  # 7,958: three DESI-like arms at 0.8 A


@dataclass(frozen=True)
class SpectraProblem:
    """Fit ``n_spectra`` spectra: v, vsini, teff, logg, [Fe/H], [alpha/Fe] each, with errors.

    ``spectra`` holds the data (see :class:`plugins.spectra.model.Spectra`);
    without it, ``n_spectra`` synthetic in-model spectra of ``n_pixels``
    pixels at signal-to-noise ``snr`` are generated from ``seed`` (what
    calibration and the demo fit). ``grid`` names a template grid
    (``small``, ``medium``, ``realistic``) or is the path of a library file.
    ``tol``: a spectrum has converged when a step lowers chi-square by at most
    ``tol * (chi2 + dof)`` (relative plus absolute, see
    :func:`plugins.spectra.fit.converged_below`); 0 runs all ``max_iter``
    iterations (per clipping round). ``spectra`` is validated field by field
    (:func:`plugins.spectra.model.check_spectra`) and stored as checked.
    """

    n_spectra: int = 64
    n_pixels: int = FULL_PIXELS
    grid: str = "small"
    max_iter: int = 30
    tol: float = 1e-7
    degree: int = 3
    snr: float = 20.0
    seed: int | None = 0
    spectra: Spectra | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_iter", check_int("max_iter", self.max_iter, minimum=1, maximum=10_000))
        object.__setattr__(self, "tol", check_float("tol", self.tol, minimum=0, maximum=1))
        object.__setattr__(self, "degree", check_int("degree", self.degree, minimum=0, maximum=20))
        object.__setattr__(self, "snr", check_float("snr", self.snr, minimum=0, strict_minimum=True))
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
        if not isinstance(self.grid, str) or not (self.grid in GRIDS or self.grid.endswith(".npz")):
            raise fail("grid", self.grid, f"must be one of {', '.join(GRIDS)} or the path of a template library "
                       "(.npz)")
        if self.spectra is not None:
            if not isinstance(self.spectra, Spectra):
                raise ProblemError(f"spectra={type(self.spectra).__name__} is invalid: must be a "
                                   "plugins.spectra.model.Spectra")
            object.__setattr__(self, "spectra", _check_spectra(self.spectra))
            object.__setattr__(self, "n_spectra", len(self.spectra))
            object.__setattr__(self, "n_pixels", self.spectra.n_pixels)
            return
        object.__setattr__(self, "n_spectra", check_int("n_spectra", self.n_spectra, minimum=1, maximum=10**7))
        object.__setattr__(self, "n_pixels", check_int("n_pixels", self.n_pixels, minimum=100, maximum=FULL_PIXELS))

    def data(self) -> Spectra:
        """The spectra to fit: those given, or the synthetic ones, generated on first use.

        Lazily, so that constructing a problem (the registry's check of the
        default, the cost model's designed problems, a plan for a million
        spectra) never synthesises data nor builds a template grid.
        """
        if self.spectra is not None:
            return self.spectra
        synthetic = self.__dict__.get("_synthetic")
        if synthetic is None:
            from plugins.spectra.synth import synthetic_spectra

            synthetic = synthetic_spectra(self.library(), self.n_spectra, snr=self.snr, n_pixels=self.n_pixels,
                                          degree=self.degree, seed=self.seed or 0)
            object.__setattr__(self, "_synthetic", synthetic)  # a cache, not a field: equality ignores it
        return synthetic

    def library(self) -> TemplateLibrary:
        if self.grid in GRIDS:
            return named_library(self.grid)
        if not Path(self.grid).exists():
            raise ProblemError(f"grid={self.grid!r} is invalid: no such template library file")
        return _load_cached(self.grid)

    @property
    def nodes(self) -> int:
        return GRIDS[self.grid].nodes if self.grid in GRIDS else self.library().nodes


_LOADED: dict[str, TemplateLibrary] = {}


def _load_cached(path: str) -> TemplateLibrary:
    if path not in _LOADED:
        _LOADED[path] = load(path)
    return _LOADED[path]


def _check_spectra(spectra: Spectra) -> Spectra:
    """The batch validated field by field (:func:`plugins.spectra.model.check_spectra`), with enough pixels to fit."""
    checked = check_spectra(spectra)
    if checked.n_pixels < 100:
        raise ProblemError(f"spectra.wave has {checked.n_pixels} pixels: must have at least 100 finite positive "
                           "wavelengths (A)")
    return checked
