"""The spectrum model, written once for every array library (see :mod:`plugins.spectra.ops`).

For parameters ``p = (v, vsini, teff, logg, feh, alpha)`` the model of one
spectrum at its observed pixels is

    model = continuum(lambda) * S(lambda / D(v); vsini, theta)

- ``theta = (teff, logg, feh, alpha)``: ln F multilinearly interpolated
  between the 16 grid nodes around theta, then exponentiated;
- ``vsini``: Gray's limb-darkened rotational profile (epsilon = 0.6), convolved
  exactly with the template's cubic (Keys) interpolant: the kernel weights are
  the profile integrated against the cubic basis, from its analytic moments
  (:func:`rotation_kernel`); continuous in vsini, a delta function at 0;
- ``v``: the relativistic Doppler factor ``D = sqrt((1 + beta) / (1 - beta))``,
  a shift of ``ln D`` on the log-wavelength grid, read by the same cubic
  interpolation (6 template pixels per data pixel).

Why cubic: the templates are sampled every 12 km/s. Linear interpolation,
and a kernel shared between pixels by linear (tent) weights, each smooth the
spectrum like an extra Gaussian of variance ~h^2 / 6 (h = 12 km/s), together
~48 km^2/s^2 against the rotation's own ~0.225 vsini^2: on data broadened by
the physical profile the fit answered 0, 0 and 14 km/s for true 5, 10 and 20.
Keys' 6-point cubic reproduces cubics exactly, so it adds no such smoothing
(tests/test_spectra_vsini.py).
- the continuum: Legendre polynomials of a chosen degree per arm, solved by
  weighted linear least squares inside every evaluation.

:func:`evaluate` returns chi-square and, on request, the Gauss-Newton
normal equations of the non-linear parameters with the continuum profiled
out (variable projection: the Jacobian projected off the continuum's
columns). At the optimum that matrix is the Fisher matrix of ``p`` with the
continuum marginalised, so its inverse gives the errors, and at the truth
of a noise-free spectrum it gives the Cramer-Rao bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from core.errors import ProblemError
from core.validation import fail
from plugins.spectra.templates import ARMS, C_KMS, PIXEL, V_MAX, VSINI_MAX, TemplateLibrary

N_PARAMS = 6
PARAM_NAMES = ("v", "vsini", "teff", "logg", "feh", "alpha")
EPSILON = 0.6  # limb darkening of the rotational kernel
# curvature floor per parameter (1 / a prior width squared): keeps a degenerate direction (vsini well
# below the resolution, a spectrum of pure noise) from making a normal matrix singular
PRIOR_WIDTH = np.array([1e4, 1e4, 1e6, 1e3, 1e3, 1e3])
RIDGE = 1e-12  # relative ridge on the continuum's normal matrix


@dataclass(frozen=True)
class Spectra:
    """A batch of spectra on shared pixels: the arms concatenated in order (DESI coadds share wavelengths)."""

    wave: np.ndarray  # (N,) Angstrom
    arm: np.ndarray  # (N,) arm number of each pixel, non-decreasing
    flux: np.ndarray = field(repr=False)  # (B, N)
    ivar: np.ndarray = field(repr=False)  # (B, N); 0 where masked
    targetid: np.ndarray = field(repr=False)  # (B,) int64
    arm_names: tuple[str, ...] = ("B", "R", "Z")
    truth: np.ndarray | None = field(default=None, repr=False)  # (B, 6) for synthetic spectra

    def __len__(self) -> int:
        return int(self.flux.shape[0])

    @property
    def n_pixels(self) -> int:
        return int(self.wave.shape[0])

    def rows(self, start: int, stop: int) -> Spectra:
        truth = None if self.truth is None else self.truth[start:stop]
        return replace(self, flux=self.flux[start:stop], ivar=self.ivar[start:stop],
                       targetid=self.targetid[start:stop], truth=truth)

    def checked(self) -> Spectra:
        """This batch validated, as plain arrays: see :func:`check_spectra`."""
        return check_spectra(self)

    def clean(self) -> tuple[np.ndarray, np.ndarray]:
        """(flux, weight) with every unusable pixel (NaN or infinite flux, ivar <= 0 or not finite) weighted 0."""
        flux = np.asarray(self.flux, dtype=np.float64)
        ivar = np.asarray(self.ivar, dtype=np.float64)
        good = np.isfinite(flux) & np.isfinite(ivar) & (ivar > 0)
        return np.where(good, flux, 0.0), np.where(good, ivar, 0.0)


# -- validation ------------------------------------------------------------------------------------

_KIND_NAMES = {"b": "bool", "c": "complex", "M": "datetime", "m": "timedelta", "O": "object",
               "U": "string", "S": "bytes", "V": "structured"}


def _real(field_name: str, value: object, ndim: int, integer: bool = False) -> np.ndarray:
    """``value`` as an ndarray of real numbers with ``ndim`` dimensions, or a one-line ProblemError naming it.

    Complex numbers (the imaginary part would be dropped), strings, booleans and objects are refused
    rather than cast; ``integer`` also refuses floats that are not whole numbers.
    """
    allowed = f"must hold {'integers' if integer else 'real numbers'} in {ndim} dimension{'s' * (ndim > 1)}"
    try:
        array = np.asarray(np.ma.getdata(value))
    except (TypeError, ValueError, OverflowError):  # ragged nested lists, unconvertible objects
        raise fail(field_name, value, f"{allowed}, with the same length in every row (a ragged list is not)") from None
    kind = array.dtype.kind
    if kind not in "iuf":
        hint = " (a ragged list, mixed types or None)" if kind == "O" else ""
        raise fail(field_name, value, f"{allowed}, got {_KIND_NAMES.get(kind, str(array.dtype))} "
                   f"dtype {array.dtype}{hint}")
    if array.ndim != ndim:
        raise fail(field_name, value, f"{allowed}, got {array.ndim} dimension(s)")
    if integer and kind == "f":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise fail(field_name, value, f"{allowed}, got non-integer values")
    return array


def _as_float(array: np.ndarray) -> np.ndarray:
    """float32 and float64 as they are (no copy); integers and float16 as float64."""
    return array if array.dtype in (np.float32, np.float64) else array.astype(np.float64)


def check_spectra(spectra: Spectra) -> Spectra:
    """``spectra`` validated: every field checked, each problem a one-line ProblemError naming the field.

    - ``wave``: 1-D, finite, positive, strictly increasing within each arm (arms may overlap);
    - ``arm``: one integer per pixel, numbering the arms 0, 1, 2, ... in pixel order, with no gap;
    - ``arm_names``: one string per arm;
    - ``flux``, ``ivar``: real, both exactly (spectra, pixels): never broadcast. A NaN or infinite
      value, or ivar <= 0, marks an unusable pixel (weighted 0, as masked);
    - a numpy masked array's mask is honoured: a pixel masked in flux or in ivar gets ivar 0;
    - ``targetid``: one integer per spectrum; ``truth``: None or (spectra, 6) real numbers.

    Returns a Spectra of plain ndarrays (float32 or float64 flux and ivar, int64 arm and targetid).
    """
    wave = _real("spectra.wave", spectra.wave, 1)
    if np.ma.is_masked(spectra.wave):
        raise fail("spectra.wave", spectra.wave, "must not be masked: every pixel needs its wavelength")
    wave = wave.astype(np.float64, copy=False)
    n = wave.shape[0]
    if n < 1 or not np.all(np.isfinite(wave)) or np.any(wave <= 0):
        raise fail("spectra.wave", spectra.wave, "must be finite positive wavelengths (A), at least one")
    arm = _real("spectra.arm", spectra.arm, 1, integer=True).astype(np.int64)
    if arm.shape != wave.shape:
        raise fail("spectra.arm", spectra.arm, f"must give the arm of each of the {n} pixels, got {arm.shape[0]}")
    steps = np.diff(arm)
    if arm[0] != 0 or np.any((steps != 0) & (steps != 1)):
        arms = np.unique(arm)[:8].tolist()
        raise fail("spectra.arm", spectra.arm, f"must number the arms 0, 1, 2, ... in pixel order with no gap "
                   f"(each arm's pixels together), got arms {arms}")
    inside = steps == 0
    bad = np.flatnonzero(inside & (np.diff(wave) <= 0))
    if bad.size:
        i = int(bad[0])
        raise fail("spectra.wave", spectra.wave, f"must increase strictly within each arm: arm {int(arm[i])} has "
                   f"{wave[i]:.6g} then {wave[i + 1]:.6g} A at pixels {i} and {i + 1}")
    n_arms = int(arm[-1]) + 1
    names = spectra.arm_names
    if (not isinstance(names, (tuple, list)) or len(names) != n_arms
            or not all(isinstance(name, str) for name in names)):
        raise fail("spectra.arm_names", names, f"must be {n_arms} strings, one per arm")
    flux = _real("spectra.flux", spectra.flux, 2)
    ivar = _real("spectra.ivar", spectra.ivar, 2)
    for name, value in (("flux", flux), ("ivar", ivar)):
        if value.shape[1] != n or value.shape[0] < 1:
            raise ProblemError(f"spectra.{name} has shape {value.shape}: must be (spectra, {n})")
    if ivar.shape != flux.shape:
        raise ProblemError(f"spectra.ivar has shape {ivar.shape}: must be {flux.shape}, one row per spectrum of "
                           "spectra.flux (never broadcast)")
    flux, ivar = _as_float(flux), _as_float(ivar)
    if np.ma.isMaskedArray(spectra.flux) or np.ma.isMaskedArray(spectra.ivar):  # plain arrays: no pass over them
        masked = np.ma.getmaskarray(spectra.flux) | np.ma.getmaskarray(spectra.ivar)
        if masked.any():
            ivar = np.where(masked, 0, ivar).astype(ivar.dtype)
    targetid = _real("spectra.targetid", spectra.targetid, 1, integer=True)
    if targetid.shape[0] != flux.shape[0]:
        raise ProblemError(f"spectra.targetid has shape {targetid.shape}: must have one entry per spectrum "
                           f"({flux.shape[0]})")
    truth = spectra.truth
    if truth is not None:
        truth = _real("spectra.truth", truth, 2).astype(np.float64, copy=False)
        if truth.shape != (flux.shape[0], N_PARAMS):
            raise ProblemError(f"spectra.truth has shape {truth.shape}: must be ({flux.shape[0]}, {N_PARAMS})")
    return Spectra(wave=wave, arm=arm, flux=flux, ivar=ivar, targetid=targetid.astype(np.int64, copy=False),
                   arm_names=tuple(names), truth=truth)


def arm_wavelengths(n_pixels: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """DESI-like pixel centres of the three arms (0.8 A), each trimmed about its centre to ``n_pixels`` in all."""
    waves = [np.arange(lo, hi + PIXEL / 2, PIXEL) for _, lo, hi, _ in ARMS]
    total = sum(len(w) for w in waves)
    if n_pixels is not None and n_pixels < total:
        kept = []
        for w in waves:
            keep = max(8, int(round(len(w) * n_pixels / total)))
            start = (len(w) - keep) // 2
            kept.append(w[start : start + keep])
        waves = kept
    arm = np.concatenate([np.full(len(w), i) for i, w in enumerate(waves)])
    return np.concatenate(waves), arm


def legendre_basis(wave: np.ndarray, arm: np.ndarray, degree: int) -> np.ndarray:
    """(N, arms * (degree + 1)): Legendre polynomials on each arm's span, zero on the other arms."""
    arms = int(arm.max()) + 1
    basis = np.zeros((len(wave), arms * (degree + 1)))
    for a in range(arms):
        sel = arm == a
        lo, hi = wave[sel].min(), wave[sel].max()
        x = 2 * (wave[sel] - lo) / max(hi - lo, 1e-9) - 1
        basis[sel, a * (degree + 1) : (a + 1) * (degree + 1)] = np.polynomial.legendre.legvander(x, degree)
    return basis


