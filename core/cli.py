"""The ``crossover`` command line.

Every command prints a rich table for people and, with ``--json``, one JSON
document for scripts. A user mistake (unknown solver, backend or parameter,
a bad value) exits with status 2 and a one-line message listing the valid
choices; a fault while running exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import core
from core.errors import CrossoverError, TaskFailedError
from core.problem import make_problem
from core.registry import get_registry, get_solver

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
    problem = make_problem(spec.problem_type, _parse_params(args.param), base=spec.default_problem())
    result = core.solve(problem, backend=args.backend, solver=spec.name)
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
    statuses = core.backends(describe=False)
    for name, spec in core.solvers().items():
        problem = spec.default_problem()
        for backend in spec.backends:
            status = statuses.get(backend)
            if status is None or not status.available:
                reason = status.reason if status else "backend not registered"
                table.add_row(name, backend, "-", "-", f"[dim]skipped: {escape(reason)}[/dim]")
                payload.append({"solver": name, "backend": backend, "skipped": reason})
                continue
            try:
                first = core.solve(problem, backend=backend, solver=name)
                repeat = core.solve(problem, backend=backend, solver=name)
            except CrossoverError as exc:  # one broken pair must not hide the others
                table.add_row(name, backend, "-", "-", f"[red]failed: {escape(str(exc))}[/red]")
                payload.append({"solver": name, "backend": backend, "error": str(exc)})
                continue
            summary = spec.summarize(problem, repeat.outputs)
            table.add_row(name, backend, f"{first.seconds:.3f}", f"{repeat.seconds:.3f}", escape(summary))
            payload.append({"solver": name, "backend": backend, "first_seconds": first.seconds,
                            "repeat_seconds": repeat.seconds, "summary": summary})
    _emit(args, payload, table)
    return 0


# -- parser ---------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser = argparse.ArgumentParser(prog="crossover", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"crossover {core.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("backends", parents=[common], help="list backends, whether they run here and why not")
    commands.add_parser("plugins", parents=[common], help="list plugins and the solvers they provide")
    commands.add_parser("demo", parents=[common], help="run every solver's default problem on every backend")
    run = commands.add_parser("run", parents=[common], help="run one solver")
    run.add_argument("solver")
    run.add_argument("--backend", default="auto", help="backend name (default: auto)")
    run.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="set a problem field of the solver's default problem (repeatable)")
    run.add_argument("--save", metavar="FILE.npz", help="write the outputs to a .npz file")
    return parser


COMMANDS = {"backends": cmd_backends, "plugins": cmd_plugins, "run": cmd_run, "demo": cmd_demo}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except TaskFailedError as exc:
        print(f"crossover: error: {exc}", file=sys.stderr)
        return FAULT
    except CrossoverError as exc:
        print(f"crossover: error: {exc}", file=sys.stderr)
        return USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
