"""The SolverSpec of each ML solver: implementations, size spaces, features, memory.

Every implementation is a :class:`core.solver.lazy` binding, so listing
the solvers imports neither numba nor torch. The torch variants are
measured and chosen by the cost model like any backend; nothing here
picks one by size.
"""

from __future__ import annotations

import numpy as np

from core.solver import SizeSpace, SolverSpec, lazy
from plugins.ml.linreg_problem import LinRegProblem

# -- ml.linreg ---------------------------------------------------------------------------


def linreg_features(problem: LinRegProblem) -> dict[str, float]:
    """``sample_epochs``: the passes' work; ``epochs``: per-epoch overhead (launches, a fork-join);
    ``samples``: per-solve work on the data (the float32 copy and upload of the torch variants)."""
    return {"sample_epochs": float(problem.n_samples) * problem.n_epochs, "epochs": float(problem.n_epochs),
            "samples": float(problem.n_samples)}


def linreg_space(quick: bool) -> SizeSpace:
    # quick: the largest problem (500k x 100 epochs) takes about 0.5 s on numpy on a 2-core VM
    if quick:
        return SizeSpace(ranges={"n_samples": (1_000, 500_000), "n_epochs": (5, 100)})
    return SizeSpace(ranges={"n_samples": (1_000, 8_000_000), "n_epochs": (5, 400)})


def linreg_memory(problem: LinRegProblem, implementation: str) -> float:
    n = float(problem.n_samples)
    if implementation == "numpy":
        return 8.0 * n * 5  # x, y and three float64 temporaries of an epoch
    if implementation == "numba":
        return 8.0 * n * 2
    if implementation == "torch:eager":
        return 4.0 * n * 2 + 8.0 * n * 6  # float32 data, float64 temporaries of the op-by-op epoch
    return 4.0 * n * 2 + 8.0 * n * 2  # fused: the data, and the upload's staging


def linreg_supports(problem: LinRegProblem, implementation: str) -> str:
    if implementation.startswith("torch:"):
        from plugins.ml.linreg_torch import unsupported

        return unsupported(problem, implementation)
    return ""


def linreg_compile_key(problem: LinRegProblem, implementation: str):
    # the compiled epoch is dynamic (one compile a process); a CUDA graph is captured per (size, epochs)
    return (problem.n_samples, problem.n_epochs) if implementation == "torch:graph" else ()


def linreg_summary(problem: LinRegProblem, outputs) -> str:
    losses = np.asarray(outputs["loss_curve"])
    return (f"{problem.n_samples:,} samples x {problem.n_epochs} epochs: w={float(outputs['coef']):.6f}, "
            f"b={float(outputs['intercept']):.6f}, MSE {losses[0]:.4g} -> {losses[-1]:.4g}")


LINREG = SolverSpec(
    name="ml.linreg",
    problem_type=LinRegProblem,
    implementations={
        "numpy": lazy("plugins.ml.linreg_numpy", "solve_numpy"),
        "numba": lazy("plugins.ml.linreg_numba", "solve_numba"),
        "torch:eager": lazy("plugins.ml.linreg_torch", "solve_torch", variant="eager"),
        "torch:compile": lazy("plugins.ml.linreg_torch", "solve_torch", variant="compile"),
        "torch:graph": lazy("plugins.ml.linreg_torch", "solve_torch", variant="graph"),
    },
    features=linreg_features,
    size_axis="n_samples",
    space=linreg_space,
    supports=linreg_supports,
    memory=linreg_memory,
    compile_key=linreg_compile_key,
    default_problem=LinRegProblem,
    summarize=linreg_summary,
    description="linear regression by full-batch gradient descent on the MSE (one pass per epoch)",
)


def all_specs() -> list[SolverSpec]:
    return [LINREG]