@dataclass
class Prepared:
    """Everything a batch's evaluations share, on the ops' device: the cropped templates and the pixel maps."""

    ops: Any
    table: Any  # (nodes, P) ln F, cropped to the pixels the data can reach
    axes: list  # four float64 arrays of node values
    strides: tuple[int, ...]
    node_params: np.ndarray  # (nodes, 4) host copy
    node_bounds: list[tuple[float, float]]  # each axis's first and last node
    even_axes: tuple[np.ndarray, ...] | None  # evenly spaced axes: see even_spacing
    ln_wave0: float
    dlnw: float
    u0: Any  # (N,) template position of every data pixel at v = 0
    basis: Any  # (N, ncoef)
    basis_t: Any  # (ncoef, N)
    basis_outer: Any  # (N, ncoef * ncoef): the products of every pair of basis columns
    local_basis: np.ndarray  # (N, degree + 1): each pixel's Legendre values on its own arm (host)
    arm: np.ndarray  # (N,) arm of each pixel (host)
    lower: Any  # (6,) float64 bounds of p
    upper: Any
    arm_slices: list[tuple[int, int]]
    degree: int

    constants: dict[str, Any] = field(default_factory=dict, repr=False)

    def constant(self, name: str, value: np.ndarray) -> Any:
        """``value`` on the ops' device, copied once per batch (a copy per evaluation is a transfer each time)."""
        if name not in self.constants:
            self.constants[name] = value if self.ops.name != "torch" else self.ops.torch.as_tensor(
                value, device=self.ops.device)
        return self.constants[name]

    @property
    def n_template(self) -> int:
        return int(self.table.shape[1])

    @property
    def step_kms(self) -> float:
        return C_KMS * self.dlnw


