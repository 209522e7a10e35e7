"""Idle OpenMP threads spin only briefly before they sleep, so that a busy host does not stall Numba.

Numba's threading layer on Linux is OpenMP (GNU libgomp with the pip
wheels). After every parallel region libgomp's threads spin for 300,000
rounds (about 3 ms, by libgomp's own estimate) waiting for the next one,
and the thread that started the region spins too while it waits for the
others at its end. A thread that spins looks CPU-bound to the kernel's
scheduler, so when anything else wants the cores, the next region waits
for one of its threads to get a core back: a whole time slice. On the
2-core VM, beside one other CPU-bound process, a numba random walk of
1,518 walkers took 7.9 ms instead of 0.3; on the 16-core H200 host, after
a process-pool map in the same process, 8.0 ms. A thread that sleeps soon
is woken at once when work comes (the scheduler favours a thread that
slept), and that case took 0.3-0.5 ms.

So, before Numba loads its threading layer, crossover sets
:data:`LIMITS` in ``os.environ``: the OpenMP runtime reads them once, when
it loads (libgomp) or starts its first region (LLVM's and Intel's, which
read ``KMP_BLOCKTIME``; each ignores the other's variable). Why each
choice:

- *a short spin, not none*: kernels that run many regions back to back
  (a time loop around a ``prange``) find their threads still awake; see
  :data:`LIMITS` for the measurements.
- *the user's choice wins*: with any of :data:`USER_CHOICES` set, crossover
  sets nothing (``OMP_WAIT_POLICY=active`` or a spin count of your own is
  a decision about your machine).
- *in the environment, not scoped to Numba*: child processes (the process
  pool's workers, a local dask cluster's) inherit it, and so does any
  OpenMP runtime loaded later in this process. torch's CPU build ships a
  libgomp that Numba shares when torch comes second, so torch's threads
  spin briefly too: they no longer hold cores that Numba's threads want.
- *too late is said, not hidden*: if Numba's threading layer is already
  loaded (a kernel ran before crossover was imported), setting the
  variables would change nothing, so none is set and :func:`describe`
  says so.
"""

from __future__ import annotations

import os
import sys

USER_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""Variables by which a user chooses how OpenMP threads wait: with any of them set, crossover sets none."""

LIMITS = {"GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "0"}
"""What crossover sets. libgomp: 1,000 rounds (about 10 us), the spin libgomp itself falls back to
when it has more threads than cores; LLVM's and Intel's runtimes count in milliseconds, where the
shortest bound is 0 (sleep at once)."""

_state: str | None = None  # what limit_spinning found: None before it ran, then "crossover", "user" or "late"


def limit_spinning() -> None:
    """Set :data:`LIMITS` unless the user chose (:data:`USER_CHOICES`) or Numba's threading layer is loaded.

    Cheap and idempotent: the first call decides, later calls do nothing.
    """
    global _state
    if _state is not None:
        return
    if any(name in os.environ for name in USER_CHOICES):
        _state = "user"
    elif _numba_layer_loaded():
        _state = "late"
    else:
        os.environ.update(LIMITS)
        _state = "crossover"


def _numba_layer_loaded() -> bool:
    numba = sys.modules.get("numba")
    if numba is None:  # not even imported: its layer loads later
        return False
    try:
        numba.threading_layer()
    except ValueError:  # "not initialized"
        return False
    return True


def describe() -> str:
    """How OpenMP threads wait in this process, and who chose it: for the backend's description."""
    chosen = " ".join(f"{name}={os.environ[name]}" for name in USER_CHOICES if name in os.environ)
    if _state == "crossover":
        return f"{chosen} (crossover's)"
    if _state == "user":
        return f"{chosen} (the user's)"
    if _state == "late":
        return "the runtime's default: Numba's threading layer loaded before crossover could bound its spinning"
    return "not yet set"
