"""Idle OpenMP threads spin only briefly before they sleep, so that a busy host does not stall Numba.

Numba's threading layer on Linux is OpenMP: GNU libgomp with the pip
wheels. After each parallel region libgomp's threads spin, waiting for the
next one, for 300,000 rounds unless told otherwise (7 ms on the 2-core
VM's EPYC), and the thread that started the region spins as long at its
end, waiting for the others. A thread that spins looks CPU-bound to the
kernel's scheduler, so when other work wants the cores a region's thread
can wait a whole time slice to get one back. On the 2-core VM a numba
random walk of 1,518 walkers took 0.25 ms quiet; beside one CPU-bound
process its median stayed there but its mean rose to 0.7-1.0 ms (some
solves waited out a slice), beside two the median was up to 8.0 ms. On
the 16-core H200 host, after a process-pool map in the same process, it
took 8.0 ms. A thread that sleeps soon is woken at once when work comes,
since the scheduler favours a thread that slept.

So crossover sets ``GOMP_SPINCOUNT`` (:data:`LIMITS`) in ``os.environ``
before Numba loads its threading layer: libgomp reads it once, when it
loads. Why each choice:

- *1,000 rounds* (34 us on the VM), the order of the short spin libgomp
  itself falls back to when it has more threads than cores (100 rounds,
  1,000 under ``OMP_WAIT_POLICY=active``). On the 2-core VM the same walk
  took 0.29-0.30 ms quiet, and beside one CPU-bound process a median of
  0.29-0.38 ms and a mean of 0.34-0.41 ms. Longer spins stalled again
  beside one process (medians: 3,000 rounds 0.5 ms, 10,000 rounds
  0.6-0.8 ms). No spin at all (``OMP_WAIT_POLICY=passive``) did as well
  beside other processes, but made torch's CPU training, which shares the
  runtime (below), twice as slow (a small DotGAT run: 100 ms instead of
  50), where 1,000 rounds kept it at 50. Large and many-region kernels
  did not notice: 200,000 walkers 14.0-14.2 ms and 2,000,000 walkers
  124-127 ms either way, the MFG particle steps 21-23 ms either way. The
  cost: a small solve on an idle host, whose threads now sleep between
  solves and are woken for the next one (0.25 ms became 0.29).
- *only libgomp's variable*: LLVM's and Intel's runtimes (conda's
  ``intel-openmp``, macOS) bound their spin with ``KMP_BLOCKTIME`` in whole
  milliseconds, so their only short setting is none at all, which slowed
  torch here; they are left alone, and ``KMP_BLOCKTIME=0`` is the switch
  to try where they stall.
- *the user's choice wins*: with ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
  set (:data:`USER_CHOICES`), crossover sets nothing: either one decides
  libgomp's spin, and it is a decision about the user's machine.
- *in the environment, not scoped to Numba*: the process pool's and a
  local dask cluster's workers inherit it, and any OpenMP runtime loaded
  later in this process reads it too. torch's CPU build, which uses
  Numba's libgomp when it is imported after a Numba kernel ran, then
  spins briefly as well, and no longer holds cores that Numba's threads
  want.
- *too late is said, not hidden*: if Numba's threading layer is already
  loaded (a kernel ran before crossover was imported), the variable would
  change nothing, so it is not set and :func:`describe` says so. (A
  library loaded earlier that links the same libgomp has made it read its
  settings too; that, crossover cannot see.)
"""

from __future__ import annotations

import os
import sys

USER_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
"""The variables that decide how long libgomp's threads spin: with either set, crossover sets nothing."""

LIMITS = {"GOMP_SPINCOUNT": "1000"}
"""What crossover sets (see the module's docstring for the measurements)."""

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
    """How long libgomp's threads spin in this process, and who chose it: for the backend's description."""
    chosen = " ".join(f"{name}={os.environ[name]}" for name in USER_CHOICES if name in os.environ)
    if _state == "crossover":
        return f"{chosen} (crossover's)"
    if _state == "user":
        return f"{chosen} (the user's)"
    if _state == "late":
        return "the runtime's default: Numba's threading layer loaded before crossover could bound its spinning"
    return "not yet set"