def prepare(ops: Any, library: TemplateLibrary, wave: np.ndarray, arm: np.ndarray, degree: int,
            table: Any = None) -> Prepared:
    """Crop the templates to the data's reach (+-V_MAX shifts and the widest kernel) and move them to the device.

    ``table`` passes a library already on the device (the torch backend keeps it there between calls).
    """
    lnw = np.log(wave)
    u_all = (lnw - library.ln_wave0) / library.dlnw
    margin = (V_MAX + VSINI_MAX) / C_KMS / library.dlnw + 4
    first = max(0, int(np.floor(u_all.min() - margin)))
    last = min(library.n_pixels, int(np.ceil(u_all.max() + margin)) + 1)
    if u_all.min() - margin < 0 or u_all.max() + margin > library.n_pixels:
        raise ProblemError(f"wave spans {wave.min():.1f}..{wave.max():.1f} A: must lie within the templates' "
                           f"{library.wave[0]:.1f}..{library.wave[-1]:.1f} A less the +-{V_MAX:.0f} km/s margin")
    if table is None:
        # float32 as stored: a view on the CPU (a realistic grid is ~400 MB), one copy to a GPU
        table = ops.asarray(library.logflux[:, first:last], dtype=ops.torch.float32 if ops.name == "torch"
                            else np.float32)
    else:
        table = table[:, first:last]
    ln_wave0 = library.ln_wave0 + first * library.dlnw
    strides = tuple(int(s) for s in np.cumprod(((*library.shape[1:], 1))[::-1])[::-1])
    mesh = np.stack(np.meshgrid(*library.axes, indexing="ij"), axis=-1).reshape(-1, 4)
    bounds_lo = np.array([-V_MAX, 0.0, *library.lower])
    bounds_hi = np.array([V_MAX, VSINI_MAX, *library.upper])
    basis = legendre_basis(wave, arm, degree)
    edges = np.flatnonzero(np.diff(arm)) + 1
    starts = [0, *edges.tolist()]
    stops = [*edges.tolist(), len(arm)]
    return Prepared(ops=ops, table=table, axes=[ops.asarray(a, dtype=float64_dtype(ops)) for a in library.axes],
                    strides=strides, node_params=mesh,
                    node_bounds=[(float(a[0]), float(a[-1])) for a in library.axes],
                    even_axes=even_spacing(library.axes), ln_wave0=ln_wave0, dlnw=library.dlnw,
                    u0=ops.asarray((lnw - ln_wave0) / library.dlnw, dtype=float64_dtype(ops)),
                    basis=ops.asarray(basis), basis_t=ops.asarray(np.ascontiguousarray(basis.T)),
                    basis_outer=ops.asarray((basis[:, :, None] * basis[:, None, :]).reshape(len(wave), -1)),
                    local_basis=basis.reshape(len(wave), -1, degree + 1)[np.arange(len(wave)), arm],
                    arm=np.asarray(arm, dtype=np.int64),
                    lower=ops.asarray(bounds_lo, float64_dtype(ops)),
                    upper=ops.asarray(bounds_hi, float64_dtype(ops)), arm_slices=list(zip(starts, stops)),
                    degree=degree)


