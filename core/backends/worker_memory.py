"""Pool workers keep the memory their tasks free, so that large temporaries are not faulted in afresh by every task.

glibc's ``malloc`` serves every block above its mmap threshold with a
fresh ``mmap`` and hands it back to the kernel with ``munmap`` when it is
freed. The threshold adapts to what is freed, but never above 32 MiB on a
64-bit host, so a solver step whose arrays are larger (a spectra chunk of
64 spectra makes a 64 MB interpolated-template array and a 28 MB resampled
one in every model evaluation) maps them, faults every page in (zeroed by
the kernel; NumPy asks for huge pages on arrays of 4 MB or more, so often
2 MB at a time), and unmaps them again, evaluation after evaluation. Every
worker of a pool does it at once, so they all zero memory at once.

On the 2-core VM that made ``spectra.fit``'s 64-spectrum chunks on the
process backend run at half speed (2 workers, realistic grid, a batch of
1,024, two runs each, ``docs/spectra.md``):

- 64-spectrum chunks: 69-77 spectra/s and 1,440 minor page faults per
  spectrum as glibc leaves them; 143-147 and 43 when freed memory stays in
  the worker (this module). At a batch of 768, NumPy's huge-page advice
  off alone (``NUMPY_MADVISE_HUGEPAGE=0``) gave 82.6 against 63.4;
- 16-spectrum chunks, whose arrays mostly stay under the limit: 101-102
  and 118-135 (28 and 15 faults per spectrum).

It does not explain the loss once seen on the 16-core H200 host at 4,096
spectra (435.5 against 139.1 spectra per second at 512): there a fresh
machine's first run lost 70 % with this setting on, and the two runs after
it, off and on, ran 4,096 faster than 512 (``docs/spectra.md``).

Each worker (:func:`keep_freed_memory`, from the pool's initializer)
sets ``M_MMAP_MAX`` to 0 (every block comes from the heap, and a freed one
is reused by the next task) and ``M_TRIM_THRESHOLD`` to
:data:`TRIM_THRESHOLD` (the heap's free top goes back to the kernel only
beyond it, so an idle worker holds at most that much unused, plus what
fragmentation pins). Why each choice:

- *in the workers only*: a worker runs task after task of one kind, whose
  blocks fit each other's holes; the calling process's memory is the
  user's, and is left as it is.
- *mallopt at start, not GLIBC_TUNABLES*: a forkserver's workers inherit
  the environment the forkserver started with, which may predate the
  pool; a call in the initializer takes effect for every later block.
- *glibc only*: elsewhere (macOS, musl) nothing is set.
- *the switch* ``CROSSOVER_KEEP_FREED_MEMORY=0``, read in the calling
  process when the pool starts, leaves glibc's defaults (to measure what
  this gains, or where a worker must give memory back at once).
"""

from __future__ import annotations

import ctypes
import platform
import sys

from core.validation import env_flag

SWITCH = "CROSSOVER_KEEP_FREED_MEMORY"
TRIM_THRESHOLD = 1 << 30  # bytes of free heap top a worker keeps before it gives memory back to the kernel

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def wanted() -> bool:
    """Whether the pool's workers should keep freed memory: the switch, read in the calling process."""
    return env_flag(SWITCH, default=True)


def keep_freed_memory() -> bool:
    """In a worker: serve every block from the heap and keep freed memory up to :data:`TRIM_THRESHOLD`;
    whether it was set (glibc only)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's own symbols: the C library it runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success; the trim threshold first, since mmap_max=0 without it would still trim
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(_M_MMAP_MAX, 0))
