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
import threading
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
from core.costmodel.planner import current
from core.costmodel.store import WisdomWarning
from core.errors import CrossoverError, PluginError, PluginWarning, TaskFailedError
from core.progress import PROGRESS_SECONDS
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


def number_option(option: str, text: str | float | None, *, minimum: float, integer: bool = False,
                  strict: bool = False, maximum: float | None = None, infinite: bool = False,
                  allowed: str) -> float | int | None:
    """A numeric option, checked before any work: None stays None, else a number within range.

    Anything else is a :class:`UsageError` of one line (status 2, as every
    user mistake): ``--budget=-5 is invalid: must be a number of seconds > 0``.
    ``infinite`` lets ``inf`` through (a float option that means "no limit").
    Options are parsed here rather than by argparse's ``type=``, whose errors
    take two lines and cannot say what is allowed.
    """
    if text is None:
        return None
    raw = str(text).strip()
    try:
        number: float | int | None = int(raw) if integer else float(raw)
    except ValueError:
        number = None
    fine = number is not None and (math.isfinite(number) or (infinite and number == math.inf))
    fine = fine and (number > minimum if strict else number >= minimum)
    if not fine or (maximum is not None and number > maximum):
        shown = raw if raw.isprintable() and 0 < len(raw) <= 40 else repr(raw[:40])
        raise UsageError(f"{option}={shown} is invalid: {allowed}")
    return number


def _calls_option(text: str | None) -> float | None:
    return number_option("--calls", text, minimum=1, infinite=True,
                         allowed="must be a number of calls >= 1 to spread one-off costs over, or inf to ignore them")


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
    calls = _calls_option(args.calls)
    spec = get_solver(args.solver)
    problem = problem_from_params(spec, _parse_params(args.param))
    target = save_target(args.save, spec.name) if args.save else None  # a bad path fails before the solve
    result = core.solve(problem, backend=args.backend, solver=spec.name, expected_calls=calls)
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


def _blame(name: str, doing: str, exc: BaseException) -> str:
    """One line naming the plugin and the solver (a PluginError from a guarded spec function already does)."""
    if isinstance(exc, PluginError) and name in str(exc):
        return str(exc)
    owner = get_registry().solver_owner.get(name, "?")
    return f"plugin {owner!r}: solver {name!r}: {doing} raised {type(exc).__name__}: {exc}"


DEMO_NOISE = 0.005  # s: a first call's excess below this (or 10 % of a warm call) is timing noise, not a one-off
HEARTBEAT_SECONDS = 5.0  # a wait that outlasts PROGRESS_SECONDS says so again this often
TICK_SECONDS = 0.25  # how often the progress thread looks at the wait in progress
STARTS = {"numba": "Numba's thread pool start", "process": "process pool start", "torch": "CUDA start",
          "dask": "cluster connection"}
