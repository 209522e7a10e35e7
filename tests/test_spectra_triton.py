"""The Triton model kernels of ``spectra.fit``'s ``torch:fused`` against the eager torch model, on the CPU.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
NumPy on the CPU) where Triton is installed: the same code and float32
arithmetic, summed in another order than the eager model's convolution and
taps, so the two agree to float32 rounding. Triton decides at its own import
whether to interpret, so the kernels run in a child process.
tests/test_spectra_gpu.py runs them on a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plugins.spectra import SPEC
from plugins.spectra.ops import NumpyOps

ROOT = Path(__file__).resolve().parents[1]

INTERPRET = """
import pickle, sys, numpy as np, torch
import triton.runtime.interpreter as interpreter
_patch = interpreter._patch_lang_tensor
def _squeezing(tensor, *args):  # Triton 3.6's interpreter takes int() of a (1,) array, which NumPy 2.5 refuses
    _patch(tensor, *args)
    if args:
        args[0].set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))
interpreter._patch_lang_tensor = _squeezing
from plugins.spectra.model import arm_wavelengths, prepare, shifted_templates
from plugins.spectra.ops import TorchOps
from plugins.spectra.templates import named_library
from plugins.spectra.triton_kernels import GraphOps, TritonOps
from plugins.spectra.fit import lm_batch
from plugins.spectra.model import evaluate
from plugins.spectra.synth import synthetic_spectra
p = pickle.load(open(sys.argv[1], "rb"))
library = named_library("small")
wave, arm = arm_wavelengths(600)
data = synthetic_spectra(library, len(p), snr=30, n_pixels=600, seed=4)
data.ivar[1, data.arm == 2] = 0  # a spectrum with a missing arm: its continuum pinned to 0 there
out = {}
for ops in (TorchOps("cpu"), TritonOps("cpu"), GraphOps("cpu")):
    prep = prepare(ops, library, wave, arm, 3)
    at = ops.asarray(p, dtype=torch.float64)
    models = [shifted_templates(prep, at, jac).numpy() for jac in (False, True)]
    near = ops.asarray(data.truth + [[3.0, 2.0, 40.0, 0.1, 0.05, 0.02]], dtype=torch.float64)
    flux, ivar = ops.asarray(data.flux), ops.asarray(data.ivar)
    fit = evaluate(prep, near, flux, ivar, jac=True)
    out[type(ops).__name__] = models + [[x.numpy() for x in (fit.chi2, fit.hessian, fit.gradient, fit.coeffs)]]
    if type(ops) is TorchOps:
        continue
    # the LM: lm_batch on the fused ops, lm_static (fixed shape, inactive spectra masked) on GraphOps
    lm = lm_batch(prep, flux, ivar, near, 8, 1e-7, np.full(len(p), 500.0))
    out[type(ops).__name__].append({key: (value.numpy() if hasattr(value, "numpy") else value)
                                    for key, value in lm.items()})
    if isinstance(ops, GraphOps):  # the small solves against torch's
        g = torch.Generator().manual_seed(3)
        for n, k in ((12, 1), (12, 6), (6, 1), (4, 3)):
            m = torch.randn(9, n, n, generator=g, dtype=torch.float64)
            a = m @ m.transpose(1, 2) + n * torch.eye(n, dtype=torch.float64) * torch.rand(9, 1, 1, generator=g)
            a[:, 0] *= 1e4
            a[:, :, 0] *= 1e4  # badly scaled, as v against teff is
            rhs = torch.randn(9, n, k, generator=g, dtype=torch.float64)
            got = ops.solve(a, rhs[..., 0] if k == 1 else rhs)
            want = torch.linalg.solve(a, rhs)
            out.setdefault("solves", []).append(((got[..., None] if k == 1 else got).numpy(), want.numpy()))
pickle.dump(out, open(sys.argv[2], "wb"))
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    pytest.importorskip("torch")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    from plugins.spectra.templates import named_library

    library = named_library("small")
    rng = np.random.default_rng(5)
    # velocities to the bounds, vsini from a delta function to the widest kernel, theta on and between nodes
    p = np.column_stack([np.array([-1000.0, -420.0, 0.0, 37.5, 1000.0]), np.array([0.0, 3.0, 15.0, 80.0, 300.0]),
                         rng.uniform(library.lower, library.upper, (5, 4))])
    p[2, 2:] = library.lower
    folder = tmp_path_factory.mktemp("spectra-triton")
    (folder / "in.pkl").write_bytes(pickle.dumps(p))
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", INTERPRET, str(folder / "in.pkl"), str(folder / "out.pkl")], cwd=ROOT,
                   env=env, check=True, timeout=600)
    return pickle.loads((folder / "out.pkl").read_bytes())


