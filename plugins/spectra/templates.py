"""A synthetic stellar template library on a regular (teff, logg, [Fe/H], [alpha/Fe]) grid.

Every template is a Planck continuum times absorption lines, already at the
instrument's resolution (a Gaussian line-spread function per DESI arm), on
one log-wavelength grid that covers the three arms plus a margin for
+-1000 km/s shifts and rotational broadening. Its log-flux is

    ln F(lambda; theta) = ln B(lambda; teff) - sum_l tau_l(theta) * phi_l(lambda)

with ``phi_l`` a fixed unit-peak profile per line (the LSF convolved with the
line's own width) and ``tau_l`` a smooth function of the parameters, so the
library is a sparse profile matrix times a (lines x nodes) strength matrix.
The generator is deterministic for a seed: the same seed gives the same
line list and therefore the same library on every machine, which is why the
realistic library is regenerated where it is needed rather than shipped.

The strengths vary smoothly and only moderately between grid nodes, so that
multilinear interpolation of ln F is accurate: ``interpolation_error``
measures it against the exact generator at off-grid parameters
(``plugins.spectra.accuracy.interpolation_error``).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from core.errors import ProblemError

C_KMS = 299_792.458
# DESI-like arms: (name, first and last pixel centre in Angstrom, LSF FWHM in Angstrom)
ARMS = (("B", 3600.0, 5800.0, 1.55), ("R", 5760.0, 7620.0, 1.55), ("Z", 7520.0, 9824.0, 1.8))
PIXEL = 0.8  # Angstrom, every arm
TEMPLATE_STEP_KMS = 12.0  # the template grid's step; the narrowest LSF sigma is ~23 km/s (Z arm, red end)
V_MAX = 1000.0  # km/s: the velocities a template must be able to shift by
VSINI_MAX = 300.0  # km/s: the widest rotational kernel the margin allows
FORMAT_VERSION = 1
PARAMS = ("teff", "logg", "feh", "alpha")

# the named strong lines: (label, wavelength A, base central depth tau, wing HWHM A, kind)
STRONG_LINES = (
    ("H-epsilon", 3970.07, 1.0, 4.0, "balmer"), ("H-delta", 4101.74, 1.5, 5.0, "balmer"),
    ("H-gamma", 4340.47, 2.0, 6.0, "balmer"), ("H-beta", 4861.33, 2.5, 7.0, "balmer"),
    ("H-alpha", 6562.80, 3.0, 8.0, "balmer"),
    ("Ca II K", 3933.66, 4.0, 3.0, "alpha"), ("Ca II H", 3968.47, 3.0, 3.0, "alpha"),
    ("Mg b1", 5183.60, 1.5, 0.8, "alpha"), ("Mg b2", 5172.68, 1.2, 0.8, "alpha"),
    ("Mg b4", 5167.32, 0.8, 0.8, "alpha"),
    ("Na D2", 5889.95, 1.5, 0.6, "metal"), ("Na D1", 5895.92, 1.2, 0.6, "metal"),
    ("Ca II 8498", 8498.02, 0.8, 1.5, "alpha"), ("Ca II 8542", 8542.09, 1.4, 2.0, "alpha"),
    ("Ca II 8662", 8662.14, 1.2, 2.0, "alpha"),
)


@dataclass(frozen=True)
class GridSpec:
    """The node values along each parameter axis (each strictly increasing, at least 2 nodes)."""

    teff: tuple[float, ...]
    logg: tuple[float, ...]
    feh: tuple[float, ...]
    alpha: tuple[float, ...]

    def axes(self) -> tuple[np.ndarray, ...]:
        return tuple(np.asarray(getattr(self, name), dtype=np.float64) for name in PARAMS)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(getattr(self, name)) for name in PARAMS)

    @property
    def nodes(self) -> int:
        return int(np.prod(self.shape))


def _steps(lo: float, hi: float, step: float) -> tuple[float, ...]:
    return tuple(float(x) for x in np.round(np.arange(lo, hi + step / 2, step), 6))


# a grid for tests (72 nodes, ~7 MB), one between (576 nodes) and a realistic one (3,861 nodes, ~390 MB)
GRIDS = {
    "small": GridSpec(teff=(4500.0, 5250.0, 6000.0, 6750.0), logg=(2.0, 3.5, 5.0), feh=(-1.5, -0.75, 0.0),
                      alpha=(0.0, 0.4)),
    "medium": GridSpec(teff=_steps(4000, 7000, 500), logg=_steps(1.0, 5.0, 1.0), feh=_steps(-2.0, 0.5, 0.5),
                       alpha=(0.0, 0.2, 0.4)),
    "realistic": GridSpec(teff=_steps(4000, 7000, 250), logg=_steps(1.0, 5.0, 0.5), feh=_steps(-2.0, 0.5, 0.25),
                          alpha=(0.0, 0.2, 0.4)),
}


@dataclass(frozen=True)
class TemplateLibrary:
    """Log-flux templates on a grid: ``logflux[node, pixel]`` with nodes in C order over :data:`PARAMS`."""

    axes: tuple[np.ndarray, ...]
    ln_wave0: float  # ln(lambda / A) of template pixel 0
    dlnw: float  # the log-wavelength step
    logflux: np.ndarray  # (nodes, pixels) float32
    seed: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(a) for a in self.axes)

    @property
    def n_pixels(self) -> int:
        return int(self.logflux.shape[1])

    @property
    def nodes(self) -> int:
        return int(self.logflux.shape[0])

    @property
    def wave(self) -> np.ndarray:
        return np.exp(self.ln_wave0 + self.dlnw * np.arange(self.n_pixels))

    @property
    def lower(self) -> np.ndarray:
        return np.array([a[0] for a in self.axes])

    @property
    def upper(self) -> np.ndarray:
        return np.array([a[-1] for a in self.axes])

    def node_index(self, indices: tuple[int, ...]) -> int:
        return int(np.ravel_multi_index(indices, self.shape))

    def node_params(self, node: int) -> np.ndarray:
        idx = np.unravel_index(node, self.shape)
        return np.array([a[i] for a, i in zip(self.axes, idx)])


# -- the line list ----------------------------------------------------------------------


@dataclass(frozen=True)
class LineList:
    """Every absorption component: a Gaussian core (at the LSF) and, for strong lines, a Lorentzian wing."""

    wave: np.ndarray  # Angstrom
    tau0: np.ndarray  # central optical depth at (5000 K, logg 4, solar)
    chi: np.ndarray  # temperature sensitivity: d log10 tau / d theta, theta = 5040 / teff (relative)
    gravity: np.ndarray  # d log10 tau / d logg
    metal: np.ndarray  # d log10 tau / d [Fe/H]
    alpha: np.ndarray  # d log10 tau / d [alpha/Fe]
    width: np.ndarray  # intrinsic Gaussian sigma (A) before the LSF; 0 for wings
    wing: np.ndarray  # Lorentzian HWHM (A); 0 for Gaussian components


def line_list(seed: int = 0, n_lines: int = 2000) -> LineList:
    """A seeded list of weak metal lines (denser in the blue) plus the named strong lines.

    Sensitivities are kept moderate (|d log10 tau / d theta| <= 2, d log10 tau / d [Fe/H] <= 0.8)
    so that tau changes by less than a factor ~1.6 between neighbouring nodes of the realistic grid.
    """
    rng = np.random.default_rng(seed)
    lo, hi = ARMS[0][1] - 20, ARMS[-1][2] + 20
    # density proportional to lambda^-2: inverse CDF of 1/lambda uniform
    u = rng.uniform(size=n_lines)
    wave = 1.0 / (1.0 / lo - u * (1.0 / lo - 1.0 / hi))
    tau0 = 10 ** rng.normal(-1.1, 0.5, n_lines)
    ionized = rng.uniform(size=n_lines) < 0.3
    chi = np.where(ionized, rng.uniform(-1.2, 0.0, n_lines), rng.uniform(0.0, 1.5, n_lines))
    gravity = np.where(ionized, -0.3, 0.0) + rng.normal(0.0, 0.05, n_lines)
    metal = rng.uniform(0.4, 0.8, n_lines)
    alpha = np.where(rng.uniform(size=n_lines) < 0.3, rng.uniform(0.3, 0.8, n_lines), 0.0)
    width = rng.uniform(0.05, 0.2, n_lines)
    weak = LineList(wave, tau0, chi, gravity, metal, alpha, width, np.zeros(n_lines))

    strong_wave, strong_tau, strong_wing, kinds = (np.array([s[i] for s in STRONG_LINES]) for i in (1, 2, 3, 4))
    balmer = kinds == "balmer"
    is_alpha = kinds == "alpha"
    n = len(STRONG_LINES)
    # Balmer lines strengthen with temperature (negative chi); metal lines weaken.
    s_chi = np.where(balmer, -2.0, 1.0)
    s_metal = np.where(balmer, 0.0, 0.4)  # saturated: a strong line grows slowly with abundance
    s_alpha = np.where(is_alpha, 0.5, 0.0)
    core = LineList(strong_wave, strong_tau, s_chi, np.zeros(n), s_metal, s_alpha, np.full(n, 0.3), np.zeros(n))
    # pressure-broadened wings grow with gravity
    wings = LineList(strong_wave, 0.25 * strong_tau, s_chi, np.where(balmer, 0.15, 0.25), s_metal, s_alpha,
                     np.zeros(n), strong_wing)
    return LineList(*(np.concatenate([getattr(part, f) for part in (weak, core, wings)])
                      for f in LineList.__dataclass_fields__))


def strengths(lines: LineList, params: np.ndarray) -> np.ndarray:
    """tau of every line at every parameter row: (n_params, n_lines)."""
    params = np.atleast_2d(params)
    teff, logg, feh, alpha = (params[:, i : i + 1] for i in range(4))
    theta = 5040.0 / teff - 5040.0 / 5000.0
    log10_tau = (np.log10(lines.tau0) + lines.chi * theta + lines.gravity * (logg - 4.0)
                 + lines.metal * feh + lines.alpha * alpha)
    return 10.0**log10_tau


def lsf_sigma(wave: np.ndarray) -> np.ndarray:
    """The Gaussian LSF sigma (A) at each wavelength: the R/Z boundary sits in their overlap."""
    fwhm = np.where(wave < 0.5 * (ARMS[1][2] + ARMS[2][1]), ARMS[0][3], ARMS[2][3])
    return fwhm / (2.0 * np.sqrt(2.0 * np.log(2.0)))


def template_grid(step_kms: float = TEMPLATE_STEP_KMS) -> tuple[float, float, int]:
    """(ln lambda of pixel 0, d ln lambda, pixels) covering every arm plus the shift and broadening margin."""
    dlnw = np.log1p(step_kms / C_KMS)
    margin = (V_MAX + VSINI_MAX) / C_KMS + 10 * dlnw
    ln_lo = np.log(ARMS[0][1]) - margin
    ln_hi = np.log(ARMS[-1][2]) + margin
    n = int(np.ceil((ln_hi - ln_lo) / dlnw)) + 1
    return float(ln_lo), float(dlnw), n


def profile_matrix(lines: LineList, wave: np.ndarray):
    """Sparse (pixels x lines) matrix of unit-peak profiles at the instrument's resolution."""
    from scipy import sparse

    rows, cols, vals = [], [], []
    for line in range(len(lines.wave)):
        center = lines.wave[line]
        sigma = float(np.sqrt(lsf_sigma(np.array([center]))[0] ** 2 + lines.width[line] ** 2))
        gamma = lines.wing[line]
        half = 6 * sigma if gamma == 0 else 60 * gamma
        j0, j1 = np.searchsorted(wave, [center - half, center + half])
        x = wave[j0:j1] - center
        if gamma == 0:
            prof = np.exp(-0.5 * (x / sigma) ** 2)
        else:  # a Lorentzian wing, blurred by the LSF (approximately: widths add in quadrature)
            g = np.sqrt(gamma**2 + sigma**2)
            prof = 1.0 / (1.0 + (x / g) ** 2) - 1.0 / (1.0 + (half / g) ** 2)
        rows.append(np.arange(j0, j1))
        cols.append(np.full(j1 - j0, line))
        vals.append(prof)
    return sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(len(wave), len(lines.wave)))


