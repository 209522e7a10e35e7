"""The ``crossover`` command line.

Every command prints a rich table for people and, with ``--json``, one
strict JSON document for scripts (NaN and infinities become ``null``). A user
mistake (unknown solver, backend or parameter, a bad value, a path that cannot
be written) exits with status 2 and a one-line message listing the valid
choices; a fault while running exits with status 1; Ctrl-C exits with 130
after one line saying what was kept; a closed output pipe (``| head``) exits
quietly with 141, as a program killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import core
from core.atomic import atomic_write
from core.backends import dask_cluster
from core.costmodel.calibrate import CalibrationInterrupted
from core.costmodel.store import WisdomWarning
from core.errors import CrossoverError, PluginError, PluginWarning, TaskFailedError
from core.registry import get_registry, get_solver
from core.running import implementations
from core.solver import backend_of, problem_from_params
from core.validation import env_flag

USER_ERROR, FAULT = 2, 1
INTERRUPTED = 130  # 128 + SIGINT, as shells report a program stopped by Ctrl-C
BROKEN_PIPE = 141  # 128 + SIGPIPE, as shells report `yes | head`
PIPED_WIDTH = 160  # piped output is not squeezed into 80 columns
DEMO_WIDTH = 100


class UsageError(CrossoverError, ValueError):
    """A malformed command line (the message says how to fix it)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with the one line that says what was kept."""


def _console(max_width: int | None = None) -> Console:
    """Stdout's console: ``COLUMNS`` if set, else the terminal's width, else 160; at most ``max_width``."""
    console = Console(highlight=False)
    width = console.width if ("COLUMNS" in os.environ or console.is_terminal) else PIPED_WIDTH
    if max_width is not None:
        width = min(width, max_width)
    return Console(highlight=False, width=width)


def _emit(args: argparse.Namespace, payload: Any, table: Table | None = None, *lines: str,
          max_width: int | None = None) -> None:
    if args.json:
        print(dumps(payload))
        return
    console = _console(max_width)
    if table is not None:
        console.print(table)
    for line in lines:
        console.print(escape(line))


def dumps(payload: Any) -> str:
    """Strict JSON (RFC 8259): NaN and infinities become null, which every parser accepts."""
    return json.dumps(_strict(payload), indent=2, allow_nan=False, default=str)


def _strict(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _strict(value.tolist())
    if isinstance(value, np.generic):
        return _strict(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _parse_params(pairs: Sequence[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--param {pair!r} is invalid: expected KEY=VALUE")
        params[key.strip()] = value.strip()
    return params


# -- commands -------------------------------------------------------------------

def cmd_backends(args: argparse.Namespace) -> int:
    rows = core.backends()
    table = Table(title="crossover backends on this machine")
    for column in ("backend", "available", "details / reason"):
        table.add_column(column)
    for row in rows.values():
        detail = ", ".join(f"{k}={v}" for k, v in row.details.items()) if row.available else row.reason
        table.add_row(row.name, "yes" if row.available else "[red]no[/red]", escape(detail))
    payload = [{"name": r.name, "summary": r.summary, "available": r.available, "reason": r.reason,
                "details": r.details} for r in rows.values()]
    _emit(args, payload, table)
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    registry = get_registry()
    table = Table(title="crossover plugins")
    for column in ("plugin", "version", "source", "solvers", "backends", "status"):
        table.add_column(column)
    payload = []
    for info in registry.plugins.values():
        status = f"[red]skipped: {escape(info.error)}[/red]" if info.error else "loaded"
        table.add_row(info.name, info.version, info.source, ", ".join(info.solvers), ", ".join(info.backends),
                      status)
        payload.append(vars(info).copy())
    _emit(args, payload, table)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    spec = get_solver(args.solver)
    problem = problem_from_params(spec, _parse_params(args.param))
    target = save_target(args.save, spec.name) if args.save else None  # a bad path fails before the solve
    result = core.solve(problem, backend=args.backend, solver=spec.name, expected_calls=args.calls)
    saved, failure = save_outputs(result.outputs, target, spec.name) if target is not None else (None, "")
    summary = spec.summarize(problem, result.outputs)
    payload = {"solver": spec.name, "backend": result.backend, "seconds": result.seconds, "summary": summary,
               "outputs": {k: v for k, v in result.outputs.items() if v.size <= 64}}
    if target is not None:
        payload["saved"] = None if saved is None else str(saved)
    _emit(args, payload, None, f"{spec.name} on {result.backend}: {result.seconds:.3f} s",
          summary, *([f"outputs saved to {saved}"] if saved is not None and not failure else []))
    if failure:
        print(f"crossover: error: {failure}", file=sys.stderr)
        return FAULT
    return 0


# -- saving outputs ---------------------------------------------------------------------

def save_target(text: str, solver: str) -> Path:
    """The ``.npz`` file ``--save TEXT`` will write, checked before anything is solved.

    ``TEXT`` ending in ``/`` or naming an existing directory means a file
    ``<solver>-<date>-<time>.npz`` inside it; otherwise ``.npz`` is added
    unless the name has it (as ``numpy.savez`` does). The directory must
    exist and be writable; an existing file is replaced.
    """
    path = Path(text).expanduser()
    if text.endswith(("/", os.sep)) or path.is_dir():
        if not path.is_dir():
            raise UsageError(f"--save {text!r}: directory {str(path)!r} does not exist")
        path = path / f"{solver}-{time.strftime('%Y%m%d-%H%M%S')}.npz"
    elif path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    _check_writable_directory(path.parent, f"--save {text!r}")
    return path


def _check_writable_directory(folder: Path, what: str) -> None:
    if not folder.is_dir():
        state = "is not a directory" if folder.exists() else "does not exist"
        raise UsageError(f"{what}: directory {str(folder)!r} {state}; create it or name another")
    try:  # the one sure test of writability (root, read-only mounts, ACLs): create a file there
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".crossover-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{what}: cannot write in {str(folder)!r}: {exc.strerror or exc}") from exc


def _write_npz(path: Path, outputs: Mapping[str, Any]) -> None:
    arrays = {k: np.asarray(v) for k, v in outputs.items()}

    def write(target: str) -> None:
        with open(target, "wb") as stream:  # a stream: numpy adds no second suffix to the temporary name
            np.savez_compressed(stream, **arrays)

    atomic_write(path, write)


def save_outputs(outputs: Mapping[str, Any], path: Path, solver: str) -> tuple[Path | None, str]:
    """Write the outputs to ``path``; if that fails, to a temporary file. Returns (file written, failure)."""
    try:
        _write_npz(path, outputs)
        return path, ""
    except OSError as exc:
        reason = f"could not write {str(path)!r}: {exc.strerror or exc}"
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    fallback = Path(tempfile.gettempdir()) / f"crossover-{solver}-{stamp}.npz"
    try:
        _write_npz(fallback, outputs)
    except OSError as exc:
        return None, f"{reason}; nor to {str(fallback)!r} ({exc.strerror or exc}): the outputs are lost"
    return fallback, f"{reason}; the outputs were saved to {fallback} instead"


def cmd_demo(args: argparse.Namespace) -> int:
    """Run every solver's default problem on every backend that runs here.

    Each pair runs twice: the first call pays one-off costs (JIT compile,
    pool start, CUDA context), the repeat shows the steady state. Progress
    goes to standard error from the start; a solver whose plugin fails is
    named in one line and the others go on.
    """
    solvers = core.solvers()
    progress = _DemoProgress(len(solvers))
    table = Table(title="crossover demo: default problems, first call and repeat")
    for column in ("implementation", "first s", "repeat s", "answer"):
        table.add_column(column)
    payload: list[dict[str, Any]] = []
    statuses = core.backends(describe=False)
    try:
        for name, spec in solvers.items():
            progress.solver(name)
            table.add_section()
            table.add_row(f"[bold]{escape(name)}[/bold]", "", "", "")
            rows = _demo_solver(name, spec, statuses, progress)
            for row in _merge_skipped(rows):
                table.add_row(*_demo_cells(row))
            payload += rows
    except KeyboardInterrupt:
        raise Interrupted(f"the demo stopped during {progress.current}; {_count(progress.done, 'run')} finished, "
                          "nothing else to keep") from None
    finally:
        progress.stop()
    _emit(args, payload, table, max_width=DEMO_WIDTH)
    return FAULT if any("error" in row for row in payload) else 0


def _blame(name: str, doing: str, exc: BaseException) -> str:
    """One line naming the plugin and the solver (a PluginError from a guarded spec function already does)."""
    if isinstance(exc, PluginError) and name in str(exc):
        return str(exc)
    owner = get_registry().solver_owner.get(name, "?")
    return f"plugin {owner!r}: solver {name!r}: {doing} raised {type(exc).__name__}: {exc}"


def _demo_solver(name: str, spec: Any, statuses: Mapping[str, Any], progress: _DemoProgress) -> list[dict[str, Any]]:
    """One solver's rows: each implementation run twice, skipped with a reason, or failed with the error."""
    try:
        problem = spec.default_problem()
        keys = implementations(spec)
    except (Exception, SystemExit) as exc:  # a broken plugin must not stop the demo of the others
        message = _blame(name, "default_problem()", exc)
        progress.note(message)
        return [{"solver": name, "backend": "-", "error": message}]
    rows = []
    for backend in keys:
        row: dict[str, Any] = {"solver": name, "backend": backend}
        status = statuses.get(backend_of(backend))
        try:
            reason = (status.reason if status else "backend not registered") if not (status and status.available) \
                else spec.supports(problem, backend)
            if reason:
                rows.append({**row, "skipped": reason})
                continue
            progress.pair(name, backend)
            first = core.solve(problem, backend=backend, solver=name)
            repeat = core.solve(problem, backend=backend, solver=name)
            summary = spec.summarize(problem, repeat.outputs)
        except (Exception, SystemExit) as exc:  # one broken pair must not hide the others
            message = _blame(name, f"solving on {backend}", exc)
            progress.note(message)
            rows.append({**row, "error": message})
            continue
        progress.finished()
        rows.append({**row, "first_seconds": first.seconds, "repeat_seconds": repeat.seconds, "summary": summary})
    return rows