@pytest.mark.parametrize("ops", ["TritonOps", "GraphOps"])
@pytest.mark.parametrize("jac", [0, 1], ids=["model", "with derivatives"])
def test_the_fused_kernels_give_the_eager_model_to_float32_rounding(interpreted, jac, ops):
    eager, fused = interpreted["TorchOps"][jac], interpreted[ops][jac]
    assert fused.shape == eager.shape == (5, 7 if jac else 1, 599)
    # per channel, against the channel's scale: the velocity channel sums slopes that cancel, so it keeps
    # the least relative precision (5e-6 seen); an error of the scheme would be of order 1
    scale = np.abs(eager).max(axis=(0, 2), keepdims=True)
    assert np.max(np.abs(fused - eager) / scale) < 3e-5


def test_the_graph_variants_small_solves_give_torchs(interpreted):
    for got, want in interpreted["solves"]:
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())


def test_the_static_lm_takes_the_batched_lms_steps(interpreted):
    """lm_static (every spectrum kept, the converged masked) fits as lm_batch does, step for step.

    Their arithmetic differs in rounding only (the rotation kernel, the Doppler shift and the small
    solves are computed apart), which may tip a convergence test by one step: a converged spectrum
    updated by a masked step, or an active one left alone, would be off by far more.
    """
    batched, static = interpreted["TritonOps"][3], interpreted["GraphOps"][3]
    assert np.max(np.abs(static["iterations"] - batched["iterations"])) <= 1
    assert static["iterations"].min() >= 2  # the masked steps were taken
    np.testing.assert_array_equal(static["converged"], batched["converged"])
    assert not static["broken"].any()
    errors = np.sqrt(np.diagonal(np.linalg.inv(batched["hessian"]), 0, 1, 2))
    assert np.max(np.abs(static["p"] - batched["p"]) / errors) < 0.02
    np.testing.assert_allclose(static["chi2"], batched["chi2"], rtol=1e-5)


@pytest.mark.parametrize("variant", ["torch:fused", "torch:graph"])
def test_the_fused_variant_is_an_implementation_that_says_why_it_cannot_run(variant):
    assert variant in SPEC.implementations
    torch = pytest.importorskip("torch")
    from plugins.spectra.problem import SpectraProblem

    reason = SPEC.supports(SpectraProblem(n_spectra=2), variant)
    if importlib.util.find_spec("triton") is None:
        assert reason == "Triton is not installed"
    elif not torch.cuda.is_available():
        assert reason == "the Triton spectrum kernels need a CUDA device"
    assert SPEC.supports(SpectraProblem(n_spectra=2), "torch") == ""


def test_the_eager_models_kernel_is_sized_by_the_batchs_largest_vsini():
    assert NumpyOps().vsini_bound(np.array([3.0, 41.5, 7.0])) == 41.5


@pytest.mark.parametrize("ops", ["TritonOps", "GraphOps"])
def test_the_fused_normal_equations_give_the_eager_ones(interpreted, ops):
    (chi2, hessian, gradient, coeffs), fused = interpreted["TorchOps"][2], interpreted[ops][2]
    np.testing.assert_allclose(fused[3], coeffs, rtol=1e-5, atol=1e-6 * np.abs(coeffs).max())
    np.testing.assert_allclose(fused[0], chi2, rtol=1e-5)
    # float32 Jacobians either way, the fused products summed in float64: agreement to float32 rounding, in
    # units of each parameter's curvature (the scale its error and step are read in)
    scale = np.sqrt(np.einsum("bii->bi", hessian))
    np.testing.assert_allclose(fused[1] / scale[:, :, None] / scale[:, None, :], hessian / scale[:, :, None]
                               / scale[:, None, :], atol=1e-4)
    np.testing.assert_allclose(fused[2] / scale, gradient / scale, atol=1e-3 * np.abs(gradient / scale).max())
