"""Benchmarks of the ML plugin: the linear-regression preset and the DotGAT training step.

``LinRegPreset`` times the issue's preset (4M training points x 200
epochs) on each ``ml.linreg`` implementation; ``track_numba_over_numpy``
is the ratio the issue asks for on a CPU. ``DotGATStep`` times a short
training run of the small default model on each ``ml.dotgat``
implementation (CPU torch here, GPU variants where a GPU runs). The GPU
side-by-side comparisons (the nn.Linear idiom, the bandwidth floor,
batch 8-64 in three precisions) are docs/scripts/ml_linreg_bench.py and
ml_dotgat_bench.py.
"""

from __future__ import annotations

import core
from core.costmodel.calibrate import median_seconds
from core.solver import backend_of
from plugins.ml.dotgat.problem import DotGATProblem
from plugins.ml.linreg_problem import preset_problem

LINREG_IMPLEMENTATIONS = ["numpy", "numba:threads", "numba:serial", "torch:eager", "torch:compile", "torch:graph"]
DOTGAT_IMPLEMENTATIONS = ["torch_cpu:naive", "torch_cpu:optimized", "torch:naive", "torch:optimized",
                          "torch:naive_compiled", "torch:optimized_compiled"]


def _skip_unavailable(implementation: str) -> None:
    status = core.availability(backend_of(implementation))
    if not status.available:
        raise NotImplementedError(f"backend {backend_of(implementation)!r} is unavailable here: {status.reason}")


class LinRegPreset:
    """Seconds of the preset on each implementation, data upload included (as core.solve runs it)."""

    params = (LINREG_IMPLEMENTATIONS,)
    param_names = ("implementation",)
    timeout = 600

    def setup(self, implementation: str) -> None:
        _skip_unavailable(implementation)
        self.problem = preset_problem()
        core.solve(self.problem, backend=implementation, solver="ml.linreg")  # JIT, compile, graph capture

    def time_preset(self, implementation: str) -> None:
        core.solve(self.problem, backend=implementation, solver="ml.linreg")


class LinRegRatio:
    timeout = 600

    def track_numba_over_numpy(self) -> float:
        problem = preset_problem()
        numpy_s = median_seconds(lambda: core.solve(problem, backend="numpy", solver="ml.linreg"), repeats=1)
        numba_s = median_seconds(lambda: core.solve(problem, backend="numba:threads", solver="ml.linreg"))
        return numpy_s / numba_s

    track_numba_over_numpy.unit = "x"


class DotGATStep:
    """Seconds of 10 training steps of the small default model (batch 32) on each implementation."""

    params = (DOTGAT_IMPLEMENTATIONS,)
    param_names = ("implementation",)
    timeout = 600

    def setup(self, implementation: str) -> None:
        _skip_unavailable(implementation)
        self.problem = DotGATProblem(n_steps=10, n_train=256, n_val=32)
        core.solve(self.problem, backend=implementation, solver="ml.dotgat")  # compile, caches

    def time_ten_steps(self, implementation: str) -> None:
        core.solve(self.problem, backend=implementation, solver="ml.dotgat")