DEMO_HEADER = (
    "crossover demo: each solver's default problem, twice on each implementation that runs here.",
    "per call s: the second call, warm. first call s: the first call's whole wait, * where it was the first "
    "in this process and paid the one-offs (listed under each table); unmarked, they were paid earlier.",
    "auto chose: core.plan's choice after these runs (a solver not calibrated here chooses from the runs alone; "
    "`crossover calibrate` lets it predict).",
)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run every solver's default problem on every backend that runs here, and show what auto chose.

    Each pair runs twice: the first call pays what is still unpaid in this
    process (JIT compile, pool start, CUDA context), the repeat shows the
    steady state. Per solver, the table is followed by auto's choice with
    the plan's reason and what it saves against the fixed backends, and by
    the one-offs paid in this process. Progress goes to standard error from
    the start; a solver whose plugin fails is named in one line and the
    others go on.
    """
    solvers = core.solvers()
    progress = _DemoProgress(len(solvers))
    statuses = core.backends(describe=False)
    sections: list[list[dict[str, Any]]] = []
    try:
        for name, spec in solvers.items():
            progress.solver(name)
            sections.append(_demo_solver(name, spec, statuses, progress))
    except KeyboardInterrupt:
        raise Interrupted(f"the demo stopped during {progress.current}; {_count(progress.done, 'run')} finished, "
                          "nothing else to keep") from None
    finally:
        progress.stop()
    payload = [row for rows in sections for row in rows]
    if args.json:
        _emit(args, payload)
    else:
        _print_demo(sections)
    return FAULT if any("error" in row for row in payload) else 0


def _demo_solver(name: str, spec: Any, statuses: Mapping[str, Any], progress: _DemoProgress) -> list[dict[str, Any]]:
    """One solver's rows: each implementation run twice, skipped or failed; then auto's choice (backend "auto")."""
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
            row.update(_demo_pair(name, spec, problem, backend, progress))
        except (Exception, SystemExit) as exc:  # one broken pair must not hide the others
            message = _blame(name, f"solving on {backend}", exc)
            progress.note(message)
            rows.append({**row, "error": message})
            continue
        progress.finished()
        rows.append(row)
    return [*rows, _demo_auto(name, spec, problem, rows)]


def _demo_pair(name: str, spec: Any, problem: Any, key: str, progress: _DemoProgress) -> dict[str, Any]:
    """Two calls of one implementation, and what the first paid that was still unpaid in this process."""
    planner = current()
    backend = backend_of(key)
    has_start = get_registry().backends[backend].start is not None
    starts = has_start and backend not in planner.process.started
    compiles = not planner.is_paid(spec, key, problem)
    progress.pair(name, key, first=starts or compiles)
    waits, results = [], []
    for call in range(2):
        if call:
            progress.repeat()
        began = time.perf_counter()
        # no time limit: the default problems are the plugins' own small ones, and bounding one that has no
        # model would first calibrate it (a quick calibration per pair: most of a fresh clone's demo)
        results.append(core.solve(problem, backend=key, solver=name, max_seconds=math.inf))
        waits.append(time.perf_counter() - began)
    first, repeat = results
    # a backend starts before the timed run: its start is the first wait's excess outside the run, over the repeat's
    start = max(0.0, (waits[0] - first.seconds) - (waits[1] - repeat.seconds)) if starts else 0.0
    return {"first_call_seconds": waits[0], "first_seconds": first.seconds, "repeat_seconds": repeat.seconds,
            "paid_here": starts or compiles,
            "backend_start": "here" if starts else ("earlier" if has_start else None), "start_seconds": start,
            "first_run": "here" if compiles else "earlier",
            "first_run_excess_seconds": max(0.0, first.seconds - repeat.seconds) if compiles else 0.0,
            "summary": spec.summarize(problem, repeat.outputs)}


def _demo_auto(name: str, spec: Any, problem: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What auto chose for this problem after the runs (one-offs paid, warm runs known), why, and what it saves."""
    auto: dict[str, Any] = {"solver": name, "backend": "auto"}
    try:
        decision = core.plan(problem, solver=name, explain=False)  # never calibrates: the demo stays short
    except CrossoverError as exc:  # nothing calibrated and nothing ran: no choice to show
        return {**auto, "unavailable": str(exc)}
    except (Exception, SystemExit) as exc:  # a broken plugin must not stop the demo of the others
        return {**auto, "error": _blame(name, "core.plan()", exc)}
    chosen = decision.backend
    ran = {row["backend"]: row["repeat_seconds"] for row in rows if "repeat_seconds" in row}
    mine = ran.get(chosen)
    return {**auto, "chose": chosen, "reason": decision.reason, "confident": decision.confident,
            "basis": _demo_basis(spec, chosen, decision.predictions.get(chosen)), "seconds": mine,
            # the fraction of each fixed implementation's warm time that auto's choice saves (negative: it costs)
            "saving": {key: 1.0 - mine / seconds for key, seconds in ran.items() if key != chosen and mine is not None
                       and seconds > 0}}


def _demo_basis(spec: Any, key: str, prediction: Any) -> str:
    """What the chosen prediction rests on, in a few words."""
    if prediction is None:
        return "no prediction"
    if prediction.status != "measured":
        return f"its {prediction.status} model"
    runs = _count(prediction.samples, "warm run")
    if current().model(spec, key) is not None:
        return f"its calibrated model and {runs} here"
    return f"{runs} here alone, not calibrated on this machine"


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