def even_spacing(axes: list[np.ndarray]) -> tuple[np.ndarray, ...] | None:
    """(first node, step, last node, highest lower-node index, 1 / step), each (4,) or (1, 4), where every
    axis is evenly spaced (to 1e-9 of a step); else None."""
    steps = [np.diff(np.asarray(a, dtype=np.float64)) for a in axes]
    if not all(len(s) and np.all(np.abs(s - s.mean()) <= 1e-9 * abs(s.mean())) for s in steps):
        return None
    step = np.array([s.mean() for s in steps])
    return (np.array([a[0] for a in axes], dtype=np.float64), step, np.array([a[-1] for a in axes], dtype=np.float64),
            np.array([len(a) - 2.0 for a in axes]), (1.0 / step)[None, :])


def float64_dtype(ops: Any) -> Any:
    return ops.torch.float64 if ops.name == "torch" else np.float64


def _cat(ops: Any, arrays: list, axis: int) -> Any:
    return ops.torch.cat(arrays, dim=axis) if ops.name == "torch" else np.concatenate(arrays, axis=axis)


def _int(ops: Any, x: Any) -> Any:
    return x.long() if ops.name == "torch" else x.astype(np.int64)


# -- the pieces of the model -------------------------------------------------------------------


# the 16 corners of a grid cell: bit k of corner c says whether it takes axis k's upper node
_CORNER_BITS = np.array([[(c >> (3 - k)) & 1 for k in range(4)] for c in range(16)], dtype=bool)
_OFF_DIAGONAL = ~np.eye(4, dtype=bool)


