"""Does a busy machine, or something else in the process, stall Numba's threads? Times numba solves in each case.

Solves ``example.random_walk`` (``--walkers``, default 1,518 walkers x 17
steps) on numba, over and over for at least half a second (and at least 15
times), in each case: quiet; beside competing CPU-bound processes that
never sleep (``--competitors``, default one; started and stopped here);
after a process-pool map; after a torch solve (where a GPU exists); after
the pool's shutdown. Prints each case's median and mean solve time and
their ratios to the quiet case: the median is the typical solve, the mean
what a run of many solves pays (a competitor that stalls one solve in
three leaves the median alone). Before each case it waits (up to
``--idle-wait`` seconds) until other processes leave the host idle, and
it prints the cores they used while the case ran (Linux, "others"), so
that a "quiet" time taken beside someone else's job is seen as such.

    python docs/scripts/numba_stall_probe.py
    python docs/scripts/numba_stall_probe.py --spin runtime    # libgomp's own spinning (the behaviour before)
    python docs/scripts/numba_stall_probe.py --compare --walkers 1518 200000 --competitors 1 2

``--spin crossover`` (the default) runs with the OpenMP settings crossover
chooses (:mod:`core.backends.openmp_spin`); ``--spin runtime`` sets
libgomp's own default explicitly (``GOMP_SPINCOUNT=300000``, what libgomp
spins when nothing is set), which crossover then leaves alone: the
behaviour before crossover bounded the spinning. ``--compare`` runs both,
each in a fresh process (the OpenMP runtime reads its settings once, when
it loads), and prints them side by side. The solves use a private wisdom
store (a temporary ``CROSSOVER_CACHE_DIR``), so that timings taken beside
competing processes never reach the user's. Needs no network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNTIME_DEFAULT = {"GOMP_SPINCOUNT": "300000"}  # libgomp's spin when nothing is set, spelled out
SPINS = ("runtime", "crossover")  # before, after


def solve_times(core, spec, problem, key: str, repeats: int, min_seconds: float) -> list[float]:
    """Seconds of each solve after a first one: at least ``repeats`` solves and ``min_seconds`` in all."""
    core.solve(problem, backend=key, solver=spec.name)
    times: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(times) < repeats or time.perf_counter() < deadline:
        began = time.perf_counter()
        core.solve(problem, backend=key, solver=spec.name)
        times.append(time.perf_counter() - began)
    return times


def _cpu_seconds_elsewhere() -> float | None:
    """CPU seconds the host has spent outside this process and its descendants (Linux), or None."""
    try:
        with open("/proc/stat") as stat:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, stat.readline().split()[1:9])
        busy = user + nice + system + irq + softirq + steal
        parents, ticks = {}, {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        fields = stat.read().rsplit(")", 1)[1].split()
                except OSError:  # it ended meanwhile
                    continue
                parents[int(entry)], ticks[int(entry)] = int(fields[1]), int(fields[11]) + int(fields[12])
    except (OSError, ValueError):
        return None
    ours, found = {os.getpid()}, True
    while found:  # the competitors, the pool's forkserver and its workers
        found = False
        for pid, parent in parents.items():
            if parent in ours and pid not in ours:
                ours.add(pid)
                found = True
    return (busy - sum(ticks[pid] for pid in ours if pid in ticks)) / os.sysconf("SC_CLK_TCK")


def wait_for_idle_host(limit_s: float, window_s: float = 1.0) -> None:
    """Wait until other processes use under a tenth of a core for ``window_s``, or ``limit_s`` passed."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = _cpu_seconds_elsewhere()
        if before is None:
            return
        time.sleep(window_s)
        if _cpu_seconds_elsewhere() - before < 0.1 * window_s:
            return


def start_competitors(count: int) -> list[subprocess.Popen]:
    """``count`` CPU-bound processes that never sleep, as other users' jobs would be."""
    competitors = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.3)  # let them start and settle on cores
    return competitors


