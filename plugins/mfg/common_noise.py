"""Common noise: K conditional MFG solves along Ornstein-Uhlenbeck paths.

Each path ``theta_k(t)`` (``d theta = -kappa theta dt + noise dW``,
``theta(0) = 0``, sampled exactly at the time steps) shifts the potential,
``V_k(t, x) = V(x - theta_k(t))``, and the conditional MFG along it is solved
by the damped fixed point. Path k draws from the k-th child of
``SeedSequence(seed)``, so the paths, and therefore the answer, are the same
on one worker or sixteen, in path order.

The summary: mean, standard deviation and quantiles of U and M over paths,
and the Monte Carlo standard error of the mean, ``std / sqrt(K)``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping

import numpy as np

from core import tasks
from core.backends import numba_threads
from plugins.mfg.coupling import STEPS, picard, picard_batch, picard_batch_device
from plugins.mfg.fp import layout
from plugins.mfg.fp import torch_kernel as fp_torch
from plugins.mfg.hjb import torch_kernel as hjb_torch
from plugins.mfg.problem import PRESETS, CommonNoiseProblem, FPProblem, HJBProblem, MFGProblem


def ou_path(problem: CommonNoiseProblem, seed: np.random.SeedSequence | None) -> np.ndarray:
    """theta at every time step, by the exact OU transition (Brownian when kappa = 0)."""
    rng = np.random.default_rng(seed)
    dt, kappa = problem.dt, problem.kappa
    decay = math.exp(-kappa * dt)
    spread = problem.noise * (math.sqrt((1 - decay**2) / (2 * kappa)) if kappa > 0 else math.sqrt(dt))
    theta = np.zeros(problem.Nt + 1)
    for n in range(problem.Nt):
        theta[n + 1] = theta[n] * decay + spread * rng.standard_normal()
    return theta


def shifted_potential(problem: MFGProblem, theta: np.ndarray) -> np.ndarray:
    """V(x - theta(t)) on the space-time grid: wrapped when periodic, clamped at walls.

    ``theta`` may carry leading path axes, (..., Nt+1): one ``np.interp``
    call then serves every path (interpolation is pointwise, so the values
    are those of one call per time step), which a batch of a thousand paths
    needs to stay off the clock's critical path.
    """
    x = problem.x
    points = x - np.asarray(theta)[..., None]
    if problem.boundary == "periodic":
        return np.interp(points.ravel(), x, problem.V, period=problem.length).reshape(points.shape)
    return np.interp(np.clip(points, problem.xmin, problem.xmax).ravel(), x, problem.V).reshape(points.shape)


def conditional_problem(problem: CommonNoiseProblem) -> MFGProblem:
    fields = {name: getattr(problem, name) for name in MFGProblem.__dataclass_fields__}
    return MFGProblem(**fields)


def path_task(task: tuple, shared: Mapping[str, np.ndarray], seed) -> dict[str, np.ndarray]:
    """One path: sample theta, solve the conditional MFG. Runs in workers too."""
    started = time.perf_counter()
    problem, steps = task
    theta = ou_path(problem, seed)
    hjb, fp = STEPS[steps]()
    out = picard(conditional_problem(problem), hjb, fp, V_t=shifted_potential(problem, theta))
    # the threads its last particle step ran on: a path's lent cores only grow (idle workers' cores are
    # lent once no path waits), and each step takes at most those its particles can use
    threads = numba_threads.threads_for(layout.threads_worth(problem.N)) if steps == "numba" else 1
    return {"U": out["U"], "M": out["M"], "converged": out["converged"], "iterations": out["iterations"],
            "theta": theta, "seconds": time.perf_counter() - started, "threads": threads}


def summarize(problem: CommonNoiseProblem, paths: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    U = np.stack([p["U"] for p in paths])
    M = np.stack([p["M"] for p in paths])
    k = len(paths)
    q = np.asarray(problem.quantiles)
    return {
        "U_mean": U.mean(axis=0), "U_std": U.std(axis=0, ddof=1) if k > 1 else np.zeros_like(U[0]),
        "M_mean": M.mean(axis=0), "M_std": M.std(axis=0, ddof=1) if k > 1 else np.zeros_like(M[0]),
        "U_quantiles": np.quantile(U, q, axis=0), "M_quantiles": np.quantile(M, q, axis=0),
        "U_mc_error": (U.std(axis=0, ddof=1) / math.sqrt(k)) if k > 1 else np.zeros_like(U[0]),
        "M_mc_error": (M.std(axis=0, ddof=1) / math.sqrt(k)) if k > 1 else np.zeros_like(M[0]),
        "quantile_levels": q, "theta": np.stack([p["theta"] for p in paths]),
        "converged": np.array([bool(p["converged"]) for p in paths]),
        "iterations": np.array([int(p["iterations"]) for p in paths]),
        "path_seconds": np.array([float(p["seconds"]) for p in paths]),
        "path_threads": np.array([int(p["threads"]) for p in paths]),
    }


def solve_serial(problem: CommonNoiseProblem, *, steps: str) -> dict[str, np.ndarray]:
    """Every path in this process, one after the other, with the HJB and FP steps of ``steps``."""
    jobs = [(problem, steps)] * problem.K
    return summarize(problem, tasks.run_serially(path_task, jobs, seed=problem.seed))


def solve_parallel(problem: CommonNoiseProblem, *, backend: str) -> dict[str, np.ndarray]:
    """The paths as independent tasks on a parallel backend (a process pool, a cluster).

    Each path runs the numba steps: within a worker the backend, not numba's
    threads, is the parallelism.
    """
    jobs = [(problem, "numba")] * problem.K
    labels = [f"path {k}" for k in range(problem.K)]
    return summarize(problem, tasks.map_tasks(path_task, jobs, seed=problem.seed, labels=labels, backend=backend,
                                              warm_up=warm_path_kernels))


def warm_path_kernels() -> None:
    """Load a path's Numba kernels in a worker (from the on-disk cache, or compiled): a tiny path per preset."""
    for preset in PRESETS:
        tiny = CommonNoiseProblem(preset=preset, K=1, N=100, Nx=8, Nt=4, max_iter=1)
        path_task((tiny, "numba"), {}, np.random.SeedSequence(0))