def cell_positions(prep: Prepared, theta: Any) -> tuple[Any, Any, Any]:
    """Each theta's grid cell along the 4 axes: lower node index (B, 4), fraction in the cell and 1 / cell width.

    Theta is clipped to the grid. On evenly spaced axes (every named grid)
    this is arithmetic on all four at once; otherwise a search per axis.
    """
    ops, xp = prep.ops, prep.ops.xp
    if prep.even_axes:
        first, step, last, highest, inverse = (prep.constant(f"axes_{i}", value)
                                               for i, value in enumerate(prep.even_axes))
        position = (xp.minimum(xp.maximum(theta, first), last) - first) / step  # in nodes from the first
        low = xp.minimum(xp.floor(position), highest)
        return _int(ops, low), position - low, inverse
    lows, fracs, invs = [], [], []
    for k, axis in enumerate(prep.axes):
        n = axis.shape[0]
        lo_hi = prep.node_bounds[k]  # host floats: no device round trip per evaluation
        t = ops.clip(theta[:, k], lo_hi[0], lo_hi[1])
        i = ops.clip(xp.searchsorted(axis, t) - 1, 0, n - 2)
        lo, hi = axis[i], axis[i + 1]
        lows.append(i)
        fracs.append((t - lo) / (hi - lo))
        invs.append(1.0 / (hi - lo))
    return xp.stack(lows, 1), xp.stack(fracs, 1), xp.stack(invs, 1)


def corners(prep: Prepared, theta: Any, derivatives: bool) -> tuple[Any, Any, Any]:
    """Flat node indices (B, 16), multilinear weights (B, 16) and their derivatives (B, 16, 4).

    All 16 corners at once, as (B, 16, 4) arrays: a corner-by-corner loop
    launched ~600 small kernels per evaluation, which on a GPU cost more
    than a small batch's whole fit.
    """
    ops, xp = prep.ops, prep.ops.xp
    low, frac, inv = cell_positions(prep, theta)
    frac, inv = frac[:, None, :], inv[:, None, :]
    bits = prep.constant("corner_bits", _CORNER_BITS)
    upper = prep.constant("corner_upper", _CORNER_BITS.astype(np.int64))
    strides = prep.constant("strides", np.asarray(prep.strides, dtype=np.int64))
    idx = xp.sum((low[:, None, :] + upper[None]) * strides, -1)  # (B, 16)
    factors = xp.where(bits[None], frac, 1.0 - frac)  # (B, 16, 4): each axis's share of each corner
    weights = ops.cast(xp.prod(factors, -1))
    if not derivatives:
        return idx, weights, None
    slopes = xp.where(bits[None], inv, -inv)  # d factor_k / d theta_k
    # d w / d theta_k: slope k times the product of the other three factors
    others = xp.where(prep.constant("off_diagonal", _OFF_DIAGONAL)[None, None], factors[:, :, None, :], 1.0)
    return idx, weights, ops.cast(slopes * xp.prod(others, -1))


def _rotation_moments(xp: Any, u: Any) -> list[Any]:
    """From -1 to u (in [-1, 1]), the integrals of t^p G(t) for p = 0..3: G the limb-darkened rotational profile.

    ``G(t) = (c1 sqrt(1 - t^2) + c2 (1 - t^2)) / area`` with ``c1 = 2 (1 - eps)``, ``c2 = pi eps / 2``
    (Gray, The Observation and Analysis of Stellar Photospheres, ch. 18), normalised to unit area.
    The zeroth is 0 at -1 and 1 at 1; the second at 1 is the profile's variance (0.225 at eps = 0.6).
    """
    c1, c2 = 2 * (1 - EPSILON), math.pi * EPSILON / 2
    area = math.pi * (1 - EPSILON / 3)
    u2 = u * u
    rest = 1 - u2
    root = xp.sqrt(rest)
    arc = xp.arcsin(u)
    # the antiderivatives of t^p sqrt(1 - t^2) and of t^p (1 - t^2), each less its value at t = -1
    disc = [(u * root + arc) / 2 + math.pi / 4, -rest * root / 3,
            u * (2 * u2 - 1) * root / 8 + arc / 8 + math.pi / 16, -rest * root / 3 + rest * rest * root / 5]
    poly = [u - u * u2 / 3 + 2 / 3, u2 / 2 - u2 * u2 / 4 - 0.25, u * u2 / 3 - u * u2 * u2 / 5 + 2 / 15,
            u2 * u2 / 4 - u2 * u2 * u2 / 6 - 1 / 12]
    return [(c1 * d + c2 * q) / area for d, q in zip(disc, poly)]