def _print_demo(sections: list[list[dict[str, Any]]]) -> None:
    """Per solver: its table, the line saying what auto chose, and the line of one-offs paid in this process."""
    console = _console(DEMO_WIDTH)
    # every table's first column as wide as the longest implementation key: names are never cut, tables align
    names = max((len(row["backend"]) for rows in sections for row in rows if row["backend"] != "auto"), default=0)
    for line in DEMO_HEADER:
        console.print(escape(line))
    for rows in sections:
        pairs = [row for row in rows if row["backend"] != "auto"]
        auto = next((row for row in rows if row["backend"] == "auto"), None)
        chosen = auto.get("chose") if auto else None
        table = Table(title=f"[bold]{escape(rows[0]['solver'])}[/bold]", title_justify="left")
        table.add_column("implementation", no_wrap=True, min_width=names, overflow="fold")
        table.add_column("per call s", justify="right", no_wrap=True)
        table.add_column("first call s", justify="right", no_wrap=True)
        table.add_column("answer")
        for row in _merge_skipped(pairs):
            table.add_row(*_demo_cells(row), style="bold" if row["backend"] == chosen else None)
        console.print()
        console.print(table)
        if auto is not None:
            console.print(escape(_auto_line(auto)))
            console.print(escape(_one_offs_line(pairs)))


def _demo_cells(row: Mapping[str, Any]) -> tuple[str, str, str, str]:
    if "skipped" in row:
        return row["backend"], "-", "-", f"[dim]skipped: {escape(row['skipped'])}[/dim]"
    if "error" in row:
        return row["backend"], "-", "-", f"[red]failed: {escape(row['error'])}[/red]"
    mark = "*" if row["paid_here"] else " "
    return (row["backend"], f"{row['repeat_seconds']:.3f}", f"{row['first_call_seconds']:.3f}{mark}",
            escape(row["summary"]))


def _auto_line(auto: Mapping[str, Any]) -> str:
    """``auto chose KEY: the plan's reason (its basis); saving X% against the slowest, Y% against numpy``."""
    if "chose" not in auto:
        return f"auto chose nothing: {auto.get('unavailable') or auto.get('error')}"
    chosen, mine, saving = auto["chose"], auto["seconds"], auto["saving"]
    line = f"auto chose {chosen}: {auto['reason']} ({auto['basis']})"
    if mine is None:
        return f"{line}; {chosen} did not run here"
    if not saving:
        return f"{line}; the only implementation that ran here"
    slowest, fastest = max(saving, key=saving.get), min(saving, key=saving.get)  # the most saved: the slowest
    parts = []
    if saving[slowest] > 0:
        parts.append(f"saving {saving[slowest]:.0%} against {slowest} (the slowest)")
    if "numpy" in saving and slowest != "numpy":
        parts.append(f"{saving['numpy']:.0%} against numpy")
    if saving[fastest] < 0:  # a simpler choice within the margin, or the models' error: said, never hidden
        parts.append(f"{-saving[fastest]:.0%} slower than {fastest}, the fastest here")
    return f"{line}; {', '.join(parts)}" if parts else line


def _one_offs_line(pairs: list[dict[str, Any]]) -> str:
    """The one-offs this solver's runs paid in this process, with seconds, and those paid earlier in it."""
    paid, earlier, due, started = [], [], False, set()
    for row in pairs:
        if "repeat_seconds" not in row:
            continue
        key, backend = row["backend"], backend_of(row["backend"])
        due = due or row["paid_here"]
        start = STARTS.get(backend, f"{backend} start")
        if row["backend_start"] == "here":
            started.add(backend)
            if row["start_seconds"] >= DEMO_NOISE:
                paid.append(f"{start} {row['start_seconds']:.2f} s (with {key})")
        elif row["backend_start"] == "earlier" and backend not in started and start not in earlier:
            earlier.append(start)
        if row["first_run"] == "here" and row["first_run_excess_seconds"] >= max(DEMO_NOISE,
                                                                                 0.1 * row["repeat_seconds"]):
            compile_ = " (JIT compile)" if backend == "numba" else ""
            paid.append(f"{key} first run +{row['first_run_excess_seconds']:.2f} s{compile_}")
    before = f"; paid earlier in this process: {', '.join(earlier)}" if earlier else ""
    if paid:
        return f"one-offs paid in this process: {'; '.join(paid)}{before}"
    if due:
        return f"one-offs paid in this process: none measurable (each first call within noise of its repeat){before}"
    if earlier:
        return f"one-offs: none left to pay (paid earlier in this process: {', '.join(earlier)})"
    if any("repeat_seconds" in row for row in pairs):
        return "one-offs: none left to pay, all paid earlier in this process"
    return "one-offs: none (nothing ran)"