def _merge_skipped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neighbouring rows skipped for the same reason as one row, a name a line: a shorter, narrower table."""
    merged: list[dict[str, Any]] = []
    for row in rows:
        last = merged[-1] if merged else {}
        if "skipped" in row and last.get("skipped") == row["skipped"]:
            merged[-1] = {**last, "backend": f"{last['backend']}\n{row['backend']}"}
        else:
            merged.append(row)
    return merged


def _demo_cells(row: Mapping[str, Any]) -> tuple[str, str, str, str]:
    if "skipped" in row:
        return row["backend"], "-", "-", f"[dim]skipped: {escape(row['skipped'])}[/dim]"
    if "error" in row:
        return row["backend"], "-", "-", f"[red]failed: {escape(row['error'])}[/red]"
    return row["backend"], f"{row['first_seconds']:.3f}", f"{row['repeat_seconds']:.3f}", escape(row["summary"])


class _DemoProgress:
    """What the demo is doing, on standard error from its first moment.

    On a terminal a transient status line names the run in progress; piped,
    one plain line per run, so a log shows where the time went.
    """

    def __init__(self, solvers: int):
        self.current, self.done = "its start", 0
        self._status = None
        err = Console(stderr=True, highlight=False)
        print(f"crossover demo: {_count(solvers, 'solver')}, each implementation run twice (first call, then repeat); "
              "progress below, the table at the end", file=sys.stderr, flush=True)
        if err.is_terminal:
            self._status = err.status("starting")
            self._status.start()

    def solver(self, name: str) -> None:
        self.current = name
        self._say(f"{name}: default problem")

    def pair(self, name: str, backend: str) -> None:
        self.current = f"{name} on {backend}"
        self._say(f"{name} on {backend} ...")

    def finished(self) -> None:
        self.done += 1

    def note(self, message: str) -> None:
        """A failure: always one plain line, also on a terminal."""
        if self._status is not None:
            self._status.console.print(f"crossover demo: {escape(message)}")
        else:
            print(f"crossover demo: {message}", file=sys.stderr, flush=True)

    def _say(self, text: str) -> None:
        if self._status is not None:
            self._status.update(escape(text))
        else:
            print(f"crossover demo: {text}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()


def _solver_names(names: Sequence[str]) -> list[str]:
    return [get_solver(name).name for name in names] if names else sorted(core.solvers())


def cmd_calibrate(args: argparse.Namespace) -> int:
    from core.costmodel.calibrate import calibrate

    reports = calibrate(_solver_names(args.solvers), quick=not args.full, budget=args.budget,
                        progress=not args.json and sys.stderr.isatty())
    table = Table(title=f"calibration ({'full' if args.full else 'quick'})")
    for column in ("solver", "implementation", "samples", "skipped", "start s", "one-off s", "seconds spent",
                   "stopped because"):
        table.add_column(column)
    payload = []
    for report in reports:
        if report.error:  # its plugin's fault: the others were calibrated all the same
            table.add_row(report.solver, "-", "0", "-", "-", "-", "-", f"[red]{escape(report.error)}[/red]")
        for row in report.backends:
            one_off = "-" if row.one_off_seconds is None else f"{row.one_off_seconds:.3f}"
            start = "-" if row.start_seconds is None else f"{row.start_seconds:.3f}"
            table.add_row(report.solver, row.backend, str(row.samples), str(row.skipped), start, one_off,
                          f"{row.seconds_spent:.1f}", escape(row.stopped))
        payload.append({"solver": report.solver, "seconds": report.seconds, "error": report.error,
                        "backends": [vars(row) for row in report.backends]})
    totals = [f"{r.solver}: {r.problems} designed problems, {r.seconds:.1f} s in all" for r in reports]
    _emit(args, payload, table, *totals)
    return FAULT if any(r.error for r in reports) else 0


def _verdict(decision: core.Plan, name: str) -> str:
    """Why an implementation was or was not chosen, in a few words."""
    if name == decision.backend:
        return "[bold green]chosen[/bold green]"
    if name in decision.excluded:
        return escape(decision.excluded[name])
    calls = decision.expected_calls
    mine, chosen = decision.predictions[name], decision.predictions[decision.backend]
    total = mine.seconds + mine.one_off_seconds / calls
    if total <= (chosen.seconds + chosen.one_off_seconds / calls):
        return "as fast within the margin; a simpler backend won"
    if mine.seconds < chosen.seconds:
        return "faster once warm, but its unpaid one-off costs more"
    return "slower"


def cmd_plan(args: argparse.Namespace) -> int:
    spec = get_solver(args.solver)
    problem = problem_from_params(spec, _parse_params(args.param))
    decision = core.plan(problem, solver=spec.name, expected_calls=args.calls, calibrate=True)
    table = Table(title=f"plan for {spec.name} ({spec.size_axis}={getattr(problem, spec.size_axis)})")
    for column in ("implementation", "predicted s", "± rel. error", "status", "unpaid one-off s", "verdict"):
        table.add_column(column)
    for name, prediction in decision.predictions.items():
        seconds = "-" if prediction.seconds is None else f"{prediction.seconds:.4g}"
        error = "-" if prediction.error is None else f"{prediction.error:.0%}"
        table.add_row(name, seconds, error, prediction.status, f"{prediction.one_off_seconds:.3g}",
                      _verdict(decision, name))
    lines = [f"chosen: {decision.backend} ({decision.reason})"]
    lines += [f"break-even: {b['below']} -> {b['above']} at {b['axis']} = {b['size']:.4g}" for b in decision.break_even]
    if decision.expected_work:  # work that depends on convergence, learnt from earlier solves
        lines.append("expected work: " + ", ".join(f"{k} = {v:.4g}" for k, v in decision.expected_work.items()))
    _emit(args, decision.to_dict(), table, *lines)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from core.costmodel.calibrate import ensure_calibrated
    from core.costmodel.report import write_report

    names = _solver_names(args.solvers)
    directory = report_directory(args.output)  # before calibrating: a bad -o must not cost 25 s a solver
    for name in names:
        ensure_calibrated(get_solver(name))
    try:
        paths = write_report(names, directory)
    except OSError as exc:
        raise UsageError(f"-o {args.output!r}: could not write the report: {exc.strerror or exc}") from exc
    _emit(args, [str(p) for p in paths], None, *[f"wrote {p}" for p in paths])
    return 0


def report_directory(text: str) -> Path:
    """``report -o``: an existing, writable directory, or one created now; never an existing file."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"-o {text!r} is an existing file; name a directory (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"-o {text!r}: cannot create the directory: {exc.strerror or exc}") from exc
    _check_writable_directory(path, f"-o {text!r}")
    return path