# Keys' cubic convolution (Keys 1981, IEEE Trans. ASSP 29, 1153), 6-point form: a point at template
# position j0 + t (0 <= t < 1) is read from pixels j0 + o, o = CUBIC_FIRST ... CUBIC_FIRST + 5, with weight
# CUBIC[o] . (1, t, t^2, t^3). The weights sum to 1 and reproduce t, t^2 and t^3 exactly (4th order):
# no smoothing of order h^2, and a residual of order h^4 (the 4-point form is exact to t^2 only)
CUBIC = np.array([[0.0, 1.0, -2.0, 1.0], [0.0, -8.0, 15.0, -7.0], [12.0, 0.0, -28.0, 16.0],
                  [0.0, 8.0, 20.0, -16.0], [0.0, -1.0, -6.0, 7.0], [0.0, 0.0, 1.0, -1.0]]) / 12.0
CUBIC_FIRST = -2
CUBIC_LAST = CUBIC_FIRST + len(CUBIC) - 1


def cubic_weights(ops: Any, t: Any, cubic: Any) -> tuple[Any, Any]:
    """The Keys weights of the taps at fractions ``t`` (B, N) and their derivatives d/dt, each (B, taps, N).

    ``cubic``: :data:`CUBIC` on the ops' device (float64). One matrix product each, whatever the taps:
    on a GPU a polynomial per tap would be dozens of tiny launches.
    """
    xp = ops.xp
    ones = t * 0.0 + 1.0
    t2 = t * t
    powers = xp.stack([ones, t, t2, t2 * t], 1)  # (B, 4, N)
    slopes = xp.stack([ones * 0.0, ones, 2.0 * t, 3.0 * t2], 1)
    return ops.matmul(cubic, powers), ops.matmul(cubic, slopes)


def kernel_half_width(vsini_max: float, step_kms: float) -> int:
    """Kernel taps each side: the profile's half-width (plus the derivative's 0.5 km/s) and the cubic's reach."""
    return int(math.ceil((vsini_max + 1.0) / step_kms)) + CUBIC_LAST - 1


def rotation_kernel(prep: Prepared, vsini: Any, half: int) -> Any:
    """(B, 2 half + 1) weights: Gray's rotational profile convolved exactly with the templates' cubic interpolant.

    With the template read between its pixels by the Keys cubic (:data:`CUBIC`), the broadened
    template at pixel j is ``sum_m K_m F[j + m]``, where ``K_m`` integrates the profile g (in pixel
    units, half-width ``s = vsini / step``) against the cubic's weight of pixel m: over each pixel
    interval [k, k + 1] that weight is a cubic in ``z = y - k``, so K_m needs the profile's first four
    moments over each interval, which :func:`_rotation_moments` gives analytically: no quadrature,
    exact at every vsini. The weights sum to 1 and their variance is exactly the profile's
    (``0.225 vsini^2``): the cubic adds none, where linear (tent) sharing added step^2 / 6. A delta
    function at vsini = 0, smooth in vsini. ``half`` must be at least ``ceil(s) + CUBIC_LAST - 1``
    (see :func:`kernel_half_width`).
    """
    ops, xp = prep.ops, prep.ops.xp
    h = prep.step_kms
    # interval k = m - o for every tap m in -half..half and cubic offset o: k from -half - LAST to half - FIRST
    edges = prep.constant(f"kernel_edges_{half}", np.arange(-half - CUBIC_LAST, half - CUBIC_FIRST + 2,
                                                           dtype=np.float64))
    k = edges[None, :-1]
    s = ops.maximum(vsini, 1e-6)[:, None] / h
    moments = _rotation_moments(xp, ops.clip(edges[None, :] / s, -1.0, 1.0))
    # y-moments of g over each interval, then about the interval's start k: integral of (y - k)^p g(y) dy
    y = [(s**q) * (c[:, 1:] - c[:, :-1]) for q, c in enumerate(moments)]
    local = [y[0], y[1] - k * y[0], y[2] - 2 * k * y[1] + k * k * y[0],
             y[3] - 3 * k * y[2] + 3 * k * k * y[1] - k * k * k * y[0]]
    width = 2 * half + 1
    kernel = 0.0
    for o, row in enumerate(CUBIC.tolist(), start=CUBIC_FIRST):
        part = sum(a * lp for a, lp in zip(row, local) if a != 0.0)
        kernel = kernel + part[:, CUBIC_LAST - o : CUBIC_LAST - o + width]  # interval k = m - o for tap m
    return kernel


