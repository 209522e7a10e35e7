"""DynamicDotGAT training-step benchmark: forward, backward and optimiser-step times, peak memory, samples/s.

    python docs/scripts/ml_dotgat_bench.py --out docs/results/ml-<machine> [--budget 240]

The published model's shape (T 50, M 25, A 20, H 128, 4 heads, 5 message
steps, rho 0.25), on the synthetic task's data. For each implementation
(naive, optimized), eager or compiled (``torch.compile``, default mode),
precision (fp32, TF32, bf16 autocast) and batch (8 to 64):

- forward, backward and optimiser-step (clip + AdamW) times: CUDA events
  around each phase, medians over the timed steps;
- the whole step's wall time per step over the timed steps (host
  overhead included), and samples/s from it;
- peak memory: ``torch.cuda.max_memory_allocated`` over the timed steps;
- compile time, separately: the first step's wall time less a steady step.

The optimised variant uses fused AdamW; the naive one PyTorch's default
AdamW. Compiled runs are the dearest (each compile is tens of seconds), so
they are measured at batch 64 and stop when ``--budget`` seconds are
spent; the JSON is rewritten after every row, so a run cut short keeps
what it measured. On a CPU (no GPU) it times the eager variants on a
small shape instead, with wall clocks. Writes ``ml_dotgat.json`` and
``ml_dotgat.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from plugins.ml.dotgat.data import make_split
from plugins.ml.dotgat.model import build
from plugins.ml.dotgat.problem import DotGATProblem
from plugins.ml.dotgat.train import training_step


class Phases:
    """Per-phase timers: CUDA events on a GPU, wall clocks (after a sync-free CPU run) on a CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def measure(problem: DotGATProblem, kind: str, compiled: bool, device: torch.device, steps: int) -> dict:
    cuda = device.type == "cuda"
    model = build(problem.config(), kind).to(device)
    forward = torch.compile(model) if compiled else None
    trainer = training_step(model, total_steps=10_000, precision=problem.precision, compiled=forward,
                            fused=kind == "optimized")
    X, y = (torch.from_numpy(a[:problem.batch]).to(device) for a in make_split(problem.task(), problem.batch, 0))

    def step(phases: Phases | None = None) -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        phases and phases.mark()
        loss = trainer.loss(X, y)
        phases and phases.mark()
        loss.backward()
        phases and phases.mark()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.clip, foreach=True)
        trainer.optimizer.step()
        phases and phases.mark()

    sync(cuda)
    started = time.perf_counter()
    step()
    sync(cuda)
    first = time.perf_counter() - started
    for _ in range(2):
        step()
    sync(cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync(cuda)
    per_step = (time.perf_counter() - started) / steps
    phases = []
    for _ in range(steps):
        timer = Phases(cuda)
        step(timer)
        phases.append(timer.spans())
    forward_s, backward_s, optimizer_s = (statistics.median(p[i] for p in phases) for i in range(3))
    return {"implementation": kind, "compiled": compiled, "precision": problem.precision, "batch": problem.batch,
            "forward_ms": forward_s * 1e3, "backward_ms": backward_s * 1e3, "optimizer_ms": optimizer_s * 1e3,
            "step_ms": per_step * 1e3, "samples_per_s": problem.batch / per_step,
            "peak_memory_MiB": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
            "compile_s": max(0.0, first - per_step) if compiled else None, "first_step_s": first}


def write(out: Path, report: dict) -> None:
    (out / "ml_dotgat.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# DotGAT training step ({report['device']}, {report['shape']})", "",
             "| implementation | compiled | precision | batch | forward ms | backward ms | optimizer ms | step ms "
             "| samples/s | peak MiB | compile s |", "|" + " --- |" * 11]
    for r in report["rows"]:
        peak = "-" if r["peak_memory_MiB"] is None else f"{r['peak_memory_MiB']:.0f}"
        compile_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        lines.append(f"| {r['implementation']} | {'yes' if r['compiled'] else 'no'} | {r['precision']} | {r['batch']} "
                     f"| {r['forward_ms']:.2f} | {r['backward_ms']:.2f} | {r['optimizer_ms']:.2f} | {r['step_ms']:.2f} "
                     f"| {r['samples_per_s']:.0f} | {peak} | {compile_s} |")
    lines += ["", *report.get("speedups", [])]
    (out / "ml_dotgat.md").write_text("\n".join(lines) + "\n")


def speedups(rows: list[dict]) -> list[str]:
    """Samples/s of each batch-64 run over the naive eager step at batch 64 in fp32 and in its own precision."""
    base = {r["precision"]: r["samples_per_s"] for r in rows
            if r["batch"] == 64 and r["implementation"] == "naive" and not r["compiled"]}
    found = []
    for r in rows:
        if r["batch"] == 64 and (r["implementation"], r["compiled"]) != ("naive", False) and "fp32" in base:
            same = f", {r['samples_per_s'] / base[r['precision']]:.2f}x naive eager {r['precision']}" \
                if r["precision"] in base and r["precision"] != "fp32" else ""
            found.append(f"- {r['implementation']}{' compiled' if r['compiled'] else ''} {r['precision']}: "
                         f"{r['samples_per_s'] / base['fp32']:.2f}x naive eager fp32{same}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds; compiled runs stop after this")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eager-batches", default="8,16,32,64", help="batches of the eager runs (comma-separated)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shape = {} if cuda else {"T": 16, "M": 16, "A": 8, "H": 32, "message_steps": 2}
    base = DotGATProblem(**({"T": 50, "M": 25, "A": 20, "H": 128, "heads": 4, "message_steps": 5, "rho": 0.25}
                            if cuda else shape))
    report = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
              "shape": f"T {base.T}, M {base.M}, A {base.A}, H {base.H}, {base.heads} heads, "
                       f"{base.message_steps} message steps", "rows": []}
    began = time.perf_counter()
    precisions = ("fp32", "tf32", "bf16") if cuda else ("fp32",)
    plan = [(kind, False, precision, batch) for precision in precisions for kind in ("naive", "optimized")
            for batch in map(int, args.eager_batches.split(","))]
    if cuda:
        plan += [("optimized", True, p, 64) for p in ("bf16", "fp32", "tf32")] + [("naive", True, p, 64)
                                                                                   for p in ("fp32", "bf16")]
    for kind, compiled, precision, batch in plan:
        if compiled and time.perf_counter() - began > args.budget:
            report.setdefault("skipped", []).append(f"{kind} compiled {precision} batch {batch}: budget spent")
            continue
        problem = DotGATProblem(**{**vars(base), "batch": batch, "precision": precision})
        row = measure(problem, kind, compiled, device, args.steps)
        report["rows"].append(row)
        report["speedups"] = speedups(report["rows"])
        print(json.dumps(row), flush=True)
        write(args.out, report)
        if cuda:
            torch.cuda.empty_cache()
    report["seconds"] = time.perf_counter() - began
    write(args.out, report)


if __name__ == "__main__":
    main()
