"""Write tests/slow_tests.txt from a full run's ``--durations=0`` report read on standard input.

    python -m pytest --durations=0 tests | python tests/slow_list.py [--over 1.0]

A test is slow when its setup, call and teardown took over ``--over``
seconds in all; tests/conftest.py marks those ``slow``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--over", type=float, default=1.0, help="seconds above which a test is slow (default 1)")
    args = parser.parse_args()
    seconds: dict[str, float] = defaultdict(float)
    for line in sys.stdin:
        if match := LINE.match(line):
            seconds[match.group(3)] += float(match.group(1))
    if not seconds:
        sys.exit("no durations on standard input: run pytest with --durations=0")
    slow = sorted(node for node, spent in seconds.items() if spent > args.over)
    header = (f"# tests whose setup, call and teardown took over {args.over:g} s on the 2-core VM "
              f"(written by tests/slow_list.py)\n")
    Path(__file__).with_name("slow_tests.txt").write_text(header + "".join(f"{node}\n" for node in slow))
    print(f"{len(slow)} slow tests of {len(seconds)} timed, {sum(seconds[n] for n in slow):.0f} s of "
          f"{sum(seconds.values()):.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