def rotation_kernels(prep: Prepared, vsini: Any, half: int, derivative: bool, h: float = 0.5) -> tuple[Any, Any]:
    """The kernel and, with ``derivative``, d kernel / d vsini (a central difference, one-sided at vsini < h).

    The three kernels (at vsini, vsini + h, vsini - h) are one call on a stacked batch: a third of the launches.
    """
    if not derivative:
        return rotation_kernel(prep, vsini, half), None
    b = vsini.shape[0]
    up = vsini + h
    down = prep.ops.maximum(vsini - h, 0.0)
    kernels = rotation_kernel(prep, _cat(prep.ops, [vsini, up, down], 0), half)
    return kernels[:b], (kernels[b : 2 * b] - kernels[2 * b :]) / (up - down)[:, None]


def log_doppler(v: Any, xp: Any) -> Any:
    """ln D for velocity v (km/s): ln sqrt((1 + beta) / (1 - beta)) = artanh(beta)."""
    beta = v / C_KMS
    return 0.5 * (xp.log1p(beta) - xp.log1p(-beta))


def shifted_templates(prep: Prepared, p: Any, jac: bool) -> Any:
    """The continuum-free model at the data pixels, (B, 1, N); with ``jac`` (B, 7, N): the model and d/dp."""
    ops, xp = prep.ops, prep.ops.xp
    whole = getattr(ops, "shifted_templates", None)  # an array library with the whole step fused (torch:graph)
    if whole is not None:
        return whole(prep, p, jac)
    idx, w, dw = corners(prep, p[:, 2:6], jac)
    channels = ops.interpolate_exp(prep.table, idx, w, dw)  # (B, 1 or 5, P): F, F d ln F / d theta
    half = kernel_half_width(ops.vsini_bound(p[:, 1]), prep.step_kms)
    kernel, dk = rotation_kernels(prep, p[:, 1], half, jac)
    kernel, dk = ops.cast(kernel), (ops.cast(dk) if jac else None)
    beta = p[:, 0] / C_KMS
    shift = log_doppler(p[:, 0], xp) / prep.dlnw  # in template pixels
    du_dv = -1.0 / (C_KMS * (1 - beta * beta) * prep.dlnw)
    # an array library with a compiled version of the whole step (numba) provides it; others run the generic one
    custom = getattr(ops, "resample", None)
    cubic = prep.constant("cubic", CUBIC)
    return (custom or partial(resample, ops))(prep.u0, channels, kernel, dk, shift, du_dv, cubic)


def resample(ops: Any, u0: Any, channels: Any, kernel: Any, dk: Any, shift: Any, du_dv: Any, cubic: Any) -> Any:
    """Broaden and shift the template channels and read them at the data pixels (any ops).

    ``channels`` (B, 1 or 5, P): F and F d ln F / d theta on the template grid. Data pixel i of
    spectrum b sits at template position ``u0[i] - shift[b]``, read by the cubic (``cubic``:
    :data:`CUBIC` on the device) from the broadened values at the pixels around it. Returns
    (B, 1, N), or with ``dk`` (B, 7, N): the model and its derivatives in p's order (v, vsini, teff,
    logg, feh, alpha).
    """
    xp = ops.xp
    n_template = channels.shape[2]
    u = ops.clip(u0[None, :] - shift[:, None], float(-CUBIC_FIRST), float(n_template - CUBIC_LAST) - 1e-6)
    j0 = _int(ops, xp.floor(u))
    weights, slopes = cubic_weights(ops, u - j0, cubic)
    weights, slopes = ops.cast(weights), ops.cast(slopes)
    broad = ops.convolve(channels, kernel)
    # d S / d vsini: the unbroadened flux convolved with d kernel / d vsini, read at the same pixels
    dbroad = None if dk is None else ops.convolve(channels[:, :1], dk)
    values = dv = dvsini = None
    # tap by tap: one (B, C, N) read at a time, never all the taps at once (6x the data-sized memory)
    for tap in range(len(CUBIC)):
        index = j0 + (CUBIC_FIRST + tap)
        read = ops.gather(broad, index)
        weight = weights[:, tap : tap + 1]
        values = ops.add_product(values, weight, read)
        if dbroad is not None:
            dv = ops.add_product(dv, slopes[:, tap : tap + 1], read[:, :1])
            dvsini = ops.add_product(dvsini, weight, ops.gather(dbroad, index))
    if dk is None:
        return values
    return _cat(ops, [values[:, :1], dv * ops.cast(du_dv)[:, None, None], dvsini, values[:, 1:5]], 1)


