"""Accuracy of the fit on in-model spectra, with bounds set by the sample size.

The issue's acceptance run (500 spectra at each of S/N 10, 20 and 50) is
``docs/scripts/spectra_accuracy.py``; here a smaller sample per S/N keeps CI
short, and every bound below is the acceptance threshold widened by what
``n`` spectra can resolve, so a correct fitter fails with negligible
probability while a wrong one (errors off by 30 %, a biased velocity)
still fails:

- the standard deviation of n unit-normal pulls has a standard error of
  about ``1 / sqrt(2 (n - 1))`` (0.058 at n = 150);
- their median has a standard error of ``sqrt(pi / 2) / sqrt(n)``;
- a Gaussian pull beyond 5 sigma has probability 6e-7, so any outlier at all
  means a failed fit (the acceptance allows under 1 %).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from plugins.spectra.accuracy import accuracy_run
from plugins.spectra.solve import numba_ops
from plugins.spectra.templates import named_library

N = 150


def _se_std(n: int) -> float:
    return 1.0 / math.sqrt(2 * (n - 1))


def _se_median(n: int) -> float:
    return math.sqrt(math.pi / 2) / math.sqrt(n)


@pytest.fixture(scope="module")
def library():
    return named_library("small")


@pytest.mark.parametrize("snr", [10.0, 50.0])
def test_velocity_and_parameters_are_recovered_within_their_errors(library, snr):
    stats = accuracy_run(library, N, snr, numba_ops(), seed=int(snr))
    n = stats["fitted"]
    assert n >= N - 1, stats  # at most one spectrum in 150 may fail outright
    # |median dv| < 0.1 sigma in the acceptance run; here what n can resolve: 3.5 standard errors
    assert abs(stats["median_dv_over_sigma"]) < 0.1 + 3.5 * _se_median(n), stats
    # RV scatter at most 1.2x the Cramer-Rao bound (plus one standard error), and not below it by more than
    # 4 standard errors: no estimator beats the bound
    assert 1 - 4 * _se_std(n) < stats["rv_scatter_over_crb"] < 1.2 + _se_std(n), stats
    assert 0.9 - 2 * _se_std(n) < stats["pull_std_v"] < 1.2 + _se_std(n), stats
    assert stats["outlier_fraction"] * N <= 1, stats  # < 1 %: at most one of 150
    for name in ("teff", "logg", "feh"):
        assert 0.8 - 2 * _se_std(n) < stats[f"pull_std_{name}"] < 1.3 + _se_std(n), (name, stats)
        assert abs(stats[f"pull_median_{name}"]) < 3.5 * _se_median(n) + 0.1, (name, stats)


def test_the_velocity_error_scales_inversely_with_signal_to_noise(library):
    """Same stars at S/N 10 and 40: the fitted sigma_v must shrink 4x (the Fisher matrix scales as S/N^2)."""
    from plugins.spectra.solve import fit_batch
    from plugins.spectra.synth import synthetic_spectra

    low = synthetic_spectra(library, 8, snr=10, seed=21, mask_fraction=0.0)
    high = synthetic_spectra(library, 8, snr=40, seed=21, mask_fraction=0.0)
    ratio = fit_batch(low, library, numba_ops())["VRAD_ERR"] / fit_batch(high, library, numba_ops())["VRAD_ERR"]
    assert np.allclose(ratio, 4.0, rtol=0.15), ratio
