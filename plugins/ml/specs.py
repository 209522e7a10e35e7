"""The SolverSpec of each ML solver: implementations, size spaces, features, memory.

Every implementation is a :class:`core.solver.lazy` binding, so listing
the solvers imports neither numba nor torch. The torch variants are
measured and chosen by the cost model like any backend; nothing here
picks one by size.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from core.backend import last_level_cache_bytes
from core.backends.numba_threads import pool_size
from core.solver import SizeSpace, SolverSpec, lazy
from plugins.ml.dotgat.problem import DotGATProblem
from plugins.ml.linreg_problem import NUMBA_BLOCK, LinRegProblem

# -- ml.linreg ---------------------------------------------------------------------------


def linreg_features(problem: LinRegProblem) -> dict[str, float]:
    """``sample_epochs``: the passes' work, samples x features x epochs (a pass reads and multiplies each
    sample's d features); ``epochs``: per-epoch overhead (launches, a fork-join); ``samples``: per-solve
    work on the data, samples x features (the float32 copy and upload of the torch variants);
    ``span_sample_epochs``: the busiest thread's share of the numba:threads pass (whole blocks of
    NUMBA_BLOCK samples, at most one thread per block), which a 1-block problem runs on one thread and a
    large one on every core: not a multiple of ``sample_epochs``, so the models need it apart.
    ``spilled_samples`` (and ``spilled_sample_epochs``, once a pass): the values a pass reads beyond the
    host's last-level cache, which come from memory at its bandwidth: a pass over 123 MB ran 3x slower per
    value than the in-cache passes the VM's models were fitted on, so without them predictions past the
    cache were 3x low (``ml.linreg_moments``).
    One feature (the default) gives the values of old, so timings stored before features existed still hold."""
    blocks = -(-problem.n_samples // NUMBA_BLOCK)
    busiest = min(problem.n_samples, -(-blocks // pool_size()) * NUMBA_BLOCK)
    width = float(problem.n_features)
    values = float(problem.n_samples) * (width + 1)  # X and y, float64, read by every pass
    spilled = max(0.0, values - last_level_cache_bytes() / 8)
    return {"sample_epochs": float(problem.n_samples) * width * problem.n_epochs, "epochs": float(problem.n_epochs),
            "samples": float(problem.n_samples) * width,
            "span_sample_epochs": float(busiest) * width * problem.n_epochs,
            "spilled_samples": spilled, "spilled_sample_epochs": spilled * problem.n_epochs}


def linreg_space(quick: bool) -> SizeSpace:
    # quick reaches 8M samples: on a GPU the op-by-op eager epoch turns from launch-bound to bandwidth-bound
    # between 0.5M and 2M, and a model fitted below 0.5M put torch:eager ahead of the graph at 2M (2.3x
    # slower there, H200); fitted up to 2M, the graph was still picked at 8M, where 16 numba threads were
    # 25-28 % faster (three H200 runs). The numpy reference skips the design's points past the sample cap.
    # n_features: one in the quick space (the problems, and so the timings, of old); the full space moves it,
    # so that `crossover evaluate` at full size also judges the choice on several features
    if quick:
        return SizeSpace(ranges={"n_samples": (1_000, 8_000_000), "n_epochs": (5, 100)}, fixed={"n_features": 1})
    return SizeSpace(ranges={"n_samples": (1_000, 32_000_000), "n_epochs": (5, 400), "n_features": (1, 8)})


def moments_space(quick: bool) -> SizeSpace:
    """linreg's space, with the quick top at 3 last-level caches' worth of data (X and y, 16 bytes a sample)
    where that is more: one pass a solve is cheap even there, and on the H200 host (a 300 MiB cache) the 8M
    top never spilled, so predictions at 16M-32M samples were 2x low ("cannot determine spilled_samples").
    The epochs' descent (ml.linreg) keeps the 8M top: 100 passes at 59M samples made its calibration and
    evaluation outlast 9 minutes there."""
    space = linreg_space(quick)
    if quick:
        top = max(space.ranges["n_samples"][1], int(3 * last_level_cache_bytes() / 16))
        space = dataclasses.replace(space, ranges={**space.ranges, "n_samples": (space.ranges["n_samples"][0], top)})
    return space


def linreg_memory(problem: LinRegProblem, implementation: str) -> float:
    n, d = float(problem.n_samples), float(problem.n_features)
    if implementation == "numpy":
        return 8.0 * n * (d + 4)  # X, y and three float64 temporaries of an epoch
    if implementation.startswith("numba"):
        return 8.0 * n * (d + 1) + (8.0 * n if d > 1 or problem.weighted else 0.0)  # and the weights
    if implementation == "torch:eager":
        return 4.0 * n * (d + 2) + 8.0 * n * (2 * d + 5)  # float32 data, float64 temporaries of the epoch
    return 4.0 * n * (d + 2) + 8.0 * n * (d + 1)  # fused: the data, and the upload's staging


def linreg_supports(problem: LinRegProblem, implementation: str) -> str:
    """The torch variants store the data in float32 and need CUDA; the graph variant fits one unweighted feature."""
    if implementation.startswith("torch:"):
        from plugins.ml.linreg_torch import unsupported

        return unsupported(problem, implementation)
    return ""


def linreg_compile_key(problem: LinRegProblem, implementation: str):
    # a CUDA graph is captured per (size, epochs). The compiled epoch is dynamic (one compile a process, 18.7 s
    # on the H200 host), yet its first call at each new size took 15-90 ms more than the next (no recompile
    # logged; docs/results/gpu-2026-11-28b): a shape's one-off, which a trial on a 7 ms problem paid unforeseen
    if implementation == "torch:graph":
        return (problem.n_samples, problem.n_epochs)
    if implementation == "torch:compile":
        return (problem.n_samples, problem.n_features)
    return ()


def linreg_summary(problem: LinRegProblem, outputs) -> str:
    losses = np.asarray(outputs["loss_curve"])
    coef = np.atleast_1d(np.asarray(outputs["coef"], dtype=np.float64))
    shown = ", ".join(f"{c:.4g}" for c in coef[:4]) + (", ..." if coef.size > 4 else "")
    w = f"w={coef[0]:.6f}" if coef.size == 1 else f"w=[{shown}]"
    features = "" if problem.n_features == 1 else f" x {problem.n_features} features"
    return (f"{problem.n_samples:,} samples{features} x {problem.n_epochs} epochs: {w}, "
            f"b={float(outputs['intercept']):.6f}, MSE {losses[0]:.4g} -> {losses[-1]:.4g}")


LINREG = SolverSpec(
    name="ml.linreg",
    problem_type=LinRegProblem,
    implementations={
        "numpy": lazy("plugins.ml.linreg_numpy", "solve_numpy"),
        "numba:threads": lazy("plugins.ml.linreg_numba", "solve_numba"),
        "numba:serial": lazy("plugins.ml.linreg_numba", "solve_numba", serial=True),
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
    version="8",  # 3: the span feature, the Triton graph epoch, the quick space to 2M; 4: to 8M; 5: the spilled
    # features (older timings lack them); 6: the torch variants convert on the device (linreg_torch.to_device);
    # 7: they upload through pinned memory (core.backends.torch_upload); 8: torch:compile's one-off per size
    # (its stored one-off was the process's compile, which a per-size key would charge at every new size)
)


LINREG_MOMENTS = SolverSpec(
    name="ml.linreg_moments",
    problem_type=LinRegProblem,
    implementations={"numpy": lazy("plugins.ml.linreg_moments", "solve_moments")},
    features=linreg_features,
    size_axis="n_samples",
    space=moments_space,
    # X and y, and the weighted copy of X
    memory=lambda problem, implementation: 8.0 * problem.n_samples * (2 * problem.n_features + 1),
    default_problem=LinRegProblem,
    summarize=linreg_summary,
    description="the same descent from five sums of one pass (the sufficient-statistics shortcut, O(1) an epoch)",
    version="2",  # 2: the spilled features
)

# -- ml.dotgat ---------------------------------------------------------------------------

DOTGAT_VARIANTS = {  # implementation key -> (model, compiled, device)
    "torch_cpu:naive": ("naive", False, "cpu"),
    "torch_cpu:optimized": ("optimized", False, "cpu"),
    "torch:naive": ("naive", False, "gpu"),
    "torch:optimized": ("optimized", False, "gpu"),
    "torch:naive_compiled": ("naive", True, "gpu"),
    "torch:optimized_compiled": ("optimized", True, "gpu"),
}


def dotgat_features(problem: DotGATProblem) -> dict[str, float]:
    """``train_flops``: forward + backward (3x forward) of every step's batch; ``steps``: per-step overhead
    (launches, the Python of the step); ``param_steps``: the optimiser's work; ``eval_flops``: the two
    validation passes."""
    forward = problem.forward_flops()
    return {"train_flops": 3.0 * forward * problem.batch * problem.n_steps, "steps": float(problem.n_steps),
            "param_steps": problem.parameters() * problem.n_steps, "eval_flops": 2.0 * forward * problem.n_val}


def dotgat_space(quick: bool) -> SizeSpace:
    """The fields a user sets that move the work: batch, steps, validation size and the model's shape.

    Each compiled variant compiles once per model shape (tens of seconds on
    a GPU; see ``dotgat_compile_key``), so the quick space draws T, A and H
    from two values each, at most 8 shapes, with the other shape fields
    (M, message_steps, heads) at their defaults; its top is the default
    shape, where a CPU step of batch 64 takes about 0.1-0.4 s on a shared
    2-core VM. The full space moves every shape field, up to the published
    model (T 50, M 25, A 20, H 128, 5 message steps). Left out: what sets
    the data or the numerics but not the work (rho, rank, y_dim, graph, lr,
    n_train, seed) and ``precision``, which changes the arithmetic's speed
    rather than its amount, so the flop features cannot price it.
    """
    if quick:
        return SizeSpace(ranges={"batch": (8, 64), "n_steps": (1, 8), "n_val": (16, 128)},
                         choices={"T": [8, 16], "A": [4, 8], "H": [16, 32]})
    return SizeSpace(ranges={"batch": (8, 64), "n_steps": (2, 50), "n_val": (32, 256), "T": (8, 64), "M": (8, 32),
                             "A": (4, 32)},
                     choices={"H": [16, 32, 64, 128], "message_steps": [1, 2, 3, 5], "heads": [2, 4, 8]})


def dotgat_memory(problem: DotGATProblem, implementation: str) -> float:
    """Parameters with gradients and AdamW's two moments, the saved activations, the attention scores, the data
    (and what making it takes), and the step schedule."""
    sequences = problem.batch * problem.T * problem.A
    activations = 4.0 * sequences * problem.H * (2 + 16 * problem.message_steps)
    scores = 4.0 * problem.batch * problem.heads * problem.A * problem.T * (problem.T + problem.A) * 3
    data = 4.0 * (problem.n_train + problem.n_val) * problem.T * (problem.M + problem.A * problem.y_dim)
    # making the data: the GP's T x T kernel and its root, and the larger split's float64 draws
    making = 16.0 * problem.T ** 2 + 8.0 * max(problem.n_train, problem.n_val) * problem.T * (
        problem.rank + 2 * problem.M + problem.A * problem.y_dim)
    schedule = 8.0 * problem.n_steps * problem.batch + 4.0 * problem.n_steps  # every step's picks; the losses
    return 16.0 * problem.parameters() + activations + problem.message_steps * scores + data + making + schedule


def dotgat_supports(problem: DotGATProblem, implementation: str) -> str:
    if implementation.startswith("torch_cpu:") and problem.precision == "tf32":
        return "TF32 is a GPU matmul mode"
    return ""


def dotgat_compile_key(problem: DotGATProblem, implementation: str):
    if not DOTGAT_VARIANTS[implementation][1]:
        return ()
    return (problem.config(), problem.batch, problem.precision)


def dotgat_summary(problem: DotGATProblem, outputs) -> str:
    losses = np.asarray(outputs["train_loss"])
    return (f"{problem.n_steps} steps of batch {problem.batch} ({problem.precision}): training loss "
            f"{losses[0]:.4f} -> {losses[-1]:.4f}; validation loss {float(outputs['val_loss_start']):.4f} -> "
            f"{float(outputs['val_loss_end']):.4f} ({float(outputs['val_loss_ratio']):.1f}x lower)")


def _dotgat_implementation(key: str) -> lazy:
    kind, compiled, device = DOTGAT_VARIANTS[key]
    return lazy("plugins.ml.dotgat.solve", "solve_cpu" if device == "cpu" else "solve_gpu", kind=kind,
                compiled=compiled)


DOTGAT = SolverSpec(
    name="ml.dotgat",
    problem_type=DotGATProblem,
    implementations={key: _dotgat_implementation(key) for key in DOTGAT_VARIANTS},
    features=dotgat_features,
    size_axis="batch",
    space=dotgat_space,
    supports=dotgat_supports,
    memory=dotgat_memory,
    compile_key=dotgat_compile_key,
    default_problem=DotGATProblem,
    summarize=dotgat_summary,
    description="a training run of DynamicDotGAT (AdamW, cosine schedule, clipping) on synthetic GP data",
    version="3",  # 2: the optimised model's social attention written out (timings stored before are of the old);
    # 3: T, A, H and n_val in the quick space, every shape field in the full one
)


def all_specs() -> list[SolverSpec]:
    return [LINREG, LINREG_MOMENTS, DOTGAT]