def log_planck(wave: np.ndarray, teff: np.ndarray) -> np.ndarray:
    """ln B_lambda(T) up to a constant, (n_params, pixels); lambda in A."""
    hc_k = 1.438777e8  # h c / k in A K
    x = hc_k / (wave[None, :] * np.asarray(teff, dtype=np.float64)[:, None])
    return -5.0 * np.log(wave[None, :] / 5000.0) - np.log(np.expm1(x))


class Generator:
    """The exact, continuous-parameter model behind a library: ln F at any parameters."""

    def __init__(self, seed: int = 0, n_lines: int = 2000, step_kms: float = TEMPLATE_STEP_KMS):
        self.seed = seed
        self.ln_wave0, self.dlnw, self.n_pixels = template_grid(step_kms)
        self.wave = np.exp(self.ln_wave0 + self.dlnw * np.arange(self.n_pixels))
        self.lines = line_list(seed, n_lines)
        self.profiles = profile_matrix(self.lines, self.wave)

    def logflux(self, params: np.ndarray) -> np.ndarray:
        """(n_params, pixels) ln F, normalised so that its mean over the grid is zero."""
        params = np.atleast_2d(np.asarray(params, dtype=np.float64))
        tau = strengths(self.lines, params)  # (n, lines)
        absorption = np.asarray((self.profiles @ tau.T).T)  # (n, pixels)
        out = log_planck(self.wave, params[:, 0]) - absorption
        return out - out.mean(axis=1, keepdims=True)

    def library(self, grid: GridSpec, chunk: int = 256) -> TemplateLibrary:
        axes = grid.axes()
        mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 4)
        logflux = np.empty((len(mesh), self.n_pixels), dtype=np.float32)
        for start in range(0, len(mesh), chunk):
            logflux[start : start + chunk] = self.logflux(mesh[start : start + chunk])
        return TemplateLibrary(axes, self.ln_wave0, self.dlnw, logflux, self.seed)