@dataclass
class Evaluation:
    chi2: Any  # (B,) float64
    coeffs: Any  # (B, ncoef) continuum coefficients
    model: Any  # (B, N)
    hessian: Any = None  # (B, 6, 6) float64: J^T W J of the projected Jacobian
    gradient: Any = None  # (B, 6) float64: J^T W r
    jproj: Any = None  # (B, 6, N) projected Jacobian, when asked for


def evaluate(prep: Prepared, p: Any, flux: Any, weight: Any, jac: bool = False,
             keep_jacobian: bool = False) -> Evaluation:
    """chi-square of ``p`` (B, 6) with the continuum solved linearly; with ``jac`` the normal equations too."""
    shifted = shifted_templates(prep, p, jac)
    custom = getattr(prep.ops, "profile", None)
    if custom is None:
        return profile(prep, shifted, flux, weight, jac, keep_jacobian)
    chi2, coeffs, model, hessian, gradient, jproj = custom(prep, shifted, flux, weight, jac, keep_jacobian, RIDGE)
    return Evaluation(chi2=chi2, coeffs=coeffs, model=model, hessian=hessian, gradient=gradient, jproj=jproj)


def continuum_solve(prep: Prepared, template: Any, flux: Any, weight: Any) -> tuple[Any, Any, Any]:
    """The continuum's (ridged) normal matrix (B, ncoef, ncoef), its coefficients (B, ncoef) and ``weight * template``.

    From matrix products with the fixed basis: the (B, N, ncoef) design matrix (template x basis) is
    never formed.
    """
    ops, xp = prep.ops, prep.ops.xp
    wt = weight * template
    ncoef = prep.basis.shape[1]
    gram = ops.float64((wt * template) @ prep.basis_outer).reshape(-1, ncoef, ncoef)
    eye = ops.eye(ncoef)
    diagonal = xp.diagonal(gram, 0, 1, 2)
    # an arm without a single usable pixel has zero columns: pin its coefficients to 0
    empty = ops.float64(diagonal <= 0)
    scale = xp.sum(diagonal, 1) / ncoef + 1e-300
    gram = gram + eye[None] * (empty[:, None, :] + RIDGE * scale[:, None, None])
    return gram, ops.solve(gram, ops.float64((wt * flux) @ prep.basis)), wt


def profile(prep: Prepared, shifted: Any, flux: Any, weight: Any, jac: bool, keep_jacobian: bool) -> Evaluation:
    """The continuum solved linearly for the shifted templates, chi-square, and the projected normal equations."""
    ops, xp = prep.ops, prep.ops.xp
    template = shifted[:, 0]
    gram, coeffs, wt = continuum_solve(prep, template, flux, weight)
    continuum = ops.cast(coeffs) @ prep.basis_t
    model = continuum * template
    resid = flux - model
    chi2 = xp.sum(ops.float64(weight * resid * resid), 1)
    out = Evaluation(chi2=chi2, coeffs=coeffs, model=model)
    if not jac:
        return out
    jp = continuum[:, None, :] * shifted[:, 1:]  # (B, 6, N)
    cross = ops.float64((jp * wt[:, None, :]) @ prep.basis)  # (B, 6, ncoef)
    projection = ops.cast(ops.solve(gram, xp.swapaxes(cross, 1, 2)))  # (B, ncoef, 6)
    jproj = jp - template[:, None, :] * (xp.swapaxes(projection, 1, 2) @ prep.basis_t)
    wj = jproj * weight[:, None, :]
    out.hessian = ops.float64(wj @ xp.swapaxes(jproj, 1, 2))
    out.gradient = ops.float64(wj @ resid[:, :, None])[..., 0]
    if keep_jacobian:
        out.jproj = jproj
    return out


def covariance(prep: Prepared, hessian: Any) -> Any:
    """The inverse of the (projected) Fisher matrix, with the prior-width floor on degenerate directions."""
    ops = prep.ops
    floor = ops.asarray(1.0 / PRIOR_WIDTH**2, dtype=float64_dtype(ops))
    return ops.inv(hessian + ops.eye(N_PARAMS)[None] * floor[None, None, :])


def interpolate_logflux(library: TemplateLibrary, params: np.ndarray, ops: Any) -> np.ndarray:
    """ln F at (n, 4) grid parameters by multilinear interpolation, on the full template grid (numpy ``ops``)."""
    wave = library.wave[[200, -200]]
    prep = prepare(ops, library, wave, np.zeros(2, dtype=int), 0)
    prep.table = library.logflux
    idx, w, _ = corners(prep, np.asarray(params, dtype=np.float64), False)
    return ops.interpolate(library.logflux, idx, w, None)[:, 0]