def solve_torch(problem: CommonNoiseProblem, *, hjb_device: bool, devices: int | None = None,
                fused_hjb: bool = False, resident: bool = False) -> dict[str, np.ndarray]:
    """All K paths as batches on the GPUs: one FP launch per Picard iteration for every path of a batch.

    The HJB sweeps run batched on the device (``hjb_device``; as torch
    operations, or as the Triton kernel with ``fused_hjb``) or path by path
    with numba on the host; which is faster depends on the machine and the
    size, so each is an implementation the cost model measures (see
    ``coupling.torch_steps``). U and M cross to the host once per iteration
    for the damping and the convergence test (K x (Nt+1) x Nx numbers, never
    particles), except with ``resident``: the Triton HJB and FP kernels and
    the whole fixed point on the device (``coupling.picard_batch_device``),
    U and M copied out once, at the end (``torch:resident``).

    With several GPUs (every visible one, at most ``devices`` or
    ``CROSSOVER_GPUS``) the paths split into contiguous slices, one per GPU,
    each solved in that GPU's own process (:mod:`core.backends.torch_devices`),
    and gather in path order. On each GPU, paths that do not fit its free
    memory together run in consecutive sub-batches that do. Path k draws
    from the k-th child of ``SeedSequence(seed)`` wherever it runs, and no
    path's fixed point depends on which others share its batch (each stops
    on its own test; the particles' streams do not depend on the path's
    place in the batch), so the answer equals one GPU's up to the order of
    the kernels' float64 atomic adds.
    """
    from core.backends import torch_devices, torch_gpu

    slices = torch_devices.split_batch(problem.K, max(torch_gpu.gpu_count(devices), 1))
    if len(slices) == 1:
        paths = solve_paths((problem, hjb_device, slices[0], fused_hjb, resident))
    else:
        parts = torch_devices.map_devices(solve_paths, [(problem, hjb_device, s, fused_hjb, resident) for s in slices],
                                          torch_devices.visible_devices(len(slices)))
        paths = [path for part in parts for path in part]
    return summarize(problem, paths)


def device_bytes_per_path(problem: CommonNoiseProblem, hjb_device: bool, fused_hjb: bool = False,
                          resident: bool = False) -> float:
    """GPU memory one path of a batch takes (the batch's peak is linear in its paths; see plugins.mfg.work)."""
    from plugins.mfg import work

    return work.fixed_point_memory(problem, torch_variant(hjb_device, fused_hjb, resident))


def torch_variant(hjb_device: bool, fused_hjb: bool = False, resident: bool = False) -> str:
    """The implementation key of :func:`solve_torch`'s flags."""
    if resident:
        return "torch:resident"
    return ("torch:hjb_fused" if fused_hjb else "torch:hjb_device") if hjb_device else "torch:hjb_host"