def _predicted_against_measured(row: Any, key: str) -> str:
    """``numba predicted 12.1 ms, took 15.2 ms``: whether a miss was the model's or the timing's."""
    seconds, status = row.predicted.get(key, (None, "uncalibrated"))
    guess = f"predicted {_ms(seconds)}" + (f" ({status})" if status != "calibrated" else "")
    return f"{key} {guess}, took {_ms(row.seconds[key])}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3g} ms"


def cmd_evaluate(args: argparse.Namespace) -> int:
    from core.costmodel.evaluate import evaluate

    report = evaluate(get_solver(args.solver).name, quick=not args.full, count=args.count, seed=args.seed,
                      calls=args.calls)
    backends = sorted({b for row in report.rows for b in row.seconds})
    table = Table(title=f"evaluate {report.solver}: held-out problems, warm seconds per solve")
    for column in ("problem", *backends, "best", f"core.solve, calls 1-{report.calls}", "final regret",
                   "loop / best", "model's pick", "pick regret", "measured / predicted"):
        table.add_column(column)
    for row in report.rows:
        problem = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.params.items())
        table.add_row(escape(problem), *[f"{row.seconds[b]:.4g}" if b in row.seconds else "-" for b in backends],
                      row.best, " > ".join(row.calls), f"{row.final_regret:.1%}", f"{row.loop_ratio:.2f}x",
                      row.chosen, f"{row.regret:.1%}", f"{row.measured_over_predicted:.2f}")
    worst = [f"worst: {row.final_regret:.1%} at {row.params}: core.solve ran {row.final} on call {report.calls}, "
             f"{row.best} was fastest ({_predicted_against_measured(row, row.final)}; "
             f"{_predicted_against_measured(row, row.best)})"
             for row in report.worst(3) if row.final_regret > 0]
    _emit(args, report.to_dict(), table, *worst,
          f"core.solve on call {report.calls}: median regret {report.median_final_regret:.1%}, maximum "
          f"{report.max_final_regret:.1%}; the loop's total at most {report.max_loop_ratio:.2f}x "
          f"{report.calls} times the best's, over {len(report.rows)} held-out problems",
          f"the models' pick alone: median regret {report.median_regret:.1%}, maximum {report.max_regret:.1%}; "
          f"measured / predicted within [0.5, 2] on {report.predictions_within_2x:.0%} of the problems")
    return 0


