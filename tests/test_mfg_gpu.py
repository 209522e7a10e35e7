"""MFG on the GPU: every torch implementation against the float64 CPU reference (run on the lent GPU machine).

The FP variants (``torch:fused``, the Triton kernel, and ``torch:eager``)
are called both directly and through the spec's lazy bindings, as the core
calls them; the coupled solvers' HJB variants (``torch:hjb_host``,
``torch:hjb_device``) against numba.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_mfg_fp import noise_l1, ou_problem

from plugins.mfg.fp.numba_kernel import solve_particles
from plugins.mfg.fp.reference import solve_numpy
from plugins.mfg.problem import CommonNoiseProblem, FPProblem, MFGProblem
from plugins.mfg.specs import COMMON_NOISE, FIXED_POINT, FP_PARTICLE

pytestmark = pytest.mark.gpu

FP_VARIANTS = ["torch:fused", "torch:eager"]


def host(outputs: dict) -> dict:
    return {k: (v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v)) for k, v in outputs.items()}


def driven(boundary: str, n: int, kde: str = "binned", bandwidth="scott") -> FPProblem:
    base = FPProblem(N=n, Nx=51, Nt=30, boundary=boundary, kde=kde, bandwidth=bandwidth)
    u = 0.2 * np.outer(base.T - base.t, np.cos(2 * np.pi * base.x))
    return FPProblem(N=n, Nx=51, Nt=30, boundary=boundary, kde=kde, bandwidth=bandwidth, U=u)


def l1(problem, a, b) -> float:
    return float(np.sum(np.abs(a - b) * problem.weights()))


def test_the_fused_kernel_runs_here():
    # on the GPU host every binned-KDE problem with Scott's rule is open to the Triton kernel
    from plugins.mfg.fp.torch_kernel import fused_unsupported

    assert fused_unsupported(driven("periodic", 1_000)) == ""
    assert FP_PARTICLE.supports(driven("reflecting", 1_000, bandwidth=0.03), "torch:fused") == ""


@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
@pytest.mark.parametrize("variant", FP_VARIANTS)
def test_torch_fp_agrees_with_numpy_in_distribution(boundary, variant):
    p = driven(boundary, 200_000)
    ref, out = solve_numpy(p), host(FP_PARTICLE.implementations[variant](p))
    assert str(out["path"]) == variant.split(":")[1]
    for n in (0, p.Nt // 2, p.Nt):
        assert l1(p, out["M"][n], ref["M"][n]) < 4 * noise_l1(ref["M"][n], ref["bandwidth"][n], p.N, p.weights())
    assert np.max(np.abs(out["mass"] - 1)) < 1e-12  # float64 deposits in both variants


@pytest.mark.parametrize(("kde", "bandwidth"), [("direct", "scott"), ("binned", "silverman"), ("binned", 0.03)])
def test_torch_eager_kde_variants(kde, bandwidth):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p = driven("periodic", 20_000, kde=kde, bandwidth=bandwidth)
    ref, out = solve_numpy(p), host(solve_torch(p, fused=False))
    assert l1(p, out["M"][-1], ref["M"][-1]) < 4 * noise_l1(ref["M"][-1], ref["bandwidth"][-1], p.N, p.weights()) + 0.01
    assert abs(out["bandwidth"][-1] - ref["bandwidth"][-1]) < 0.05 * ref["bandwidth"][-1]


@pytest.mark.parametrize(("kde", "bandwidth"), [("direct", "scott"), ("binned", "silverman")])
def test_the_fused_variant_refuses_what_it_cannot_run(kde, bandwidth):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p = driven("periodic", 1_000, kde=kde, bandwidth=bandwidth)
    assert FP_PARTICLE.supports(p, "torch:fused")
    with pytest.raises(ValueError, match="fused torch FP cannot run"):
        solve_torch(p, fused=True)


def test_fused_with_a_fixed_bandwidth_agrees_with_numpy():
    p = driven("reflecting", 100_000, bandwidth=0.03)
    ref, out = solve_numpy(p), host(FP_PARTICLE.implementations["torch:fused"](p))
    assert l1(p, out["M"][-1], ref["M"][-1]) < 4 * noise_l1(ref["M"][-1], 0.03, p.N, p.weights())
    np.testing.assert_allclose(out["bandwidth"], 0.03)


@pytest.mark.parametrize("fused", [True, False])
def test_torch_ou_moments(fused):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p, theta, c, sigma = ou_problem(1_000_000)
    out = host(solve_torch(p, fused=fused))
    mean0 = float(np.sum(p.x * p.m0 * p.weights()))
    var0 = float(np.sum((p.x - mean0) ** 2 * p.m0 * p.weights())) + p.dx**2 / 12
    decay = math.exp(-theta * p.T)
    mean_t, var_t = c + (mean0 - c) * decay, var0 * decay**2 + sigma**2 / (2 * theta) * (1 - decay**2)
    mean, var = out["moments"][-1]
    assert abs(mean - mean_t) < 4 * math.sqrt(var_t / p.N) + 1e-5  # + float32 positions
    assert abs(var - var_t) < 4 * var_t * math.sqrt(2 / (p.N - 1)) + 2e-4


@pytest.mark.parametrize("fused", [True, False])
def test_fp_batch_equals_single_solves(fused):
    from plugins.mfg.fp.torch_kernel import solve_torch, solve_torch_batch

    p = driven("periodic", 50_000)
    us = np.stack([p.U, 2 * p.U, np.zeros_like(p.U)])
    batch = solve_torch_batch(p, us, fused=fused).cpu().numpy()
    for k, u in enumerate(us):
        single = solve_torch(FPProblem(**{**p.model_fields(), "U": u}), fused=fused)["M"].cpu().numpy()
        # atomic adds land in a different order run to run: equal to rounding, not bit for bit
        np.testing.assert_allclose(batch[k], single, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("variant", FP_VARIANTS)
def test_fp_memory_estimate_covers_the_device_peak(variant):
    import torch

    p = driven("periodic", 2_000_000)
    FP_PARTICLE.implementations[variant](p)  # compiles and caches outside the measured run
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    host(FP_PARTICLE.implementations[variant](p))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= FP_PARTICLE.memory(p, variant), (peak, FP_PARTICLE.memory(p, variant))


@pytest.mark.parametrize("variant", ["torch:hjb_host", "torch:hjb_device"])
def test_torch_fixed_point_converges_and_agrees_with_numba(variant):
    from plugins.mfg.coupling import solve_fixed_point

    p = MFGProblem(preset="lq", N=200_000, Nt=30)
    gpu, cpu = FIXED_POINT.implementations[variant](p), solve_fixed_point(p, steps="numba")
    assert bool(gpu["converged"])
    assert l1(p, gpu["M"][-1], cpu["M"][-1]) < 0.05


def test_the_two_hjb_variants_of_the_fixed_point_agree():
    # the same FP on the device; the HJB on the host (numba) or the device (torch) agree to 1e-8 per solve
    p = MFGProblem(preset="towel_beach", N=50_000, Nx=41, Nt=20)
    on_host = FIXED_POINT.implementations["torch:hjb_host"](p)
    on_device = FIXED_POINT.implementations["torch:hjb_device"](p)
    assert int(on_host["iterations"]) == int(on_device["iterations"])
    assert l1(p, on_host["M"][-1], on_device["M"][-1]) < 1e-6


@pytest.mark.parametrize("variant", ["torch:hjb_host", "torch:hjb_device"])
def test_torch_common_noise_agrees_with_numba(variant):
    from plugins.mfg.common_noise import solve_serial

    cn = CommonNoiseProblem(preset="lq", K=4, N=50_000, Nt=20)
    gpu, cpu = COMMON_NOISE.implementations[variant](cn), solve_serial(cn, steps="numba")
    np.testing.assert_array_equal(gpu["theta"], cpu["theta"])  # the same paths, in the same order
    assert gpu["converged"].all()
    assert l1(cn, gpu["M_mean"][-1], cpu["M_mean"][-1]) < 0.05


def test_the_two_hjb_variants_of_common_noise_agree():
    from plugins.mfg.common_noise import solve_torch

    cn = CommonNoiseProblem(preset="lq", K=4, N=50_000, Nt=20)
    on_host, on_device = solve_torch(cn, hjb_device=False), solve_torch(cn, hjb_device=True)
    assert l1(cn, on_host["M_mean"][-1], on_device["M_mean"][-1]) < 1e-6


@pytest.mark.parametrize("fused", [True, False])
def test_numba_fp_still_agrees_on_the_gpu_host(fused):
    p = driven("reflecting", 100_000)
    a, b = solve_numpy(p), solve_particles(p, fused=fused)
    assert l1(p, a["M"][-1], b["M"][-1]) < 4 * noise_l1(a["M"][-1], a["bandwidth"][-1], p.N, p.weights())
