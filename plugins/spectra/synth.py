"""Synthetic in-model spectra: random parameters, the model, a positive Legendre continuum, Gaussian noise, masks.

The truth of every spectrum is known (``Spectra.truth``), and the spectra
are exactly what the fitter's model can produce, so the fit's scatter can be
compared with the Cramer-Rao bound of the same model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from plugins.spectra.model import Spectra, arm_wavelengths, legendre_basis, prepare, shifted_templates
from plugins.spectra.ops import NumpyOps
from plugins.spectra.templates import TemplateLibrary

VRAD_RANGE = (-500.0, 500.0)
VSINI_RANGE = (0.0, 40.0)


def random_parameters(library: TemplateLibrary, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 6): v uniform in VRAD_RANGE, vsini in VSINI_RANGE, theta uniform over the grid's box."""
    v = rng.uniform(*VRAD_RANGE, n)
    vsini = rng.uniform(*VSINI_RANGE, n)
    theta = rng.uniform(library.lower, library.upper, size=(n, 4))
    return np.column_stack([v, vsini, theta])


def noiseless(library: TemplateLibrary, wave: np.ndarray, arm: np.ndarray, params: np.ndarray,
              coeffs: np.ndarray, degree: int, chunk: int = 64) -> np.ndarray:
    """The model flux (continuum included) of each parameter row, (n, N), float64."""
    prep = prepare(NumpyOps(), library, wave, arm, degree)
    basis = legendre_basis(wave, arm, degree)
    out = np.empty((len(params), len(wave)))
    for start in range(0, len(params), chunk):
        sl = slice(start, start + chunk)
        out[sl] = shifted_templates(prep, params[sl], False)[:, 0] * (coeffs[sl] @ basis.T)
    return out


def random_continuum(n: int, arms: int, degree: int, rng: np.random.Generator) -> np.ndarray:
    """Legendre coefficients of a positive, slowly varying continuum per arm (levels differ between arms)."""
    coeffs = np.zeros((n, arms, degree + 1))
    coeffs[:, :, 0] = rng.uniform(0.5, 2.0, size=(n, arms))
    for d in range(1, degree + 1):
        coeffs[:, :, d] = coeffs[:, :, 0] * rng.normal(0.0, 0.08 / d, size=(n, arms))
    return coeffs.reshape(n, -1)


def synthetic_spectra(library: TemplateLibrary, n: int, *, snr: float | Sequence[float] | np.ndarray = 20.0,
                      n_pixels: int | None = None, degree: int = 3, seed: int = 0, mask_fraction: float = 0.01,
                      params: np.ndarray | None = None) -> Spectra:
    """``n`` in-model spectra at signal-to-noise ``snr`` per pixel (a number, or one per spectrum).

    The noise sigma is constant along each arm: the arm's median model flux over ``snr``.
    ``mask_fraction`` of the pixels (scattered, plus one bad 20-pixel block per spectrum) get
    ivar = 0 and a corrupted flux, which the fit must ignore.
    """
    rng = np.random.default_rng(seed)
    wave, arm = arm_wavelengths(n_pixels)
    drawn = random_parameters(library, n, rng)  # drawn even when given, so that clean_flux can replay the draws
    params = drawn if params is None else np.asarray(params, dtype=np.float64)
    coeffs = random_continuum(n, int(arm.max()) + 1, degree, rng)
    clean = noiseless(library, wave, arm, params, coeffs, degree)
    snr = np.broadcast_to(np.asarray(snr, dtype=np.float64), (n,))
    sigma = np.empty_like(clean)
    for a in range(int(arm.max()) + 1):
        sel = arm == a
        sigma[:, sel] = (np.median(clean[:, sel], axis=1) / snr)[:, None]
    flux = clean + sigma * rng.standard_normal(clean.shape)
    ivar = 1.0 / sigma**2
    if mask_fraction > 0:
        bad = rng.uniform(size=flux.shape) < mask_fraction
        starts = rng.integers(0, len(wave) - 20, size=n)
        for i, s in enumerate(starts):
            bad[i, s : s + 20] = True
        ivar[bad] = 0.0
        flux[bad] = rng.uniform(-10, 10, size=int(bad.sum())) * np.median(clean)  # cosmic rays, dead columns
    return Spectra(wave=wave, arm=arm, flux=flux.astype(np.float32), ivar=ivar.astype(np.float32),
                   targetid=np.arange(n, dtype=np.int64) + 1000 * (seed + 1), truth=params)


def clean_flux(library: TemplateLibrary, spectra: Spectra, degree: int, seed: int = 0) -> np.ndarray:
    """The noise-free flux behind ``synthetic_spectra(..., seed=seed)`` (same draws): for the Cramer-Rao bound."""
    rng = np.random.default_rng(seed)
    random_parameters(library, len(spectra), rng)
    coeffs = random_continuum(len(spectra), int(spectra.arm.max()) + 1, degree, rng)
    return noiseless(library, spectra.wave, spectra.arm, spectra.truth, coeffs, degree)