# -- parser ---------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    # after the command too; SUPPRESS keeps a value given before the command from being reset to None
    common.add_argument("--scheduler", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="crossover", description="Run each solver on the backend that is measurably fastest for it here.")
    parser.add_argument("--version", action="version", version=f"crossover {core.__version__}")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="run the dask backend on this scheduler (host:port, tcp://host:port, or local for a "
                             f"loopback LocalCluster); default: ${dask_cluster.SCHEDULER_VARIABLE}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("backends", parents=[common], help="list backends, whether they run here and why not")
    commands.add_parser("plugins", parents=[common], help="list plugins and the solvers they provide")
    commands.add_parser("demo", parents=[common], help="run every solver's default problem on every backend")
    run = commands.add_parser("run", parents=[common], help="run one solver")
    run.add_argument("solver")
    run.add_argument("--backend", default="auto", help="backend name, or auto (default): the cost model picks")
    run.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="set a problem field of the solver's default problem (repeatable)")
    run.add_argument("--save", metavar="FILE.npz", help="write the outputs to a .npz file")
    run.add_argument("--calls", type=float, default=None,
                     help="with auto: expected calls to spread one-off costs (JIT, pool start) over")

    calibrate = commands.add_parser("calibrate", parents=[common], help="measure solvers on every backend")
    calibrate.add_argument("solvers", nargs="*", metavar="SOLVER", help="default: every registered solver")
    mode = calibrate.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small designed set, 25 s budget per solver (default)")
    mode.add_argument("--full", action="store_true",
                      help="larger designed set over the full space, 600 s budget per solver")
    calibrate.add_argument("--budget", type=float, metavar="SECONDS", help="total seconds per solver")

    plan = commands.add_parser("plan", parents=[common], help="show which backend auto-selection picks and why")
    plan.add_argument("solver")
    plan.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--calls", type=float, default=None,
                      help="expected calls to spread one-off costs over (default: learnt from this process)")

    report = commands.add_parser("report", parents=[common], help="plot the models and break-even sizes")
    report.add_argument("solvers", nargs="*", metavar="SOLVER")
    report.add_argument("-o", "--output", default="crossover-report", metavar="DIR")

    evaluate = commands.add_parser("evaluate", parents=[common], help="regret of auto-selection off the ladder")
    evaluate.add_argument("solver")
    evaluate.add_argument("--full", action="store_true", help="draw held-out problems from the full size space")
    evaluate.add_argument("--count", type=int, default=12, help="random held-out problems (default 12)")
    evaluate.add_argument("--seed", type=int, default=2024, help="seed of the held-out draw")
    evaluate.add_argument("--calls", type=int, default=3, help="core.solve calls per problem (default 3)")
    _add_plugin_commands(commands)
    return parser