def measure(walkers: list[int], competitors: list[int], repeats: int, min_seconds: float, idle_wait: float) -> dict:
    """The machine, the OpenMP settings and one row per case and size, in this process."""
    import numba

    import core
    from core.backends import openmp_spin, process_pool
    from core.costmodel.store import cpu_model
    from core.registry import get_solver
    from core.solver import problem_from_params

    spec = get_solver("example.random_walk")
    problems = [problem_from_params(spec, {"n_walkers": n, "n_steps": 17}) for n in walkers]
    rows = []

    def timed(case: str) -> None:
        for n, problem in zip(walkers, problems):
            began, elsewhere = time.perf_counter(), _cpu_seconds_elsewhere()
            times = solve_times(core, spec, problem, "numba", repeats, min_seconds)
            seconds = time.perf_counter() - began
            others = None if elsewhere is None else max(0.0, _cpu_seconds_elsewhere() - elsewhere) / seconds
            rows.append({"case": case, "walkers": n, "median_ms": 1e3 * statistics.median(times),
                         "mean_ms": 1e3 * statistics.fmean(times), "others": others})

    wait_for_idle_host(idle_wait)
    timed("quiet")
    for count in competitors:
        wait_for_idle_host(idle_wait)
        running = start_competitors(count)
        try:
            timed(f"beside {count} CPU-bound process" + ("es" if count > 1 else ""))
        finally:
            for competitor in running:
                competitor.kill()
                competitor.wait()
    wait_for_idle_host(idle_wait)
    core.solve(problems[0], backend="process", solver=spec.name)
    timed("after a process-pool map")
    if core.availability("torch").available:
        core.solve(problems[0], backend="torch", solver=spec.name)
        timed("after a torch solve")
    process_pool.shutdown()
    wait_for_idle_host(idle_wait)
    timed("after the pool's shutdown")
    return {"host": f"{cpu_model()}, {os.cpu_count()} cores", "threading_layer": numba.threading_layer(),
            "openmp": openmp_spin.describe(), "rows": rows}


def run_fresh(spin: str, args: argparse.Namespace) -> dict:
    """:func:`measure` in a fresh process, for one ``--spin``."""
    command = [sys.executable, os.path.abspath(__file__), "--json", "--spin", spin, "--repeats", str(args.repeats),
               "--min-seconds", str(args.min_seconds), "--idle-wait", str(args.idle_wait),
               "--walkers", *map(str, args.walkers), "--competitors", *map(str, args.competitors)]
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(results: dict[str, dict]) -> None:
    """One line per case and size; per ``--spin``: median and mean with their ratios to quiet, others' cores."""
    spins = list(results)
    print(f"host: {results[spins[0]]['host']}")
    for spin, result in results.items():
        print(f"--spin {spin}: threading layer {result['threading_layer']}, OpenMP: {result['openmp']}")
    quiet = {spin: {row["walkers"]: row for row in result["rows"] if row["case"] == "quiet"}
             for spin, result in results.items()}
    header = "".join(f" | {'--spin ' + spin:<38s}" for spin in spins)
    print(f"{'':30s} {'':>7s}{header}")
    columns = f" | {'median':>9s} {'':>5s} {'mean':>9s} {'':>5s} {'others':>6s}"
    print(f"{'case':30s} {'walkers':>7s}" + columns * len(spins))
    for i, row in enumerate(results[spins[0]]["rows"]):
        cells = []
        for spin in spins:
            this = results[spin]["rows"][i]
            base = quiet[spin][this["walkers"]]
            others = "?" if this["others"] is None else f"{this['others']:.1f}"
            cells.append(f" | {this['median_ms']:6.3f} ms {this['median_ms'] / base['median_ms']:4.1f}x"
                         f" {this['mean_ms']:6.3f} ms {this['mean_ms'] / base['mean_ms']:4.1f}x {others:>6s}")
        print(f"{row['case']:30s} {row['walkers']:7d}" + "".join(cells))
    print("(x: ratio to the quiet case of the same --spin; others: cores other processes used meanwhile)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walkers", type=int, nargs="+", default=[1518])
    parser.add_argument("--competitors", type=int, nargs="+", default=[1],
                        help="CPU-bound processes to run beside the solves, one case per count")
    parser.add_argument("--repeats", type=int, default=15, help="solves per case and size, at least")
    parser.add_argument("--min-seconds", type=float, default=0.5, help="seconds of solves per case and size, at least")
    parser.add_argument("--idle-wait", type=float, default=60.0,
                        help="seconds to wait, at most, for other processes to leave the host idle before a case")
    parser.add_argument("--spin", choices=SPINS, default="crossover",
                        help="crossover's OpenMP spin settings, or libgomp's own (the behaviour before)")
    parser.add_argument("--compare", action="store_true", help="run both --spin settings, side by side")
    parser.add_argument("--json", action="store_true", help="print the measurements as one JSON line")
    args = parser.parse_args()
    # a private wisdom store: timings beside competing processes must not reach the user's
    os.environ.setdefault("CROSSOVER_CACHE_DIR", tempfile.mkdtemp(prefix="numba-stall-probe-"))
    if args.compare:
        print_table({spin: run_fresh(spin, args) for spin in SPINS})
        return
    if args.spin == "runtime":
        for variable, value in RUNTIME_DEFAULT.items():
            os.environ.setdefault(variable, value)  # before core's import, which would bound the spinning
    result = measure(args.walkers, args.competitors, args.repeats, args.min_seconds, args.idle_wait)
    if args.json:
        print(json.dumps(result))
    else:
        print_table({f"{args.spin}": result})


if __name__ == "__main__":
    main()
