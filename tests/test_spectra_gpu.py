"""The torch backend of spectra.fit on a real GPU: the same answers as the numba fit, and in-model accuracy."""

from __future__ import annotations

import numpy as np
import pytest

import core
from plugins.spectra.accuracy import accuracy_run
from plugins.spectra.ops import TorchOps
from plugins.spectra.problem import SpectraProblem
from plugins.spectra.solve import fit_batch, numba_ops
from plugins.spectra.synth import synthetic_spectra
from plugins.spectra.templates import named_library

pytestmark = pytest.mark.gpu


def test_gpu_fit_agrees_with_the_numba_fit_within_a_small_fraction_of_sigma():
    library = named_library("small")
    spectra = synthetic_spectra(library, 64, snr=20, seed=31)
    cpu = fit_batch(spectra, library, numba_ops())
    gpu = core.solve(SpectraProblem(spectra=spectra), backend="torch").outputs
    both = cpu["SUCCESS"] & gpu["SUCCESS"]
    assert both.sum() >= 62
    for name in ("VRAD", "TEFF", "LOGG", "FEH", "ALPHA"):
        gap = np.abs(gpu[name] - cpu[name])[both] / cpu[f"{name}_ERR"][both]
        assert np.max(gap) < 0.1, (name, np.max(gap))


def test_gpu_accuracy_at_snr_20_on_500_spectra():
    import torch

    stats = accuracy_run(named_library("small"), 500, 20.0, TorchOps(torch.device("cuda")), seed=77)
    assert stats["fitted"] >= 495, stats
    assert 0.9 < stats["pull_std_v"] < 1.2, stats
    assert stats["rv_scatter_over_crb"] < 1.2, stats
    assert stats["outlier_fraction"] < 0.01, stats