COMMANDS = {"backends": cmd_backends, "plugins": cmd_plugins, "run": cmd_run, "demo": cmd_demo,
            "calibrate": cmd_calibrate, "plan": cmd_plan, "report": cmd_report, "evaluate": cmd_evaluate}


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our own warnings as one line for people; anything else as Python prints it."""
    if issubclass(category, (PluginWarning, WisdomWarning)):
        print(f"crossover: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def main(argv: Sequence[str] | None = None) -> int:
    # auto-calibration and similar notices go to stderr, so --json output stays parseable
    logging.basicConfig(level=logging.WARNING, format="crossover: %(message)s", stream=sys.stderr)
    warnings.showwarning = _show_warning  # set first: plugins load while the parser is built
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except PluginError as exc:  # a broken plugin under CROSSOVER_PLUGINS_STRICT=1
        print(f"crossover: error: {exc}", file=sys.stderr)
        return FAULT
    except KeyboardInterrupt:
        print("crossover: interrupted while loading plugins; nothing had started", file=sys.stderr)
        return INTERRUPTED
    command = COMMANDS.get(args.command) or getattr(args, "handler", None)
    if command is None:
        print(f"crossover: error: command {args.command!r} names no function to run; its plugin must call "
              "parser.set_defaults(handler=fn)", file=sys.stderr)
        return FAULT
    try:
        if args.scheduler is not None:  # before any probe: the dask backend is available only with a scheduler
            dask_cluster.use_scheduler(args.scheduler)
        status = command(args)
        sys.stdout.flush()  # a closed pipe shows here, where it can be handled, not at exit
    except BrokenPipeError:  # `crossover ... | head`: the reader has all it wanted
        _silence_stdout()
        return BROKEN_PIPE
    except KeyboardInterrupt as exc:
        print(f"crossover: interrupted: {_kept(exc, args.command)}", file=sys.stderr)
        return INTERRUPTED
    except (TaskFailedError, PluginError) as exc:  # faults, not user mistakes
        print(f"crossover: error: {exc}", file=sys.stderr)
        return FAULT
    except CrossoverError as exc:
        print(f"crossover: error: {exc}", file=sys.stderr)
        return USER_ERROR
    return 0 if status is None else int(status)


def _kept(interrupt: KeyboardInterrupt, command: str) -> str:
    """One line: what a Ctrl-C left behind."""
    if isinstance(interrupt, CalibrationInterrupted):
        if not interrupt.kept:
            return "no implementation had finished a sample yet; nothing was kept"
        measured = ", ".join(f"{solver} {key} ({_count(samples, 'sample')})" for solver, key, samples in interrupt.kept)
        return f"kept the timings of {_count(len(interrupt.kept), 'implementation')} already measured: {measured}"
    if isinstance(interrupt, Interrupted) and str(interrupt):
        return str(interrupt)
    return f"{command} stopped; it had nothing to keep"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's final flush does not raise again (Python's recipe)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


# -- commands from plugins (the crossover_cli hook) ----------------------------------

class PluginCommands:
    """The subcommand group as one plugin's ``crossover_cli`` hook sees it.

    It adds parsers like argparse's own group, but refuses a built-in
    command's name or one another plugin took: argparse before 3.11 would
    silently replace that command instead.
    """

    def __init__(self, commands: argparse._SubParsersAction, plugin: str, owners: dict[str, str]):
        self._commands, self._plugin, self._owners = commands, plugin, owners
        self.added: list[str] = []

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        names = [name, *kwargs.get("aliases", ())]
        for each in names:
            owner = self._owners.get(each)
            if owner is not None:
                taken = "is a built-in command" if owner == "core" else f"was already added by plugin {owner!r}"
                raise PluginError(f"command {each!r} {taken}; a plugin cannot replace it")
        parser = self._commands.add_parser(name, **kwargs)
        for each in names:
            self._owners[each] = self._plugin
            self.added.append(each)
        return parser

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._commands, attribute)


def _add_plugin_commands(commands: argparse._SubParsersAction) -> None:
    """Let each registered plugin add its commands, one plugin at a time so a fault is pinned on it."""
    owners = {name: "core" for name in commands.choices}
    for impl in get_registry().manager.hook.crossover_cli.get_hookimpls():
        group = PluginCommands(commands, impl.plugin_name, owners)
        try:
            impl.function(*[{"subparsers": group}[name] for name in impl.argnames])
        except Exception as exc:
            _forget_commands(commands, group.added, owners)
            message = (f"crossover plugin {impl.plugin_name!r}: its crossover_cli hook raised "
                       f"{type(exc).__name__}: {exc}; its commands are left out")
            if env_flag("CROSSOVER_PLUGINS_STRICT"):
                raise PluginError(f"{message} (CROSSOVER_PLUGINS_STRICT is set)") from exc
            warnings.warn(message, PluginWarning, stacklevel=2)


def _forget_commands(commands: argparse._SubParsersAction, names: list[str], owners: dict[str, str]) -> None:
    """Take back the commands a failed hook added before it raised, so none of them half-works."""
    for name in names:
        commands.choices.pop(name, None)
        owners.pop(name, None)
    # the help listing reads this private list; argparse has no public way to remove a command
    commands._choices_actions[:] = [action for action in commands._choices_actions if action.dest not in names]


if __name__ == "__main__":
    sys.exit(main())
