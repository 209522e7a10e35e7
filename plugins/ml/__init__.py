"""The ML plugin: gradient-descent linear regression and the DynamicDotGAT model, on CPU and GPU.

``LinearRegressionGD`` is importable from here; the DotGAT model needs
torch and is imported from :mod:`plugins.ml.dotgat` where it is used, so
loading the plugin costs no torch import.
"""

from __future__ import annotations

from core import SolverSpec, hookimpl
from core.backend import Backend
from plugins.ml import specs
from plugins.ml.estimator import LinearRegressionGD, NotFittedError
from plugins.ml.linreg_problem import LinRegProblem, preset, preset_problem

__version__ = "0.1.0"
__all__ = ["LinRegProblem", "LinearRegressionGD", "NotFittedError", "preset", "preset_problem"]


@hookimpl
def crossover_solvers() -> list[SolverSpec]:
    return specs.all_specs()


@hookimpl
def crossover_backends() -> list[Backend]:
    from plugins.ml.torch_cpu import BACKEND

    return [BACKEND]