class _DemoProgress:
    """What the demo is doing, on standard error from its first moment.

    On a terminal a transient status line names the run in progress; piped,
    one plain line per run, so a log shows where the time went. A wait
    longer than :data:`~core.progress.PROGRESS_SECONDS` (a first Numba
    compile takes a minute on a fresh clone) says how long it has taken so
    far, and again every :data:`HEARTBEAT_SECONDS`, from a thread of its own.
    """

    def __init__(self, solvers: int):
        self.current, self.done = "its start", 0
        self._status = None
        self._lock = threading.Lock()
        self._began: float | None = None  # when the step in progress began
        self._next = math.inf  # when the next "so far" line is due
        self._phase = ""
        self._quit = threading.Event()
        err = Console(stderr=True, highlight=False)
        print(f"crossover demo: {_count(solvers, 'solver')}, each implementation run twice (first call, then repeat); "
              "progress below, the table at the end", file=sys.stderr, flush=True)
        if err.is_terminal:
            self._status = err.status("starting")
            self._status.start()
        self._ticker = threading.Thread(target=self._tick, name="crossover-demo-progress", daemon=True)
        self._ticker.start()

    def solver(self, name: str) -> None:
        self._begin(name, "its default problem")
        self._say(f"{name}: default problem")

    def pair(self, name: str, backend: str, first: bool = False) -> None:
        """Its first call begins; ``first``: the first in this process, which pays any one-off still due."""
        self._begin(f"{name} on {backend}", "its first call in this process, which pays any one-off due (a JIT "
                    "compile, a pool start)" if first else "its first call, all one-offs paid earlier")
        self._say(f"{name} on {backend} ...")

    def repeat(self) -> None:
        """The pair's second call begins (said only if it outlasts PROGRESS_SECONDS)."""
        self._begin(self.current, "the repeat")

    def finished(self) -> None:
        self.done += 1

    def note(self, message: str) -> None:
        """A failure: always one plain line, also on a terminal."""
        if self._status is not None:
            self._status.console.print(f"crossover demo: {escape(message)}")
        else:
            print(f"crossover demo: {message}", file=sys.stderr, flush=True)

    def _begin(self, doing: str, phase: str) -> None:
        with self._lock:
            self.current, self._phase = doing, phase
            self._began = time.monotonic()
            self._next = self._began + PROGRESS_SECONDS

    def _tick(self) -> None:
        while not self._quit.wait(TICK_SECONDS):
            with self._lock:
                now = time.monotonic()
                if self._began is None or now < self._next:
                    continue
                self._next = now + HEARTBEAT_SECONDS
                text = f"{self.current}: {now - self._began:.0f} s so far, {self._phase}"
            self._say(text)

    def _say(self, text: str) -> None:
        if self._status is not None:
            self._status.update(escape(text))
        else:
            print(f"crossover demo: {text}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._quit.set()
        self._ticker.join(timeout=1.0)
        if self._status is not None:
            self._status.stop()


def _solver_names(names: Sequence[str]) -> list[str]:
    return [get_solver(name).name for name in names] if names else sorted(core.solvers())


def cmd_calibrate(args: argparse.Namespace) -> int:
    from core.costmodel.calibrate import calibrate

    budget = number_option("--budget", args.budget, minimum=0, strict=True,
                           allowed="must be a number of seconds > 0 (the most to spend on each solver)")
    reports = calibrate(_solver_names(args.solvers), quick=not args.full, budget=budget,
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
            # earlier samples the calibration kept (it never replaces them with fewer), when there are any
            samples = str(row.samples) + (f" (+{row.stored_samples - row.samples} kept)"
                                          if row.stored_samples > row.samples else "")
            table.add_row(report.solver, row.backend, samples, str(row.skipped), start, one_off,
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
    calls = _calls_option(args.calls)
    spec = get_solver(args.solver)
    problem = problem_from_params(spec, _parse_params(args.param))
    decision = core.plan(problem, solver=spec.name, expected_calls=calls, calibrate=True)
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

    count = number_option("--count", args.count, minimum=1, integer=True, maximum=10_000,
                          allowed="must be a whole number of held-out problems from 1 to 10000")
    seed = number_option("--seed", args.seed, minimum=0, integer=True, maximum=2**64 - 1,
                         allowed="must be a whole number from 0 to 2**64-1")
    calls = number_option("--calls", args.calls, minimum=1, integer=True, maximum=1_000,
                          allowed="must be a whole number of core.solve calls per problem from 1 to 1000")
    report = evaluate(get_solver(args.solver).name, quick=not args.full, count=count, seed=seed, calls=calls)
    backends = sorted({b for row in report.rows for b in row.seconds})
    table = Table(title=f"evaluate {report.solver}: held-out problems, warm seconds per solve")
    for column in ("problem", *backends, "best", f"core.solve, calls 1-{report.calls}", "final regret",
                   "loop / best", "model's pick", "pick regret", "measured / predicted"):
        table.add_column(column)
    for row in report.rows:
        problem = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.params.items())
        table.add_row(escape(problem), *[f"{row.seconds[b]:.4g}" if b in row.seconds else "-" for b in backends],
                      row.best, " > ".join(row.calls), f"{row.final_regret:.1%}", _loop_cell(row),
                      row.chosen, f"{row.regret:.1%}", f"{row.measured_over_predicted:.2f}")
    worst = [f"worst: {row.final_regret:.1%} at {row.params}: core.solve ran {row.final} on call {report.calls}, "
             f"{row.best} was fastest ({_predicted_against_measured(row, row.final)}; "
             f"{_predicted_against_measured(row, row.best)})"
             for row in report.worst(3) if row.final_regret > 0]
    _emit(args, report.to_dict(), table, *worst,
          f"core.solve on call {report.calls}: median regret {report.median_final_regret:.1%}, maximum "
          f"{report.max_final_regret:.1%}; the loop's total {report.median_loop_ratio:.2f}x (median), at most "
          f"{report.max_loop_ratio:.2f}x that of {report.calls} calls naming the best implementation, "
          f"over {len(report.rows)} held-out problems",
          f"the models' pick alone: median regret {report.median_regret:.1%}, maximum {report.max_regret:.1%}; "
          f"measured / predicted within [0.5, 2] on {report.predictions_within_2x:.0%} of the problems")
    return 0


def _loop_cell(row: Any) -> str:
    """The loop's ratio, and where the pair ran more than once, how many runs its median is of and the first's."""
    if len(row.loop_ratios) < 2:
        return f"{row.loop_ratio:.2f}x"
    return f"{row.loop_ratio:.2f}x (median of {len(row.loop_ratios)}; first {row.first_loop_ratio:.2f}x)"


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
    run.add_argument("--calls", default=None, metavar="N",
                     help="with auto: expected calls (>= 1, or inf) to spread one-off costs (JIT, pool start) over")

    calibrate = commands.add_parser("calibrate", parents=[common], help="measure solvers on every backend")
    calibrate.add_argument("solvers", nargs="*", metavar="SOLVER", help="default: every registered solver")
    mode = calibrate.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small designed set, 25 s budget per solver (default)")
    mode.add_argument("--full", action="store_true",
                      help="larger designed set over the full space, 600 s budget per solver")
    calibrate.add_argument("--budget", metavar="SECONDS",
                           help="total seconds per solver (> 0); the samples are added to those stored")

    plan = commands.add_parser("plan", parents=[common], help="show which backend auto-selection picks and why")
    plan.add_argument("solver")
    plan.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--calls", default=None, metavar="N",
                      help="expected calls (>= 1, or inf) to spread one-off costs over (default: learnt from this "
                           "process)")

    report = commands.add_parser("report", parents=[common], help="plot the models and break-even sizes")
    report.add_argument("solvers", nargs="*", metavar="SOLVER")
    report.add_argument("-o", "--output", default="crossover-report", metavar="DIR")

    evaluate = commands.add_parser("evaluate", parents=[common], help="regret of auto-selection off the ladder")
    evaluate.add_argument("solver")
    evaluate.add_argument("--full", action="store_true", help="draw held-out problems from the full size space")
    evaluate.add_argument("--count", default="12", help="random held-out problems (default 12)")
    evaluate.add_argument("--seed", default="2024", help="seed of the held-out draw")
    evaluate.add_argument("--calls", default="3", help="core.solve calls per problem (default 3)")
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
    except CrossoverError as exc:  # a malformed setting read while plugins load (CROSSOVER_PLUGINS_STRICT=maybe)
        print(f"crossover: error: {exc}", file=sys.stderr)
        return USER_ERROR
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
