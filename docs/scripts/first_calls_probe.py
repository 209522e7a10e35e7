"""First calls on new problems: named against auto, and one-offs a shape costs after the first.

Three parts (``python docs/scripts/first_calls_probe.py PART``), each in a
fresh wisdom store:

- ``rw``: ``example.random_walk`` on six new problems. Six calls naming
  torch on a new problem, then three ``core.solve`` calls (auto) on
  another new one, then three naming torch on each again. Tells whether
  a loop's kernels run slower because the loop chose them or because the
  problem is new.
- ``lr``: ``ml.linreg``'s ``torch:graph`` on sizes of every divisibility:
  the first call on each pays what a new size costs (its capture, and any
  compile the size triggers).
- ``dg``: ``ml.dotgat``'s ``torch:optimized_compiled`` on batches 33, 32,
  64, 33 of one configuration: which batch sizes recompile.
- ``hjb``: ``mfg.hjb_fdm`` on fifteen new small problems (Nx 23-51): the
  median overhead (wall less kernel, us) of calls 1-3, auto against
  naming numba, each loop on a fresh planner that first planned another
  problem (as ``crossover evaluate``'s loops). What planning a new
  problem costs a kernel of tens of microseconds.
- ``long``: the same against a user's process, which keeps one planner
  for every problem it solves. ``mfg.hjb_fdm`` on ``PROBE_COUNT`` (default
  150) new small problems (Nx 21-160, seeded held-out draws), three
  ``core.solve`` calls each: on one long-lived planner, on a fresh planner
  per problem that first planned another one (``crossover evaluate``'s
  loops), and naming numba. The median overhead of calls 1-3 over the
  first and the last third of the problems, and the planner's work
  observations at the end.
- ``phases``: where that first call's time goes. What reading each
  backend's free memory costs; then, for 200 new HJB problems (Nx 21-70),
  the median first-call overhead and the median time of each phase (the
  plan, the models' view, the loop's step, the run and its bookkeeping),
  auto or naming numba, with the free-memory reading fresh or stale (a
  process that solves a new problem every few seconds); then a cProfile
  of 120 auto first calls.
- ``evaluate``: ``crossover evaluate mfg.hjb_fdm`` itself (``PROBE_SOLVER``
  names another solver, ``PROBE_COUNT`` the problems), with each call's
  phases timed: auto against the calls naming the best, per call index;
  ``PROBE_PROFILE=1`` adds a cProfile of the auto loops' first calls.

Each line: what ran, then per call (implementation, wall ms, kernel ms).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator

os.environ.setdefault("CROSSOVER_CACHE_DIR", tempfile.mkdtemp(prefix="crossover-first-calls-"))

import core  # after the cache directory is chosen (the wisdom file is read on first use)
from core.costmodel.calibrate import ensure_calibrated
from core.costmodel.evaluate import warm_the_process
from core.costmodel.planner import Planner, current, use
from core.registry import get_solver
from core.solver import problem_from_params


def calls(solver: str, problem: object, backend: str, count: int = 3, primer: object = None,
          stale_memory: bool = False, around=contextlib.nullcontext,
          planner: Planner | None = None) -> list[tuple[str, float, float]]:
    """``count`` calls on a fresh planner (that first planned ``primer``, if given), or on ``planner``:
    (implementation, wall ms, kernel ms) each. ``stale_memory`` drops the process's free-memory readings first
    (as a call made over a second after the last one finds them); ``around()`` is entered around each call."""
    found = []
    with use(planner or Planner.from_calibration(current())):
        if primer is not None:
            core.plan(primer, solver=solver, expected_calls=math.inf, explain=False, calibrate=True)
        if stale_memory:
            current().process.memory_read = (-math.inf, {})
        for _ in range(count):
            with around():
                began = time.perf_counter()
                result = core.solve(problem, backend, solver=solver, expected_calls=math.inf)
                wall = time.perf_counter() - began
            found.append((result.backend, round(wall * 1e3, 3), round(result.seconds * 1e3, 3)))
    return found


def random_walk() -> None:
    solver = "example.random_walk"
    spec = get_solver(solver)
    ensure_calibrated(spec)
    warm_the_process(spec, True)
    for i, n in enumerate([35901, 195601, 6723, 1748, 111041, 11938]):
        named = problem_from_params(spec, {"n_walkers": n, "n_steps": 19 + i})
        chosen = problem_from_params(spec, {"n_walkers": n + 7, "n_steps": 19 + i})
        print("named-fresh", n, calls(solver, named, "torch", 6))
        print("auto-fresh ", n, calls(solver, chosen, "auto"))
        print("named-after", n, calls(solver, chosen, "torch"))
        print("named-after2", n, calls(solver, named, "torch"))


def linreg_graph() -> None:
    spec = get_solver("ml.linreg")
    for n in [1000, 16137, 16136, 32000000, 434341, 7703804, 2029]:
        problem = problem_from_params(spec, {"n_samples": n, "n_epochs": 10})
        problem.data()  # the inputs exist before the first call, as a user's do
        print("graph", n, calls(spec.name, problem, "torch:graph"))


def dotgat_batches() -> None:
    spec = get_solver("ml.dotgat")
    for batch in [33, 32, 64, 33]:
        problem = problem_from_params(spec, {"batch": batch, "n_steps": 2, "n_val": 30, "T": 16, "A": 8, "H": 32})
        print("dotgat", batch, calls(spec.name, problem, "torch:optimized_compiled", 2))


def hjb_overhead() -> None:
    import statistics

    spec = get_solver("mfg.hjb_fdm")
    ensure_calibrated(spec)
    warm_the_process(spec, True)
    primer = problem_from_params(spec, {"Nx": 21, "Nt": 12})
    rows: dict[str, list[list[float]]] = {"auto": [], "numba": []}
    for nx in range(23, 53, 2):
        for backend, found in rows.items():  # a new problem object each: nothing cached on it
            timed = calls(spec.name, problem_from_params(spec, {"Nx": nx}), backend, primer=primer)
            found.append([(wall - kernel) * 1e3 for _, wall, kernel in timed])  # ms -> us
    for backend, found in rows.items():
        print(f"{backend:6s} overhead us, calls 1-3 (median of {len(found)} problems):",
              [round(statistics.median(row[call] for row in found)) for call in range(3)])


def long_lived() -> None:
    import statistics

    from core.costmodel.design import held_out_problems
    from core.costmodel.evaluate import hold_inputs, primer

    spec = get_solver("mfg.hjb_fdm")
    ensure_calibrated(spec)
    warm_the_process(spec, True)
    earlier = primer(spec, True)
    count = int(os.environ.get("PROBE_COUNT", "150"))
    problems = [p for seed in range(10 * count) for p in held_out_problems(spec, True, count=12, seed=seed)
                if p.Nx <= 160][:count]
    rows: dict[str, list[list[float]]] = {"long-lived auto": [], "fresh auto": [], "numba": []}
    user = Planner.from_calibration(current())
    for problem in problems:
        hold_inputs(problem)
        timed = calls(spec.name, problem, "auto", planner=user)  # a user's process: one planner for everything
        rows["long-lived auto"].append([(wall - kernel) * 1e3 for _, wall, kernel in timed])
        for backend, name in (("auto", "fresh auto"), ("numba", "numba")):
            timed = calls(spec.name, problem, backend, primer=earlier)
            rows[name].append([(wall - kernel) * 1e3 for _, wall, kernel in timed])
    third = max(1, count // 3)
    def medians(found: list[list[float]]) -> list[int]:
        return [round(statistics.median(row[call] for row in found)) for call in range(3)]

    for name, found in rows.items():
        print(f"{name:15s} overhead us, calls 1-3, median of the first {third} problems:", medians(found[:third]),
              f"of the last {third}:", medians(found[-third:]))
    print("the long-lived planner's work observations:", len(user._work_seen(spec)))


PHASE_TIMES: dict[str, list[float]] = {}
_TIMING = [False]


def _timed(module: object, name: str) -> None:
    """Replace ``module.name`` by a wrapper that adds its time to PHASE_TIMES while a call is timed."""
    function = getattr(module, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        result = function(*args, **kwargs)
        if _TIMING[0]:
            PHASE_TIMES.setdefault(name, []).append(time.perf_counter() - began)
        return result

    setattr(module, name, wrapper)


@contextlib.contextmanager
def _timing() -> Iterator[None]:
    _TIMING[0] = True
    try:
        yield
    finally:
        _TIMING[0] = False


def first_call_phases() -> None:
    import cProfile
    import io
    import pstats
    import statistics

    import core.api as api
    import core.costmodel.plan as planmod
    from core.backend import safe_free_memory
    from core.registry import get_registry

    spec = get_solver("mfg.hjb_fdm")
    ensure_calibrated(spec)
    warm_the_process(spec, True)
    primer = problem_from_params(spec, {"Nx": 21, "Nt": 12})
    for name, backend in get_registry().backends.items():
        reads = []
        for _ in range(20):
            began = time.perf_counter()
            safe_free_memory(backend)
            reads.append(time.perf_counter() - began)
        print(f"free memory of {name}: {statistics.median(reads) * 1e6:.1f} us a reading")
    for name in ("plan", "_step", "_run", "_settling", "_next", "tier_up", "run_once", "_named"):
        _timed(api, name)
    for name in ("_view", "_decide"):
        _timed(planmod, name)
    sizes = [(21 + i, nt) for i in range(50) for nt in (10, 11, 13, 17)]
    for backend in ("auto", "numba"):
        for stale in (False, True):
            PHASE_TIMES.clear()
            overheads = [wall - kernel for nx, nt in sizes
                         for _, wall, kernel in calls(spec.name, problem_from_params(spec, {"Nx": nx, "Nt": nt}),
                                                      backend, 1, primer, stale, _timing)]
            phases = ", ".join(f"{name} {statistics.median(times) * 1e6:.0f}" for name, times in PHASE_TIMES.items())
            print(f"{backend}, {'stale' if stale else 'fresh'} free memory: first call "
                  f"{statistics.median(overheads) * 1e3:.0f} us over the kernel; phases (us): {phases}")
    profile = cProfile.Profile()
    for nx, nt in sizes[:120]:
        calls(spec.name, problem_from_params(spec, {"Nx": nx, "Nt": nt}), "auto", 1, primer, True,
              lambda: _profiling(profile))
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue()[:6000])


@contextlib.contextmanager
def _profiling(profile: object) -> Iterator[None]:
    profile.enable()
    try:
        yield
    finally:
        profile.disable()


def evaluate_phases() -> None:
    """``crossover evaluate`` on HJB, with each ``core.solve`` call's phases timed: auto against the calls naming
    the best, per call index (median over problems), so a gap between the two shows where it is spent."""
    import cProfile
    import io
    import pstats
    import statistics

    import core.api as api
    import core.costmodel.plan as planmod
    import core.costmodel.planner as plannermod
    from core.costmodel.evaluate import evaluate

    records: list[tuple[str, dict[str, float]]] = []
    judged: list[bool] = []  # the primer chosen: the loops evaluate judges begin
    solve = api.solve
    profile = cProfile.Profile() if os.environ.get("PROBE_PROFILE") == "1" else None

    def timed_solve(problem: object, backend: str = "auto", **kwargs: object) -> object:
        records.append((backend, {}))
        PHASE_TIMES.clear()
        # a second pass of each auto first call would not be a first call: the profile is of the timed ones
        profiled = profile is not None and judged and backend == "auto" and len(records) % 3 == 1
        with _timing(), (_profiling(profile) if profiled else contextlib.nullcontext()):
            began = time.perf_counter()
            result = solve(problem, backend, **kwargs)
            wall = time.perf_counter() - began
        phases = records[-1][1]
        phases.update({name: sum(times) for name, times in PHASE_TIMES.items()})
        phases["overhead"] = wall - result.seconds
        return result

    api.solve = timed_solve
    for name in ("plan", "_step", "_run", "_settling", "_settled", "_next", "tier_up", "run_once", "_named",
                 "_refuse_if_too_long"):
        _timed(api, name)
    for name in ("_view", "_decide"):
        _timed(planmod, name)
    for name in ("observe", "race", "count_call", "note_planning"):
        _timed(plannermod.Planner, name)
    import core.costmodel.evaluate as evaluation

    choose_primer = evaluation.primer

    def primer_then_record(*args: object) -> object:
        records.clear()  # the calls so far warmed the process (evaluate.warm_the_process): not the loops judged
        judged.append(True)
        return choose_primer(*args)

    evaluation.primer = primer_then_record
    solver = os.environ.get("PROBE_SOLVER", "mfg.hjb_fdm")
    report = evaluate(solver, count=int(os.environ.get("PROBE_COUNT", "12")), progress=False)
    auto = [phases for backend, phases in records if backend == "auto"]
    named = [phases for backend, phases in records if backend != "auto"]
    for label, found in (("auto", auto), ("named", named)):
        for call in range(3):
            rows = found[call::3]
            names = sorted({name for row in rows for name in row}, key=lambda n: -statistics.median(
                row.get(n, 0.0) for row in rows))
            print(f"{label} call {call + 1} (us, median of {len(rows)}):",
                  ", ".join(f"{n} {statistics.median(row.get(n, 0.0) for row in rows) * 1e6:.0f}" for n in names))
    print("loop ratios:", [round(row.loop_ratio, 2) for row in report.rows])
    if profile is not None:  # per first call, in us (pstats prints whole milliseconds): inflated by the profiler
        calls = max(1, len(auto) // 3)
        stats = pstats.Stats(profile, stream=io.StringIO()).stats
        rows = sorted(stats.items(), key=lambda item: -item[1][2])[:40]
        print(f"cProfile of the auto loops' first calls ({calls}): us per first call, own time then with callees")
        for (path, line, name), (_, count, own, total, _) in rows:
            print(f"{own / calls * 1e6:8.1f} {total / calls * 1e6:8.1f} {count / calls:6.1f}x "
                  f"{os.path.basename(path)}:{line}({name})")


PARTS = {"rw": random_walk, "lr": linreg_graph, "dg": dotgat_batches, "hjb": hjb_overhead, "long": long_lived,
         "phases": first_call_phases, "evaluate": evaluate_phases}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PARTS:
        sys.exit(f"usage: first_calls_probe.py {{{','.join(PARTS)}}}")
    PARTS[sys.argv[1]]()
