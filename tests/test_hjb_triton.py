"""The Triton HJB kernel (``mfg.hjb_fdm``'s ``torch:fused``) against the float64 reference.

The truth is :func:`plugins.mfg.hjb.reference.solve_numpy` (numba, which
agrees with it to 1e-10 in test_mfg_hjb, stands in for it on batches too
large for numpy's Python-level Thomas sweep). The kernel stops Newton on the
same rule (the update's max norm below ``newton_tol``), so each step's
iteration count must be the reference's, except where an update lands
within rounding of ``newton_tol``: then the other solve order may take one
iteration more or fewer (seen once in 12,800 steps of a 64-instance batch
on an H200, at newton_tol 1e-12), so the batch tests allow that on 0.1 % of
the steps, one iteration apart. U may differ only by the
rounding of a different solve order (parallel cyclic reduction against
Thomas) carried through a stable implicit scheme: measured 1e-14 on a
21-point row, so the bound below, 1e-9 on a U of order one, leaves room for
the longest rows and 200 steps without hiding an error of the scheme (whose
own error at these grids is 1e-2).

Without a GPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``,
NumPy on the CPU) where Triton is installed: same code, same arithmetic, no
barriers needed. The GPU tests carry the ``gpu`` marker.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from plugins.mfg.hjb import layout
from plugins.mfg.hjb.numba_kernel import solve_numba
from plugins.mfg.hjb.reference import solve_numpy, step_source
from plugins.mfg.problem import CommonNoiseProblem, HJBProblem, MFGProblem
from plugins.mfg.specs import COMMON_NOISE, FIXED_POINT, HJB_FDM

U_BOUND = 1e-9
KERNEL = Path(__file__).resolve().parents[1] / "plugins" / "mfg" / "hjb" / "triton_kernel.py"
PRESETS = ("towel_beach", "lq", "crowd")  # periodic (log congestion), reflecting (log), reflecting (linear)


def varied_batch(problem: HJBProblem, k: int) -> tuple[np.ndarray, np.ndarray]:
    """K potentials and densities that make Newton work differently hard: rolled and scaled by instance.

    The crowd grows up to 40-fold over the batch, so the congestion cost and
    the gradients (and with them the Newton iterations a step needs) differ.
    """
    shifts = [(7 * i) % problem.Nx for i in range(k)]
    scales = np.geomspace(0.1, 4.0, k)
    V = np.stack([np.roll(problem.potential(), s, axis=1) * (1 + i % 3) for i, s in enumerate(shifts)])
    M = np.stack([np.roll(problem.M, -s, axis=1) * c for s, c in zip(shifts, scales)])
    return V, M


def instance(problem: HJBProblem, V: np.ndarray, M: np.ndarray, newton_tol: float | None = None) -> HJBProblem:
    fields = problem.model_fields()
    tol = problem.newton_tol if newton_tol is None else newton_tol
    return HJBProblem(**fields, V_t=V, M=M, newton_tol=tol, newton_max=problem.newton_max)


def assert_matches(reference: dict, U, iterations, converged, borderline: bool = False) -> int:
    """U within the bound, the same flags, the same iteration counts; returns the steps one iteration apart.

    ``borderline`` lets counts differ by one (a caller bounds how many steps may).
    """
    assert np.max(np.abs(np.asarray(U) - reference["U"])) < U_BOUND
    np.testing.assert_array_equal(np.asarray(converged), reference["converged"])
    apart = np.abs(np.asarray(iterations) - reference["newton_iterations"])
    if not borderline:
        np.testing.assert_array_equal(np.asarray(iterations), reference["newton_iterations"])
    assert np.all(apart <= 1), apart.max()
    return int(np.count_nonzero(apart))


# -- what runs anywhere: the layout, the registration, the refusals ------------------------------------------

def test_layout_pads_rows_to_a_power_of_two_and_counts_stages():
    assert [layout.block_size(n) for n in (3, 16, 17, 401, 512, 513)] == [16, 16, 32, 512, 512, 1024]
    assert layout.stages(401) == 9  # 2**9 = 512 >= 401: the reach of a row spans the block
    assert layout.warps(21) == 1 and layout.warps(401) == 16 and layout.warps(layout.MAX_NX) == 16
    assert layout.scratch_elements(401) == 9 * 512 + layout.SCALARS


def test_the_kernel_is_an_implementation_of_each_hjb_solver():
    assert "torch:fused" in HJB_FDM.implementations
    assert "torch:hjb_fused" in FIXED_POINT.implementations and "torch:hjb_fused" in COMMON_NOISE.implementations


def test_too_long_a_row_is_refused_before_triton_or_cuda_is_asked():
    problem = HJBProblem(Nx=layout.MAX_NX + 1, Nt=2)
    reason = HJB_FDM.supports(problem, "torch:fused")
    assert reason == f"Nx={layout.MAX_NX + 1} exceeds {layout.MAX_NX}, the longest row one Triton program holds " \
                     "in registers"
    assert HJB_FDM.supports(problem, "numba") == ""


def test_without_cuda_the_kernel_says_why():
    torch = pytest.importorskip("torch")
    from plugins.mfg.hjb.torch_kernel import fused_unsupported, solve_torch

    problem = HJBProblem(Nx=21, Nt=4)
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    assert fused_unsupported(problem) in ("Triton is not installed", "the Triton HJB kernel needs a CUDA device")
    with pytest.raises(ValueError, match=r"^the Triton HJB cannot run this problem: "):
        solve_torch(problem, device=torch.device("cpu"), fused=True)


def test_memory_estimate_counts_the_scratch_and_the_grids():
    problem = HJBProblem(Nx=401, Nt=200)
    grid = 8 * 201 * 401
    estimate = HJB_FDM.memory(problem, "torch:fused")
    assert estimate >= 5 * grid + 8 * layout.scratch_elements(401)
    mfg = MFGProblem(Nx=401, Nt=200)
    assert FIXED_POINT.memory(mfg, "torch:hjb_fused") - FIXED_POINT.memory(mfg, "torch:hjb_host") == pytest.approx(
        estimate - HJB_FDM.memory(problem, "numba"))


# -- the kernel in Triton's interpreter, on the CPU ----------------------------------------------------------
#
# Triton decides at its own import whether its library functions (tl.max, tl.sum) are interpreted, so the
# interpreter needs TRITON_INTERPRET=1 before anything in the process imports Triton: the cases run in one
# child process, which sends back each case's (U, newton_iterations, converged).

INTERPRET = """
import pickle, sys, torch
from plugins.mfg.hjb.triton_kernel import sweep_fused
cases = pickle.load(open(sys.argv[1], "rb"))
outputs = {name: tuple(t.numpy() for t in sweep_fused(problem, torch.as_tensor(sources)))
           for name, (problem, sources) in cases.items()}
