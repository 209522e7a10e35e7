"""``crossover report``: what the cost model believes, drawn and tabulated.

Per solver it writes ``<solver>.png`` and ``<solver>.md``.

The plot draws like with like. Calibration measures a designed set of
problems that move every field, so the measured points of a solver are not
one curve's problems. The left panel follows one *family*: the calibration
design's axis ladder (the size axis moves, every other field stays at the
middle of its range, as :mod:`core.costmodel.design` builds it). Its curves
are the models' predictions along that family, and its dots are the
measured problems of that same family only, so a dot sits on its curve
exactly when the model predicts it well. The right panel shows every
measured problem, the family's and the rest of the design's and the real
solves', as measured against predicted seconds for that very problem.

The legend gives each implementation's one-off costs (its JIT compile, its
backend's start), which the curves leave out: they are paid once per process,
not per solve. Dashed stretches of a curve are where the model
extrapolates beyond the region it was fitted on; dotted vertical lines are
the break-even sizes along the family.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from core.atomic import atomic_write, atomic_write_text
from core.backend import safe_free_memory
from core.costmodel import history, store
from core.costmodel.design import calibration_design, with_size
from core.costmodel.features import model_features
from core.costmodel.fit import CostModel
from core.costmodel.plan import break_even, curves
from core.registry import get_registry, get_solver
from core.running import implementations
from core.solver import SolverSpec, backend_of

SAME = 1e-9  # relative tolerance for "the same feature value" (stored as JSON floats)


@dataclasses.dataclass
class Drawing:
    """Everything the plot shows, with the problems behind it (tests and scripts read this).

    ``family`` is the problem behind the curves at every size (its size
    field replaced by each grid size); ``points`` are the measured samples,
    each with its own features, its measured and predicted seconds, and
    whether its problem belongs to the family (``on_family``: drawn on the
    left panel, against the curves).
    """

    solver: str
    size_axis: str
    family: Any
    grid: np.ndarray
    curves: dict[str, np.ndarray]
    extrapolated: dict[str, np.ndarray]
    points: list[dict[str, Any]]
    thresholds: list[dict[str, Any]]
    one_offs: dict[str, dict[str, float]]

    def family_fields(self, default: Any = None) -> dict[str, Any]:
        """The family's scalar fields other than the size axis; with ``default``, only those that differ from it."""
        fields = _scalar_fields(self.family, self.size_axis)
        if default is None:
            return fields
        others = _scalar_fields(default, self.size_axis)
        return {k: v for k, v in fields.items() if k not in others or repr(others[k]) != repr(v)}


def _scalar_fields(problem: Any, size_axis: str) -> dict[str, Any]:
    return {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)
            if f.name != size_axis and f.init and not isinstance(getattr(problem, f.name), np.ndarray)}


def _calibrated(spec: SolverSpec) -> dict[str, CostModel]:
    return {b: m for b in implementations(spec) if (m := history.model(spec, b)) is not None}


def _records(spec: SolverSpec, implementation: str) -> list[dict[str, Any]]:
    entry = history.stored()["solvers"].get(spec.name, {})
    if entry.get("version") != spec.version:
        return []
    slot = entry.get("backends", {}).get(implementation, {})
    return [r for r in slot.get("calibration", []) + slot.get("history", []) if "size" in r and "features" in r]


def _free_memory(models: Mapping[str, Any]) -> dict[str, float | None]:
    backends = get_registry().backends
    return {name: safe_free_memory(backends[backend_of(name)]) for name in models if backend_of(name) in backends}


