"""Benchmarks of the MFG plugin: the FP acceptance problem and the coupled solvers.

The FP problem is the issue's: N = 50,000 particles, Nx = 51, Nt = 50
(towel_beach). ``track_fp_speedup_vs_scipy`` is the ratio of the numpy +
scipy.stats.gaussian_kde reference to the automatically chosen backend,
both timed in the same process; the acceptance bar is 50x.
"""

from __future__ import annotations

import numpy as np

import core
from core.costmodel.calibrate import median_seconds
from core.solver import backend_of
from plugins.mfg.problem import FPProblem, HJBProblem, MFGProblem

# every implementation key: variants of one device are timed side by side, as calibration sees them
FP_IMPLEMENTATIONS = ["numpy", "numba:fused", "numba:steps", "torch:fused", "torch:eager"]
FIXED_POINT_IMPLEMENTATIONS = ["numpy", "numba", "torch:hjb_host", "torch:hjb_device", "torch:hjb_fused"]


def _skip_unavailable(implementation: str) -> None:
    status = core.availability(backend_of(implementation))
    if not status.available:
        raise NotImplementedError(f"backend {backend_of(implementation)!r} is unavailable here: {status.reason}")


class FPSolve:
    """Steady-state seconds of the FP acceptance problem on each implementation (binned KDE)."""

    params = (FP_IMPLEMENTATIONS,)
    param_names = ("implementation",)
    timeout = 300

    def setup(self, implementation: str) -> None:
        _skip_unavailable(implementation)
        self.problem = FPProblem(N=50_000, Nx=51, Nt=50)
        core.solve(self.problem, backend=implementation)  # warm-up: JIT, CUDA context, Triton compile

    def time_fp_solve(self, implementation: str) -> None:
        core.solve(self.problem, backend=implementation)


class FPSpeedup:
    """How many times faster auto-selection is than the original numpy/scipy pipeline."""

    timeout = 900

    def track_fp_speedup_vs_scipy(self) -> float:
        problem = FPProblem(N=50_000, Nx=51, Nt=50)
        reference = FPProblem(N=50_000, Nx=51, Nt=50, kde="direct")
        auto = median_seconds(lambda: core.solve(problem, expected_calls=float("inf")))
        scipy_seconds = median_seconds(lambda: core.solve(reference, backend="numpy"), repeats=1)
        return scipy_seconds / auto

    track_fp_speedup_vs_scipy.unit = "x"


class HJBBatch:
    """Seconds of K backward HJB sweeps at Nx = 401, Nt = 200 (towel_beach, periodic).

    ``torch:fused`` solves the K instances in one Triton launch, inputs and U
    on the device; ``numba`` one instance after another on one core (there is
    no batched numba HJB). The instances' potentials and densities are rolled
    and scaled copies of the preset's. The acceptance bar: the kernel within
    2x of numba at K = 1, faster from K = 64. docs/scripts/hjb_gpu_bench.py
    gives the full table.
    """

    params = (["numba", "torch:fused"], [1, 64])
    param_names = ("implementation", "K")
    timeout = 300

    def setup(self, implementation: str, k: int) -> None:
        from plugins.mfg.specs import HJB_FDM

        _skip_unavailable(implementation)
        base = HJBProblem(preset="towel_beach", Nx=401, Nt=200)
        if HJB_FDM.supports(base, implementation):
            raise NotImplementedError(HJB_FDM.supports(base, implementation))
        shifts = [(7 * i) % base.Nx for i in range(k)]
        V = [np.roll(base.potential(), s, axis=1) for s in shifts]
        M = [np.roll(base.M, -s, axis=1) * (1 + 0.1 * i) for i, s in enumerate(shifts)]
        if implementation == "numba":
            from plugins.mfg.hjb.numba_kernel import solve_numba

            problems = [HJBProblem(**base.model_fields(), V_t=v, M=m) for v, m in zip(V, M)]
            self.run = lambda: [solve_numba(p) for p in problems]
        else:
            import torch

            from plugins.mfg.hjb.torch_kernel import sweep_torch_batch

            v, m = (torch.as_tensor(np.stack(a), device="cuda") for a in (V, M))
            self.run = lambda: (sweep_torch_batch(base, v, m, fused=True), torch.cuda.synchronize())
        self.run()  # warm-up: JIT, CUDA context, Triton compile

    def time_hjb_batch(self, implementation: str, k: int) -> None:
        self.run()


