"""Accuracy on in-model spectra: the fit against the truth and against the Cramer-Rao bound.

Shared by the tests (a few hundred spectra) and by
``docs/scripts/spectra_accuracy.py`` (500 per signal-to-noise, the issue's
acceptance run), so both compute the same statistics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plugins.spectra.fit import FAILURE
from plugins.spectra.model import (
    N_PARAMS,
    PARAM_NAMES,
    covariance,
    evaluate,
    float64_dtype,
    interpolate_logflux,
    prepare,
)
from plugins.spectra.ops import NumpyOps
from plugins.spectra.solve import fit_batch
from plugins.spectra.synth import clean_flux, synthetic_spectra
from plugins.spectra.templates import Generator, TemplateLibrary, upper_envelope


def cramer_rao(library: TemplateLibrary, spectra: Any, clean: np.ndarray, degree: int = 3,
               ops: Any = None) -> np.ndarray:
    """(B, 6) Cramer-Rao bounds: the inverse Fisher matrix of the model at the truth, continuum marginalised.

    With noise-free data at the true parameters the linear continuum solve
    returns the true continuum, and the projected normal matrix is the
    Fisher matrix of p for Gaussian noise of inverse variance ``ivar``.
    """
    ops = NumpyOps() if ops is None else ops
    prep = prepare(ops, library, spectra.wave, spectra.arm, degree)
    _, weight = spectra.clean()
    out = np.empty((len(spectra), N_PARAMS))
    for start in range(0, len(spectra), 64):
        sl = slice(start, start + 64)
        at_truth = evaluate(prep, ops.asarray(spectra.truth[sl], dtype=float64_dtype(ops)),
                            ops.asarray(clean[sl]), ops.asarray(weight[sl]), jac=True)
        out[sl] = np.sqrt(np.diagonal(ops.to_numpy(covariance(prep, at_truth.hessian)), 0, 1, 2))
    return out


def accuracy_run(library: TemplateLibrary, n: int, snr: float, ops: Any, *, seed: int = 0, degree: int = 3,
                 method: str = "lm", max_iter: int = 30) -> dict[str, Any]:
    """Fit ``n`` synthetic spectra at ``snr``; the statistics of the issue's acceptance list."""
    spectra = synthetic_spectra(library, n, snr=snr, degree=degree, seed=seed)
    out = fit_batch(spectra, library, ops, method=method, degree=degree, max_iter=max_iter)
    crb = cramer_rao(library, spectra, clean_flux(library, spectra, degree, seed), degree, ops)
    return summarize(spectra.truth, out, crb)


def summarize(truth: np.ndarray, out: dict[str, np.ndarray], crb: np.ndarray) -> dict[str, Any]:
    ok = (np.asarray(out["FLAGS"]) & FAILURE) == 0
    dv = np.asarray(out["VRAD"]) - truth[:, 0]
    sigma_v = np.asarray(out["VRAD_ERR"])
    stats: dict[str, Any] = {
        "n": int(len(dv)), "fitted": int(ok.sum()),
        "median_dv_over_sigma": float(np.median(dv[ok] / sigma_v[ok])),
        "median_dv_kms": float(np.median(dv[ok])),
        "rv_scatter_over_crb": float(np.std(dv[ok] / crb[ok, 0])),
        "rms_dv_kms": float(np.sqrt(np.mean(dv[ok] ** 2))), "rms_crb_kms": float(np.sqrt(np.mean(crb[ok, 0] ** 2))),
        "median_sigma_v_kms": float(np.median(sigma_v[ok])),
        "outlier_fraction": float(np.mean(np.abs(dv) > np.maximum(5 * sigma_v, 20.0))),
    }
    for i, name in enumerate(PARAM_NAMES):
        column = "VRAD" if name == "v" else name.upper()
        pull = (np.asarray(out[column]) - truth[:, i])[ok] / np.asarray(out[f"{column}_ERR"])[ok]
        stats[f"pull_std_{name}"] = float(np.std(pull))
        stats[f"pull_median_{name}"] = float(np.median(pull))
    return stats


def interpolation_error(library: TemplateLibrary, generator: Generator, n: int = 200,
                        seed: int = 1) -> dict[str, float]:
    """Flux error of multilinear interpolation at random off-grid parameters against the exact generator.

    Returned as fractions of the continuum-normalised flux (the flux divided by
    its own smooth continuum): rms over pixels and samples, the largest, and the 99.9th percentile.
    """
    rng = np.random.default_rng(seed)
    params = rng.uniform(library.lower, library.upper, size=(n, 4))
    exact = generator.logflux(params)
    approx = interpolate_logflux(library, params, NumpyOps())
    # compare fluxes relative to the local flux level: exp(ln F_approx - ln F_exact) - 1, weighted by the
    # line-free level so that an error deep in a saturated core (flux ~ 0) counts as little as it does in data
    level = np.exp(exact - upper_envelope(exact))
    diff = (np.exp(approx - exact) - 1.0) * level
    return {"rms": float(np.sqrt(np.mean(diff**2))), "max": float(np.max(np.abs(diff))),
            "p999": float(np.quantile(np.abs(diff), 0.999))}