def solve_paths(part: tuple) -> list[dict[str, np.ndarray]]:
    """Paths ``part[2]`` of the problem on this process's GPU, in sub-batches that fit its free memory.

    ``part`` is ``(problem, hjb_device, paths)``, with ``fused_hjb`` and
    ``resident`` as optional fourth and fifth items. Runs in a GPU's own
    process too (a module-level function of one argument).
    """
    from core.backends import torch_devices, torch_gpu

    problem, hjb_device, paths = part[:3]
    fused_hjb = len(part) > 3 and bool(part[3])
    resident = len(part) > 4 and bool(part[4])
    free = torch_gpu.free_for_batches()
    per_path = device_bytes_per_path(problem, hjb_device, fused_hjb, resident)
    batches = torch_devices.sub_batches(paths, per_path, free)
    solve = solve_batch_resident if resident else functools.partial(solve_batch, fused_hjb=fused_hjb)
    return [path for batch in batches for path in solve(problem, hjb_device, batch)]


def solve_batch(problem: CommonNoiseProblem, hjb_device: bool, paths: range, *,
                fused_hjb: bool = False) -> list[dict[str, np.ndarray]]:
    """Paths ``paths`` (indices into the K) as one batch on this process's GPU.

    The paths run together, so each is given an equal share of the batch's
    wall time: a batch's paths' seconds add up to the time the GPU spent on
    them, as a worker's paths' seconds add up to the worker's time.
    """
    import torch

    started = time.perf_counter()

    def hjb_batch(template: HJBProblem, v: np.ndarray, m: np.ndarray):
        if hjb_device:
            return hjb_torch.solve_torch_batch(template, v, m, fused=fused_hjb)
        from plugins.mfg.hjb.numba_kernel import solve_numba as hjb_numba  # numba compiles on import

        fields = template.model_fields()
        return torch.as_tensor(np.stack([hjb_numba(HJBProblem(**fields, M=mk, V_t=vk))["U"] for vk, mk in zip(v, m)]))

    thetas = batch_paths(problem, paths)
    V = shifted_potential(problem, thetas)
    conditional = conditional_problem(problem)
    hjb_template = HJBProblem(**conditional.model_fields())
    fp_template = FPProblem(**conditional.model_fields())
    fused = not fp_torch.fused_unsupported(fp_template)  # the all-steps kernel wherever the KDE allows it
    out = picard_batch(conditional, lambda v, m: hjb_batch(hjb_template, v, m).cpu().numpy(),
                       lambda u: fp_torch.solve_torch_batch(fp_template, u, fused=fused).cpu().numpy(), V)
    return batch_results(out, thetas, started)


def batch_paths(problem: CommonNoiseProblem, paths: range) -> np.ndarray:
    """theta of paths ``paths`` (indices into the K), (len(paths), Nt+1): path k from the k-th child seed."""
    seeds = tasks.task_seeds(problem.seed, problem.K)
    return np.stack([ou_path(problem, seeds[k]) for k in paths])


def batch_results(out: Mapping[str, np.ndarray], thetas: np.ndarray, started: float) -> list[dict[str, np.ndarray]]:
    """One result per path of a batch, each given an equal share of the batch's wall time since ``started``."""
    share = (time.perf_counter() - started) / len(thetas)
    return [{"U": out["U"][i], "M": out["M"][i], "converged": out["converged"][i],
             "iterations": out["iterations"][i], "theta": thetas[i], "seconds": share, "threads": 1}
            for i in range(len(thetas))]


def solve_batch_resident(problem: CommonNoiseProblem, hjb_device: bool, paths: range) -> list[dict[str, np.ndarray]]:
    """Paths ``paths`` as one batch whose fixed point never leaves the GPU (``torch:resident``).

    The potentials go to the device once; the Triton HJB and FP kernels
    then read and write device tensors only, the damping and the stop test
    run there (``coupling.picard_batch_device``), and U and M come back
    once, at the end. ``hjb_device`` is ignored (the HJB is on the device).
    """
    import torch

    from core.backends.torch_gpu import device as gpu_device

    started = time.perf_counter()
    thetas = batch_paths(problem, paths)
    V = torch.as_tensor(shifted_potential(problem, thetas), device=gpu_device())
    conditional = conditional_problem(problem)
    hjb_template = HJBProblem(**conditional.model_fields())
    fp_template = FPProblem(**conditional.model_fields())
    out = picard_batch_device(
        conditional,
        lambda v, m: hjb_torch.sweep_torch_batch(hjb_template, v, m, v.device, fused=True)[0],
        lambda u: fp_torch.solve_torch_batch(fp_template, u, fused=True), V)
    host = {"U": out["U"].cpu().numpy(), "M": out["M"].cpu().numpy(), "converged": out["converged"],
            "iterations": out["iterations"]}
    return batch_results(host, thetas, started)