pickle.dump(outputs, open(sys.argv[2], "wb"))
"""


def interpreted_cases() -> dict[str, tuple[HJBProblem, list[HJBProblem]]]:
    """name -> (the batch's shared problem, one problem per instance)."""
    cases = {}
    for preset in PRESETS:
        problem = HJBProblem(preset=preset, Nx=21, Nt=6)
        cases[preset] = (problem, [problem])
    for preset in ("towel_beach", "crowd"):
        base = HJBProblem(preset=preset, Nx=16, Nt=5)  # 16: a row that fills its block, no padding
        V, M = varied_batch(base, 3)
        cases[f"{preset} batch"] = (base, [instance(base, V[i], M[i]) for i in range(3)])
    capped = HJBProblem(preset="towel_beach", Nx=21, Nt=3, newton_max=1)
    cases["capped"] = (capped, [capped])
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """Every interpreted case's problems and kernel outputs."""
    import pickle
    import subprocess
    import sys

    pytest.importorskip("torch")
    pytest.importorskip("triton")
    folder = tmp_path_factory.mktemp("interpreted")
    cases = interpreted_cases()
    inputs = {name: (base, np.stack([step_source(p) for p in problems])) for name, (base, problems) in cases.items()}
    (folder / "in.pkl").write_bytes(pickle.dumps(inputs))
    root = KERNEL.parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(root), os.environ.get(
        "PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", INTERPRET, str(folder / "in.pkl"), str(folder / "out.pkl")], cwd=root,
                   env=env, check=True, timeout=300)
    outputs = pickle.loads((folder / "out.pkl").read_bytes())
    return {name: (cases[name][1], outputs[name]) for name in cases}


