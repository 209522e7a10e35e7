"""``crossover report``: what the cost model believes, drawn and tabulated.

Per solver it writes ``<solver>.png`` (predicted curves and measured samples
of every calibrated backend against the primary size, with the break-even
sizes marked) and ``<solver>.md`` (the thresholds, each model's
coefficients and fit error, and the machine they were measured on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from core.costmodel import history, store
from core.costmodel.fit import EXTRAPOLATION_FACTOR
from core.costmodel.plan import break_even, curves
from core.registry import get_registry, get_solver
from core.running import implementations
from core.solver import SolverSpec, backend_of


def _calibrated(spec: SolverSpec) -> dict[str, Any]:
    return {b: m for b in implementations(spec) if (m := history.model(spec, b)) is not None}


def _measured(spec: SolverSpec, backend: str) -> tuple[list[float], list[float]]:
    entry = history.stored()["solvers"].get(spec.name, {}).get("backends", {}).get(backend, {})
    records = [r for r in entry.get("calibration", []) + entry.get("history", []) if "size" in r]
    return [r["size"] for r in records], [r["seconds"] for r in records]


def _free_memory(models: dict[str, Any]) -> dict[str, float | None]:
    backends = get_registry().backends
    return {name: backends[backend_of(name)].free_memory() for name in models if backend_of(name) in backends}


def machine_line() -> str:
    print_ = store.fingerprint()
    gpus = ", ".join(print_["gpus"]) or "no GPU"
    return f"{print_['cpu']}, {print_['cores']} cores, {gpus}"


def plot(spec: SolverSpec, path: Path) -> list[dict[str, Any]]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    models = _calibrated(spec)
    base = spec.default_problem()
    free = _free_memory(models)
    thresholds = break_even(spec, base, models, free)
    measured_sizes = [s for name in models for s in _measured(spec, name)[0]]
    low, high = (min(measured_sizes), max(measured_sizes)) if measured_sizes else (1.0, 10.0)
    grid, rows = curves(spec, base, models, np.geomspace(low / 2, high * 8, 120), free)
    trusted = (grid >= low / EXTRAPOLATION_FACTOR) & (grid <= high * EXTRAPOLATION_FACTOR)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, seconds in rows.items():
        (line,) = axes.plot(grid, np.where(trusted, seconds, np.nan), label=f"{name} (model)")
        # beyond the measured range the model is an extrapolation: dashed
        axes.plot(grid, np.where(grid >= high * EXTRAPOLATION_FACTOR / 1.1, seconds, np.nan), linestyle="--",
                  color=line.get_color(), linewidth=1)
        sizes, measured = _measured(spec, name)
        axes.scatter(sizes, measured, color=line.get_color(), s=14, label=f"{name} (measured)")
    for point in thresholds:
        axes.axvline(point["size"], color="grey", linestyle=":", linewidth=1)
        axes.annotate(f"{point['below']}→{point['above']}\n{point['size']:.3g}", (point["size"], 0.02),
                      xycoords=("data", "axes fraction"), fontsize=7, ha="center")
    axes.set(xscale="log", yscale="log", xlabel=spec.size_axis, ylabel="seconds per solve",
             title=f"{spec.name}: {machine_line()}")
    axes.title.set_fontsize(8)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return thresholds


def markdown(spec: SolverSpec, thresholds: list[dict[str, Any]]) -> str:
    lines = [f"# {spec.name}: predicted break-even sizes", "", f"Machine: {machine_line()}.", "",
             f"Where the fastest backend changes along `{spec.size_axis}`, according to the models fitted "
             "to this machine's measurements (other fields as in the default problem; dashed curves in "
             "the plot are extrapolations beyond the measured sizes).", ""]
    if thresholds:
        lines += ["| from | to | above " + spec.size_axis + " |", "| --- | --- | --- |"]
        lines += [f"| {t['below']} | {t['above']} | {t['size']:.4g} |" for t in thresholds]
    else:
        lines.append("One backend is fastest over the whole range (or fewer than two are calibrated).")
    lines += ["", "| implementation | intercept s | coefficients (s per unit) | samples | outliers | rank | "
              "undetermined | leave-one-out rel. error |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, model in _calibrated(spec).items():
        terms = ", ".join(f"{f}: {c:.3g}" for f, c in zip(model.feature_names, model.coefficients))
        lines.append(f"| {name} | {model.intercept:.3g} | {terms} | {model.n_samples} | {model.n_rejected} | "
                     f"{model.rank} | {', '.join(model.undetermined) or '-'} | {model.relative_error:.1%} |")
    return "\n".join(lines) + "\n"


def write_report(solvers: list[str], directory: str | Path) -> list[Path]:
    """Write the PNG and Markdown of each solver into ``directory``; return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in solvers:
        spec = get_solver(name)
        png = directory / f"{spec.name}.png"
        thresholds = plot(spec, png)
        md = directory / f"{spec.name}.md"
        md.write_text(markdown(spec, thresholds))
        written += [png, md]
    return written
