"""MFG on the GPU: the torch paths against the float64 CPU reference (run on the lent GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest
from test_mfg_fp import noise_l1, ou_problem

from plugins.mfg.fp.numba_kernel import solve_numba
from plugins.mfg.fp.reference import solve_numpy
from plugins.mfg.problem import CommonNoiseProblem, FPProblem, MFGProblem

pytestmark = pytest.mark.gpu


def host(outputs: dict) -> dict:
    return {k: (v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v)) for k, v in outputs.items()}


def driven(boundary: str, n: int, kde: str = "binned", bandwidth="scott") -> FPProblem:
    base = FPProblem(N=n, Nx=51, Nt=30, boundary=boundary, kde=kde, bandwidth=bandwidth)
    u = 0.2 * np.outer(base.T - base.t, np.cos(2 * np.pi * base.x))
    return FPProblem(**{**base.model_fields(), "U": u})


@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
@pytest.mark.parametrize("path", ["fused", "eager"])
def test_torch_fp_agrees_with_numpy_in_distribution(boundary, path):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p = driven(boundary, 200_000)
    ref, out = solve_numpy(p), host(solve_torch(p, path=path))
    assert str(out["path"]) == path
    for n in (0, p.Nt // 2, p.Nt):
        distance = float(np.sum(np.abs(out["M"][n] - ref["M"][n]) * p.weights()))
        assert distance < 4 * noise_l1(ref["M"][n], ref["bandwidth"][n], p.N, p.weights())
    assert np.max(np.abs(out["mass"] - 1)) < 1e-12  # float64 deposits on both paths


@pytest.mark.parametrize(("kde", "bandwidth"), [("direct", "scott"), ("binned", "silverman"), ("binned", 0.03)])
def test_torch_eager_kde_variants(kde, bandwidth):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p = driven("periodic", 20_000, kde=kde, bandwidth=bandwidth)
    ref, out = solve_numpy(p), host(solve_torch(p))
    distance = float(np.sum(np.abs(out["M"][-1] - ref["M"][-1]) * p.weights()))
    assert distance < 4 * noise_l1(ref["M"][-1], ref["bandwidth"][-1], p.N, p.weights()) + 0.01
    assert abs(out["bandwidth"][-1] - ref["bandwidth"][-1]) < 0.05 * ref["bandwidth"][-1]


def test_torch_ou_moments():
    import math

    from plugins.mfg.fp.torch_kernel import solve_torch

    p, theta, c, sigma = ou_problem(1_000_000)
    out = host(solve_torch(p))
    mean0 = float(np.sum(p.x * p.m0 * p.weights()))
    var0 = float(np.sum((p.x - mean0) ** 2 * p.m0 * p.weights())) + p.dx**2 / 12
    decay = math.exp(-theta * p.T)
    mean_t, var_t = c + (mean0 - c) * decay, var0 * decay**2 + sigma**2 / (2 * theta) * (1 - decay**2)
    mean, var = out["moments"][-1]
    assert abs(mean - mean_t) < 4 * math.sqrt(var_t / p.N) + 1e-5  # + float32 positions
    assert abs(var - var_t) < 4 * var_t * math.sqrt(2 / (p.N - 1)) + 2e-4


def test_fp_batch_equals_single_solves():
    from plugins.mfg.fp.torch_kernel import solve_torch, solve_torch_batch

    p = driven("periodic", 50_000)
    us = np.stack([p.U, 2 * p.U, np.zeros_like(p.U)])
    batch = solve_torch_batch(p, us).cpu().numpy()
    for k, u in enumerate(us):
        single = solve_torch(FPProblem(**{**p.model_fields(), "U": u}))["M"].cpu().numpy()
        # atomic adds land in a different order run to run: equal to rounding, not bit for bit
        np.testing.assert_allclose(batch[k], single, rtol=1e-9, atol=1e-12)


def test_torch_fixed_point_converges_and_agrees_with_numba():
    from plugins.mfg.coupling import solve_with

    p = MFGProblem(preset="lq", N=200_000, Nt=30)
    gpu, cpu = solve_with("torch")(p), solve_with("numba")(p)
    assert bool(gpu["converged"])
    assert float(np.sum(np.abs(gpu["M"][-1] - cpu["M"][-1]) * p.weights())) < 0.05


def test_torch_common_noise_agrees_with_numba():
    from plugins.mfg.common_noise import solve_serial, solve_torch

    cn = CommonNoiseProblem(preset="lq", K=4, N=50_000, Nt=20)
    gpu, cpu = solve_torch(cn), solve_serial(cn, "numba")
    np.testing.assert_array_equal(gpu["theta"], cpu["theta"])  # the same paths, in the same order
    assert gpu["converged"].all()
    assert float(np.sum(np.abs(gpu["M_mean"][-1] - cpu["M_mean"][-1]) * cn.weights())) < 0.05
    on_gpu = solve_torch(cn, hjb_on_gpu=True)
    assert float(np.sum(np.abs(on_gpu["M_mean"][-1] - gpu["M_mean"][-1]) * cn.weights())) < 1e-6


def test_numba_fp_still_agrees_on_the_gpu_host():
    p = driven("reflecting", 100_000)
    a, b = solve_numpy(p), solve_numba(p)
    assert float(np.sum(np.abs(a["M"][-1] - b["M"][-1]) * p.weights())) < 4 * noise_l1(
        a["M"][-1], a["bandwidth"][-1], p.N, p.weights())
