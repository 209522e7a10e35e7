"""The ``crossover`` command line.

Every command prints a rich table for people and, with ``--json``, one JSON
document for scripts. A user mistake (unknown solver, backend or parameter,
a bad value) exits with status 2 and a one-line message listing the valid
choices; a fault while running exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import core
from core.costmodel.store import WisdomWarning
from core.errors import CrossoverError, PluginError, PluginWarning, TaskFailedError
from core.registry import get_registry, get_solver
from core.running import implementations
from core.solver import backend_of, problem_from_params
from core.validation import env_flag

USER_ERROR, FAULT = 2, 1


class UsageError(CrossoverError, ValueError):
    """A malformed command line (the message says how to fix it)."""


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # piped output: don't squeeze tables into 80 columns
        console = Console(highlight=False, width=160)
    return console


def _emit(args: argparse.Namespace, payload: Any, table: Table | None = None, *lines: str) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, default=_jsonable))
        return
    console = _console()
    if table is not None:
        console.print(table)
    for line in lines:
        console.print(escape(line))


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


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
    result = core.solve(problem, backend=args.backend, solver=spec.name, expected_calls=args.calls)
    if args.save:
        result.save(args.save)
    summary = spec.summarize(problem, result.outputs)
    payload = {"solver": spec.name, "backend": result.backend, "seconds": result.seconds, "summary": summary,
               "outputs": {k: v for k, v in result.outputs.items() if v.size <= 64}}
    _emit(args, payload, None, f"{spec.name} on {result.backend}: {result.seconds:.3f} s",
          summary, *([f"outputs saved to {args.save}"] if args.save else []))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Run every solver's default problem on every backend that runs here.

    Each pair runs twice: the first call pays one-off costs (JIT compile,
    pool start, CUDA context), the repeat shows the steady state.
    """
    table = Table(title="crossover demo: default problems on every available backend")
    for column in ("solver", "backend", "first call s", "repeat s", "answer"):
        table.add_column(column)
    payload = []
    failed = 0
    statuses = core.backends(describe=False)
    for name, spec in core.solvers().items():
        problem = spec.default_problem()
        for backend in implementations(spec):
            status = statuses.get(backend_of(backend))
            reason = (status.reason if status else "backend not registered") if not (status and status.available) \
                else spec.supports(problem, backend)
            if reason:
                table.add_row(name, backend, "-", "-", f"[dim]skipped: {escape(reason)}[/dim]")
                payload.append({"solver": name, "backend": backend, "skipped": reason})
                continue
            try:
                first = core.solve(problem, backend=backend, solver=name)
                repeat = core.solve(problem, backend=backend, solver=name)
            except Exception as exc:  # one broken pair must not hide the others
                failed += 1
                message = f"{type(exc).__name__}: {exc}"
                table.add_row(name, backend, "-", "-", f"[red]failed: {escape(message)}[/red]")
                payload.append({"solver": name, "backend": backend, "error": message})
                continue
            summary = spec.summarize(problem, repeat.outputs)
            table.add_row(name, backend, f"{first.seconds:.3f}", f"{repeat.seconds:.3f}", escape(summary))
            payload.append({"solver": name, "backend": backend, "first_seconds": first.seconds,
                            "repeat_seconds": repeat.seconds, "summary": summary})
    _emit(args, payload, table)
    return FAULT if failed else 0


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
        for row in report.backends:
            one_off = "-" if row.one_off_seconds is None else f"{row.one_off_seconds:.3f}"
            start = "-" if row.start_seconds is None else f"{row.start_seconds:.3f}"
            table.add_row(report.solver, row.backend, str(row.samples), str(row.skipped), start, one_off,
                          f"{row.seconds_spent:.1f}", escape(row.stopped))
        payload.append({"solver": report.solver, "seconds": report.seconds,
                        "backends": [vars(row) for row in report.backends]})
    totals = [f"{r.solver}: {r.problems} designed problems, {r.seconds:.1f} s in all" for r in reports]
    _emit(args, payload, table, *totals)
    return 0


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
    _emit(args, decision.to_dict(), table, *lines)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from core.costmodel.calibrate import ensure_calibrated
    from core.costmodel.report import write_report

    names = _solver_names(args.solvers)
    for name in names:
        ensure_calibrated(get_solver(name))
    paths = write_report(names, args.output)
    _emit(args, [str(p) for p in paths], None, *[f"wrote {p}" for p in paths])
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from core.costmodel.evaluate import evaluate

    report = evaluate(get_solver(args.solver).name, quick=not args.full, count=args.count, seed=args.seed)
    backends = sorted({b for row in report.rows for b in row.seconds})
    table = Table(title=f"evaluate {report.solver}: held-out problems, seconds per solve")
    for column in ("problem", *backends, "model's pick", "best", "regret", "auto (measures when unsure)",
                   "auto regret"):
        table.add_column(column)
    for row in report.rows:
        problem = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.params.items())
        table.add_row(escape(problem), *[f"{row.seconds[b]:.4g}" if b in row.seconds else "-" for b in backends],
                      row.chosen, row.best, f"{row.regret:.1%}", row.auto + ("" if row.confident else " (measured)"),
                      f"{row.auto_regret:.1%}")
    worst = [f"worst: {row.regret:.1%} at {row.params}: chose {row.chosen}, {row.best} was fastest"
             for row in report.worst(3) if row.regret > 0]
    _emit(args, report.to_dict(), table, *worst,
          f"median regret {report.median_regret:.1%}, maximum regret {report.max_regret:.1%} "
          f"over {len(report.rows)} held-out problems (the models' pick, no measuring)",
          f"auto, measuring when unsure: median regret {report.median_auto_regret:.1%}, "
          f"maximum regret {report.max_auto_regret:.1%}")
    return 0


# -- parser ---------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser = argparse.ArgumentParser(
        prog="crossover", description="Run each solver on the backend that is measurably fastest for it here.")
    parser.add_argument("--version", action="version", version=f"crossover {core.__version__}")
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
    except PluginError as exc:  # a broken plugin under CROSSOVER_PLUGINS_STRICT=1
        print(f"crossover: error: {exc}", file=sys.stderr)
        return FAULT
    args = parser.parse_args(argv)
    command = COMMANDS.get(args.command) or getattr(args, "handler", None)
    if command is None:
        print(f"crossover: error: command {args.command!r} names no function to run; its plugin must call "
              "parser.set_defaults(handler=fn)", file=sys.stderr)
        return FAULT
    try:
        status = command(args)
    except (TaskFailedError, PluginError) as exc:  # faults, not user mistakes
        print(f"crossover: error: {exc}", file=sys.stderr)
        return FAULT
    except CrossoverError as exc:
        print(f"crossover: error: {exc}", file=sys.stderr)
        return USER_ERROR
    return 0 if status is None else int(status)


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
