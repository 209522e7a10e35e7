"""The torch backend of spectra.fit on a real GPU, eager and fused (Triton): the same answers as the numba fit
and as each other, and in-model accuracy."""

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


def _ops(variant: str):
    """The eager torch operations, or the Triton ones of ``torch:fused`` or ``torch:graph`` (imported only where
    it is asked for)."""
    import torch

    if variant == "graph":
        from plugins.spectra.triton_kernels import GraphOps

        return GraphOps(torch.device("cuda"))
    if variant == "fused":
        from plugins.spectra.triton_kernels import TritonOps

        return TritonOps(torch.device("cuda"))
    return TorchOps(torch.device("cuda"))


@pytest.mark.parametrize("variant", ["eager", "fused", "graph"])
def test_gpu_accuracy_at_snr_20_on_500_spectra(variant):
    stats = accuracy_run(named_library("small"), 500, 20.0, _ops(variant), seed=77)
    assert stats["fitted"] >= 495, stats
    assert 0.9 < stats["pull_std_v"] < 1.2, stats
    assert stats["rv_scatter_over_crb"] < 1.2, stats
    assert stats["outlier_fraction"] < 0.01, stats


def test_fused_kernels_give_the_eager_model_to_float32_rounding():
    import torch

    from plugins.spectra.model import arm_wavelengths, prepare, shifted_templates
    from plugins.spectra.triton_kernels import GraphOps, TritonOps

    library = named_library("small")
    rng = np.random.default_rng(8)
    n = 256
    p = np.column_stack([rng.uniform(-1000, 1000, n), rng.uniform(0, 300, n), rng.uniform(library.lower, library.upper,
                                                                                          (n, 4))])
    p[:4, 0], p[:4, 1] = [-1000.0, 1000.0, 0.0, 5.0], [0.0, 300.0, 0.2, 15.0]  # the bounds, a delta kernel
    wave, arm = arm_wavelengths()
    models = []
    for ops in (TorchOps(torch.device("cuda")), TritonOps(torch.device("cuda")), GraphOps(torch.device("cuda"))):
        prep = prepare(ops, library, wave, arm, 3)
        at = ops.asarray(p, dtype=torch.float64)
        models.append([shifted_templates(prep, at, jac).cpu().numpy() for jac in (False, True)])
    for eager, fused, graph in zip(*models):
        scale = np.abs(eager).max(axis=(0, 2), keepdims=True)
        assert np.max(np.abs(fused - eager) / scale) < 3e-5
        assert np.max(np.abs(graph - eager) / scale) < 3e-5


def test_fused_fit_agrees_with_the_eager_torch_fit():
    library = named_library("small")
    spectra = synthetic_spectra(library, 64, snr=20, seed=31)
    eager = core.solve(SpectraProblem(spectra=spectra), backend="torch").outputs
    fused = core.solve(SpectraProblem(spectra=spectra), backend="torch:fused").outputs
    _assert_fits_agree(eager, fused)


def _assert_fits_agree(reference: dict, other: dict) -> None:
    """Two fits of the same 64 spectra: the same successes but one, and every parameter of both within 0.05
    sigma, its error within 2 % (float32 rounding may tip one borderline fit)."""
    assert np.sum(other["SUCCESS"] != reference["SUCCESS"]) <= 1
    both = reference["SUCCESS"] & other["SUCCESS"]
    assert both.sum() >= 62
    for name in ("VRAD", "VSINI", "TEFF", "LOGG", "FEH", "ALPHA"):
        gap = np.abs(other[name] - reference[name])[both] / reference[f"{name}_ERR"][both]
        assert np.max(gap) < 0.05, (name, np.max(gap))
        # an unresolved vsini (smaller than its error) has almost no curvature: the model barely moves with it
        # near 0, so its error estimate is ill-conditioned in any precision (1.2 +- 32.7 km/s differed by 78 %
        # between torch and torch:fused on the H200, where every resolved one agreed within 0.5 %)
        resolved = both & ((reference[name] > reference[f"{name}_ERR"]) if name == "VSINI" else True)
        assert np.allclose(other[f"{name}_ERR"][resolved], reference[f"{name}_ERR"][resolved], rtol=0.02)


def test_graph_fit_agrees_with_the_fused_fit_and_runs_its_steps_as_a_cuda_graph():
    """torch:graph (the LM at a fixed shape, its step captured as a CUDA graph) fits as torch:fused does."""
    import warnings

    from plugins.spectra.fit import CAPTURES

    library = named_library("small")
    spectra = synthetic_spectra(library, 64, snr=20, seed=31)
    fused = core.solve(SpectraProblem(spectra=spectra), backend="torch:fused").outputs
    before = dict(CAPTURES)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a capture that fails warns: fail the test instead
        graph = core.solve(SpectraProblem(spectra=spectra), backend="torch:graph").outputs
    assert CAPTURES["captured"] > before["captured"] and CAPTURES["failed"] == before["failed"]
    _assert_fits_agree(fused, graph)


@pytest.mark.parametrize("max_iter", [1, 2, 3, 6])
def test_torch_graph_captures_exactly_when_its_own_features_say(max_iter):
    """The cost model prices torch:graph's eager steps and its capture as features of their own
    (work.graph_features, from the steps the fit really ran): they must say what lm_static did."""
    from core.costmodel.features import model_features
    from plugins.spectra.fit import CAPTURES

    spec = core.solvers()["spectra.fit"]
    problem = SpectraProblem(n_spectra=8, n_pixels=1500, max_iter=max_iter, tol=0.0, seed=5)
    before = dict(CAPTURES)
    result = core.solve(problem, backend="torch:graph")
    done = model_features(spec, problem, "torch:graph", spec.work_done(problem, result.outputs))
    assert done["captures"] == CAPTURES["captured"] - before["captured"]
    assert done["eager_steps"] == min(done["steps"], 3.0) and done["steps"] == max_iter