class FixedPoint:
    """Seconds of the coupled MFG on the lq preset (20,000 particles)."""

    params = (FIXED_POINT_IMPLEMENTATIONS,)
    param_names = ("implementation",)
    timeout = 300

    def setup(self, implementation: str) -> None:
        _skip_unavailable(implementation)
        self.problem = MFGProblem(preset="lq", N=20_000, Nt=30)
        core.solve(self.problem, backend=implementation)

    def time_fixed_point(self, implementation: str) -> None:
        core.solve(self.problem, backend=implementation)


class CommonNoiseScaling:
    """Parallel efficiency of the process backend on common noise, T(1 worker) / (W T(W workers)).

    W is this machine's worker count and K = 4 W paths (the issue's K = 64
    on 16 cores), N = 20,000, Nx = Nt = 51. Each pool is warmed up first, so
    that no worker loads its Numba kernels on the clock. The acceptance bar
    is 0.85 on the GPU host's 16 cores; docs/scripts/common_noise_scaling.py
    gives the same figure with repeats and its diagnosis.
    """

    timeout = 900

    def track_parallel_efficiency(self) -> float:
        import os
        import time

        from core.tasks import parallelism
        from plugins.mfg.common_noise import solve_parallel
        from plugins.mfg.problem import CommonNoiseProblem

        workers = parallelism("process")
        problem = CommonNoiseProblem(preset="lq", K=4 * workers, N=20_000, Nx=51, Nt=51)
        warm = CommonNoiseProblem(preset="lq", K=8 * workers, N=500, Nx=51, Nt=5)
        seconds = {}
        saved = os.environ.get("CROSSOVER_WORKERS")
        try:
            for count in (1, workers):
                os.environ["CROSSOVER_WORKERS"] = str(count)
                solve_parallel(warm, backend="process")
                started = time.perf_counter()
                solve_parallel(problem, backend="process")
                seconds[count] = time.perf_counter() - started
        finally:
            if saved is None:
                os.environ.pop("CROSSOVER_WORKERS", None)
            else:
                os.environ["CROSSOVER_WORKERS"] = saved
        return seconds[1] / (workers * seconds[workers])

    track_parallel_efficiency.unit = "efficiency"


class FPRate:
    """Particle-steps per second of the FP solve at the issue's GPU size (N = 1e7, Nx = 101, Nt = 100).

    The bar is 6e10 on one H200 (``docs/scripts/fp_throughput.py`` gives the
    same figure with repeats and checks that two runs give the same bits).
    Off a GPU only the Numba variant runs, at a tenth of the particles.
    """

    params = (["numba:fused", "torch:fused"],)
    param_names = ("implementation",)
    timeout = 600

    def setup(self, implementation: str) -> None:
        _skip_unavailable(implementation)
        n = 10_000_000 if backend_of(implementation) == "torch" else 1_000_000
        self.problem = FPProblem(N=n, Nx=101, Nt=100)
        core.solve(self.problem, backend=implementation)  # warm-up: JIT, CUDA context, Triton compile

    def track_particle_steps_per_second(self, implementation: str) -> float:
        seconds = median_seconds(lambda: core.solve(self.problem, backend=implementation))
        return self.problem.N * self.problem.Nt / seconds

    track_particle_steps_per_second.unit = "particle-steps/s"


class CommonNoiseResident:
    """Seconds of ``mfg.common_noise`` at K paths: every path's fixed point on one GPU against the process pool.

    The issue's comparison: ``torch:resident`` (U and M copied to the host
    once) against ``process`` (each path the Numba fixed point, as tasks on
    this machine's workers), lq, N = 5,000, Nx = 51, Nt = 50. The bar is 10x
    at K = 1,024 on the 16-core GPU host; ``docs/scripts/common_noise_gpu_bench.py``
    sweeps K and reports the crossover.
    """

    params = (["torch:resident", "process"], [64, 1024])
    param_names = ("implementation", "K")
    timeout = 900

    def setup(self, implementation: str, k: int) -> None:
        from plugins.mfg.problem import CommonNoiseProblem
        from plugins.mfg.specs import COMMON_NOISE

        _skip_unavailable(implementation)
        self.problem = CommonNoiseProblem(preset="lq", K=k, N=5_000, Nx=51, Nt=50)
        why = COMMON_NOISE.supports(self.problem, implementation)
        if why:
            raise NotImplementedError(why)
        core.solve(CommonNoiseProblem(preset="lq", K=16, N=5_000, Nx=51, Nt=50), backend=implementation)

    def time_common_noise(self, implementation: str, k: int) -> None:
        core.solve(self.problem, backend=implementation)