def _one_offs(spec: SolverSpec, models: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Stored one-off seconds per implementation: its own (JIT) and its backend's start."""
    data = history.stored()
    slots = data["solvers"].get(spec.name, {}).get("backends", {})
    starts = data.get("backends", {})
    return {name: {"implementation": float(slots.get(name, {}).get("one_off_seconds", 0.0) or 0.0),
                   "backend_start": float(starts.get(backend_of(name), {}).get("start_seconds", 0.0) or 0.0)}
            for name in models}


def _same(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return set(a) == set(b) and all(math.isclose(float(a[k]), float(b[k]), rel_tol=SAME, abs_tol=1e-300)
                                    for k in a)


def _on_family(spec: SolverSpec, family: Any, implementation: str, record: Mapping[str, Any]) -> bool:
    problem = with_size(spec, family, record["size"])
    return problem is not None and _same(model_features(spec, problem, implementation), record["features"])


def _families(spec: SolverSpec) -> list[Any]:
    """Candidate families: in each calibration design (quick, full), the largest group of problems
    that differ only in the size axis (the axis ladder). With a fixed ladder, the ladder itself."""
    found = []
    for quick in (True, False):
        groups: dict[tuple, list[Any]] = {}
        for problem in calibration_design(spec, quick):
            fields = _scalar_fields(problem, spec.size_axis)
            groups.setdefault(tuple(sorted((k, repr(v)) for k, v in fields.items())), []).append(problem)
        if groups:
            found.append(max(groups.values(), key=len)[0])
    return found or [spec.default_problem()]


def drawing(spec: SolverSpec) -> Drawing:
    """The data of the report's plot: curves along one design family, and the measured points."""
    models = _calibrated(spec)
    records = {name: _records(spec, name) for name in models}
    # the family that holds the most measured problems (the quick design's ladder after a quick calibration)
    family = max(_families(spec), key=lambda f: sum(_on_family(spec, f, n, r) for n in records for r in records[n]))
    points = []
    for name, fitted in models.items():
        for record in records[name]:
            points.append({"implementation": name, "size": float(record["size"]), "seconds": float(record["seconds"]),
                           "predicted": float(fitted.predict(record["features"])[0]),
                           "features": dict(record["features"]), "source": record.get("source", ""),
                           "on_family": _on_family(spec, family, name, record)})
    sizes = [p["size"] for p in points] or [float(getattr(family, spec.size_axis))]
    low, high = min(sizes), max(sizes)
    # the measured sizes are grid points too, so each dot's own prediction is a point of its curve
    grid = np.unique(np.concatenate([np.geomspace(low / 2, high * 8, 120), sizes]))
    free = _free_memory(models)
    grid, rows = curves(spec, family, models, grid, free)
    extrapolated = {name: np.zeros(len(grid), dtype=bool) for name in models}
    for i, size in enumerate(grid):
        resized = with_size(spec, family, size)
        for name, fitted in models.items():
            extrapolated[name][i] = resized is None or fitted.extrapolated(model_features(spec, resized, name))
    return Drawing(spec.name, spec.size_axis, family, grid, rows, extrapolated, points,
                   break_even(spec, family, models, free), _one_offs(spec, models))


def machine_line() -> str:
    print_ = store.fingerprint()
    gpus = ", ".join(print_["gpus"]) or "no GPU"
    return f"{print_['cpu']}, {print_['cores']} cores, {gpus}"


def _family_text(spec: SolverSpec, data: Drawing) -> str:
    changed = data.family_fields(spec.default_problem())
    fields = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in changed.items())
    return f"{data.size_axis} varies, {fields}, other fields as in the default problem" if fields \
        else f"{data.size_axis} varies, other fields as in the default problem"


def _one_off_text(costs: Mapping[str, float]) -> str:
    parts = [f"{label} {costs[key]:.2g} s" for key, label in (("implementation", "JIT"), ("backend_start", "start"))
             if costs[key] > 0]
    return f"one-off {', '.join(parts)}" if parts else "no one-off"


def plot(spec: SolverSpec, path: Path) -> Drawing:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    data = drawing(spec)
    figure, (along, scatter) = plt.subplots(1, 2, figsize=(11, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for name, seconds in data.curves.items():
        outside = data.extrapolated[name]
        (line,) = along.plot(data.grid, np.where(outside, np.nan, seconds),
                             label=f"{name} ({_one_off_text(data.one_offs[name])})")
        # extend the dashed stretch by one grid point so that solid and dashed meet
        dashed = outside | np.roll(outside, 1) | np.roll(outside, -1)
        along.plot(data.grid, np.where(dashed, seconds, np.nan), linestyle="--", color=line.get_color(), linewidth=1)
        mine = [p for p in data.points if p["implementation"] == name]
        on = [p for p in mine if p["on_family"]]
        along.scatter([p["size"] for p in on], [p["seconds"] for p in on], color=line.get_color(), s=16, zorder=3)
        scatter.scatter([p["predicted"] for p in mine], [p["seconds"] for p in mine], color=line.get_color(), s=12,
                        label=name)
    for point in data.thresholds:
        along.axvline(point["size"], color="grey", linestyle=":", linewidth=1)
        along.annotate(f"{point['below']}→{point['above']}\n{point['size']:.3g}", (point["size"], 0.02),
                       xycoords=("data", "axes fraction"), fontsize=7, ha="center")
    handles, _labels = along.get_legend_handles_labels()
    handles += [Line2D([], [], color="black", marker="o", linestyle="", markersize=4,
                       label="measured, same family as the curves"),
                Line2D([], [], color="black", linestyle="--", linewidth=1,
                       label="dashed: model extrapolates beyond its fitted region"),
                Line2D([], [], color="grey", linestyle=":", linewidth=1, label="dotted: break-even size")]
    along.legend(handles=handles, fontsize=6, loc="upper left",
                 title="curves: model, steady state (one-offs not included)", title_fontsize=6)
    along.set(xscale="log", yscale="log", xlabel=spec.size_axis, ylabel="seconds per solve")
    along.set_title(f"{spec.name} along the design's axis ladder: {_family_text(spec, data)}", fontsize=7, wrap=True)
    measured = [p["seconds"] for p in data.points] + [p["predicted"] for p in data.points if p["predicted"] > 0]
    if measured:
        low, high = min(m for m in measured if m > 0) / 1.5, max(measured) * 1.5
        scatter.plot([low, high], [low, high], color="black", linewidth=0.8, label="measured = predicted")
        scatter.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    scatter.set(xlabel="predicted s for that problem", ylabel="measured s")
    scatter.set_title("every measured problem (design and solves)", fontsize=7)
    scatter.legend(fontsize=6)
    figure.suptitle(machine_line(), fontsize=8)
    figure.tight_layout()
    atomic_write(path, lambda target: figure.savefig(target, dpi=120, format="png"))
    plt.close(figure)
    return data


def markdown(spec: SolverSpec, data: Drawing) -> str:
    lines = [f"# {spec.name}: predicted break-even sizes", "", f"Machine: {machine_line()}.", "",
             f"Where the fastest backend changes along `{spec.size_axis}`, according to the models fitted "
             "to this machine's measurements, along the calibration design's axis ladder "
             f"({_family_text(spec, data)}). "
             "In the plot, dots on the left are the measured problems of that ladder; the right panel shows every "
             "measured problem against its own prediction; dashed curves are extrapolations; one-off costs "
             "(JIT, backend start) are paid once per process and are not in the curves.", ""]
    if data.thresholds:
        lines += ["| from | to | above " + spec.size_axis + " |", "| --- | --- | --- |"]
        lines += [f"| {t['below']} | {t['above']} | {t['size']:.4g} |" for t in data.thresholds]
    else:
        lines.append("One backend is fastest over the whole range (or fewer than two are calibrated).")
    lines += ["", "| implementation | intercept s | coefficients (s per unit) | samples | outliers | rank | "
              "undetermined | leave-one-out rel. error | one-off s (JIT) | backend start s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, model in _calibrated(spec).items():
        terms = ", ".join(f"{f}: {c:.3g}" for f, c in zip(model.feature_names, model.coefficients))
        costs = data.one_offs.get(name, {"implementation": 0.0, "backend_start": 0.0})
        lines.append(f"| {name} | {model.intercept:.3g} | {terms} | {model.n_samples} | {model.n_rejected} | "
                     f"{model.rank} | {', '.join(model.undetermined) or '-'} | {model.relative_error:.1%} | "
                     f"{costs['implementation']:.3g} | {costs['backend_start']:.3g} |")
    return "\n".join(lines) + "\n"


def write_report(solvers: list[str], directory: str | Path) -> list[Path]:
    """Write the PNG and Markdown of each solver into ``directory``; return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in solvers:
        spec = get_solver(name)
        png = directory / f"{spec.name}.png"
        data = plot(spec, png)
        md = directory / f"{spec.name}.md"
        text = markdown(spec, data)
        atomic_write_text(md, text)
        written += [png, md]
    return written