@pytest.mark.parametrize("preset", PRESETS)
def test_interpreted_kernel_matches_numpy(interpreted, preset):
    (problem,), (U, iterations, converged) = interpreted[preset]
    assert_matches(solve_numpy(problem), U[0], iterations[0], converged[0])


@pytest.mark.parametrize("preset", ["towel_beach", "crowd"])
def test_interpreted_batch_converges_per_instance(interpreted, preset):
    problems, (U, iterations, converged) = interpreted[f"{preset} batch"]
    counts = set()
    for i, p in enumerate(problems):
        reference = solve_numpy(p)
        assert_matches(reference, U[i], iterations[i], converged[i])
        counts.add(tuple(reference["newton_iterations"]))
    assert len(counts) > 1  # the instances did stop after different iteration counts


def test_interpreted_kernel_reports_a_capped_newton(interpreted):
    (problem,), (U, iterations, converged) = interpreted["capped"]
    assert_matches(solve_numpy(problem), U[0], iterations[0], converged[0])
    assert not converged.any()


# -- on the GPU ------------------------------------------------------------------------------------------

def host(outputs: dict) -> dict:
    return {k: (v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v)) for k, v in outputs.items()}


@pytest.mark.gpu
def test_the_kernel_runs_here():
    from plugins.mfg.hjb.torch_kernel import fused_unsupported

    assert fused_unsupported(HJBProblem(Nx=401, Nt=10)) == ""


@pytest.mark.gpu
@pytest.mark.parametrize("nx", [41, 64, 401])
@pytest.mark.parametrize("preset", PRESETS)
def test_gpu_kernel_matches_numpy(preset, nx):
    problem = HJBProblem(preset=preset, Nx=nx, Nt=30)
    out = host(HJB_FDM.implementations["torch:fused"](problem))  # through the spec's lazy binding
    assert_matches(solve_numpy(problem), out["U"], out["newton_iterations"], out["converged"])
    assert out["converged"].all()


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_gpu_batch_converges_per_instance(preset):
    from plugins.mfg.hjb.torch_kernel import sweep_torch_batch

    base = HJBProblem(preset=preset, Nx=401, Nt=200, newton_tol=1e-12)
    V, M = varied_batch(base, 64)
    U, iterations, converged = (t.cpu().numpy() for t in sweep_torch_batch(base, V, M, fused=True))
    counts, apart = set(), 0
    for i in range(64):
        reference = solve_numba(instance(base, V[i], M[i]))
        apart += assert_matches(reference, U[i], iterations[i], converged[i], borderline=True)
        counts.add(int(reference["newton_iterations"].sum()))
    assert len(counts) > 1
    assert apart <= 0.001 * iterations.size, apart


@pytest.mark.gpu
def test_gpu_kernel_reports_a_capped_newton():
    problem = HJBProblem(preset="towel_beach", Nx=101, Nt=10, newton_max=2)
    out = host(HJB_FDM.implementations["torch:fused"](problem))
    assert_matches(solve_numpy(problem), out["U"], out["newton_iterations"], out["converged"])


@pytest.mark.gpu
def test_gpu_memory_estimate_covers_the_device_peak():
    import torch

    problem = HJBProblem(preset="lq", Nx=801, Nt=400)
    HJB_FDM.implementations["torch:fused"](problem)  # compiles outside the measured run
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    host(HJB_FDM.implementations["torch:fused"](problem))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= HJB_FDM.memory(problem, "torch:fused"), (peak, HJB_FDM.memory(problem, "torch:fused"))


@pytest.mark.gpu
def test_common_noise_with_the_kernel_agrees_with_the_host_hjb():
    from plugins.mfg.common_noise import solve_torch

    cn = CommonNoiseProblem(preset="lq", K=4, N=50_000, Nt=20)
    on_host = solve_torch(cn, hjb_device=False)
    fused = COMMON_NOISE.implementations["torch:hjb_fused"](cn)
    np.testing.assert_array_equal(fused["iterations"], on_host["iterations"])
    assert np.sum(np.abs(on_host["M_mean"][-1] - fused["M_mean"][-1]) * cn.weights()) < 1e-6
