"""Seconds from launching ``crossover demo`` to its first line of progress (issue 9: within 1 s).

Usage: ``python docs/scripts/demo_first_line.py [--repeats 5]``. Measured from
the moment the process is started, imports included; the demo is stopped
once it has spoken.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def first_line_seconds(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    line = process.stderr.readline()
    seconds = time.perf_counter() - started
    process.kill()
    process.wait()
    return seconds, line.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    command = [shutil.which("crossover") or sys.executable, "demo"]
    if command[0] == sys.executable:
        command = [sys.executable, "-m", "core.cli", "demo"]
    times = []
    for _ in range(args.repeats):
        seconds, line = first_line_seconds(command)
        times.append(seconds)
    print(f"first line after {statistics.median(times):.2f} s (median of {args.repeats}; max {max(times):.2f} s): "
          f"{line!r}")


if __name__ == "__main__":
    main()