def generate(grid: str | GridSpec = "small", seed: int = 0) -> TemplateLibrary:
    """The library of ``grid`` (a name in :data:`GRIDS` or a GridSpec) for ``seed``."""
    if isinstance(grid, str):
        if grid not in GRIDS:
            raise ProblemError(f"grid={grid!r} is invalid: must be one of {', '.join(GRIDS)} or a GridSpec")
        grid = GRIDS[grid]
    return Generator(seed).library(grid)


# -- the file: npz, written atomically ---------------------------------------------------


def save(library: TemplateLibrary, path: str | os.PathLike) -> Path:
    """Write ``library`` to ``path`` (.npz) atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, format_version=np.int64(FORMAT_VERSION), ln_wave0=np.float64(library.ln_wave0),
                     dlnw=np.float64(library.dlnw), logflux=library.logflux, seed=np.int64(library.seed),
                     **{f"axis_{name}": axis for name, axis in zip(PARAMS, library.axes)})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: str | os.PathLike) -> TemplateLibrary:
    """Read a library written by :func:`save`; a wrong or damaged file is a clear ProblemError."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            version = int(data["format_version"])
            if version != FORMAT_VERSION:
                raise ProblemError(f"template library {str(path)!r} has format_version={version}: "
                                   f"this version reads {FORMAT_VERSION}")
            axes = tuple(np.asarray(data[f"axis_{name}"], dtype=np.float64) for name in PARAMS)
            logflux = np.asarray(data["logflux"], dtype=np.float32)
            library = TemplateLibrary(axes, float(data["ln_wave0"]), float(data["dlnw"]), logflux, int(data["seed"]))
    except ProblemError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise ProblemError(f"template library {str(path)!r} cannot be read: {type(exc).__name__}: {exc}") from exc
    if logflux.ndim != 2 or logflux.shape[0] != int(np.prod(library.shape)):
        raise ProblemError(f"template library {str(path)!r}: logflux has shape {logflux.shape}, expected "
                           f"({int(np.prod(library.shape))}, pixels) for a grid of shape {library.shape}")
    return library


def library_path(grid: str, seed: int = 0) -> Path:
    from core.costmodel.store import cache_dir

    return cache_dir() / "spectra" / f"templates-{grid}-seed{seed}-v{FORMAT_VERSION}.npz"


@cache
def named_library(grid: str = "small", seed: int = 0) -> TemplateLibrary:
    """A named grid's library: read from the cache directory, generated and saved there on first use."""
    path = library_path(grid, seed)
    if path.exists():
        try:
            return load(path)
        except ProblemError:
            path.unlink(missing_ok=True)  # a damaged cache file is regenerated, never trusted
    library = generate(grid, seed)
    save(library, path)
    return library


def upper_envelope(logflux: np.ndarray, width: int = 401) -> np.ndarray:
    from scipy.ndimage import maximum_filter1d, uniform_filter1d

    return uniform_filter1d(maximum_filter1d(logflux, width, axis=-1), width, axis=-1)
