"""Several GPUs: a batch split across the visible devices, one process per device.

A batched solver (the common-noise paths; later spectrum batches) gives each
device a contiguous slice of its batch and gathers the slices' results in
order. Why each choice:

- *one process per device*, which sees only its own GPU
  (``CUDA_VISIBLE_DEVICES``, set before torch is imported there): code in it
  that asks for "cuda" gets its device, so the one-GPU solvers run there
  unchanged, and no device waits for another's Python loop to release the GIL.
- *spawn*, never fork: CUDA is not fork-safe. The processes start without
  the caller's main script (:mod:`core.backends.pool_main`) and exit when
  the caller does (:mod:`core.backends.pool_lifeline`), as the process
  pool's workers do.
- *they persist*, like the process pool: starting one (Python, torch, a
  CUDA context) takes seconds, paid once per process.
- *contiguous slices whose sizes differ by at most one*
  (:func:`split_batch`): the devices of one host are alike, and the results
  gather by concatenation, in batch order.
- *sub-batches from the memory model* (:func:`sub_batches`): on each device
  a slice larger than what the device has free runs in consecutive parts
  that fit; if not even one item fits, one clear error before anything runs.
  Never an out-of-memory half way, never a partial answer.

Nothing here imports torch: the device count and free memory come from
:mod:`core.backends.torch_gpu`, in whichever process asks.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import Any

from core.backends import pool_lifeline, pool_main
from core.errors import NotEnoughMemoryError, TaskFailedError, WorkerCrashedError

# The share of a device's free memory a sub-batch plans to fill. The estimates are peaks measured on one
# card and rounded up, but the caching allocator fragments, and a solve holds a few buffers they leave out.
USABLE_FRACTION = 0.75
# a part's peak memory bounds every tensor in it, so a part under 2**31 bytes keeps every tensor under
# 2**31 elements: the reach of the 32-bit offsets that Triton kernels (the fused FP step's) compute with.
# On the H200 a part sized by memory alone (~100 GB) overflowed them: an illegal memory access.
INDEX_LIMIT_BYTES = 2**31


def split_batch(n_items: int, n_devices: int) -> list[range]:
    """Contiguous slices of ``range(n_items)`` for up to ``n_devices`` devices, sizes within one, larger first.

    A device gets no slice rather than an empty one: with 3 items and 4
    devices, 3 slices of one. Concatenated in order, the slices are
    ``range(n_items)``.
    """
    if n_items < 0 or n_devices < 1:
        raise ValueError(f"split_batch needs n_items >= 0 and n_devices >= 1, got {n_items} and {n_devices}")
    used = min(n_items, n_devices)
    if used == 0:
        return []
    base, extra = divmod(n_items, used)
    slices, start = [], 0
    for i in range(used):
        size = base + (1 if i < extra else 0)
        slices.append(range(start, start + size))
        start += size
    return slices


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def sub_batches(items: range, item_bytes: float, free_bytes: float | None,
                usable: float = USABLE_FRACTION) -> list[range]:
    """``items`` in as few consecutive parts as fit in ``usable * free_bytes`` each (and in
    :data:`INDEX_LIMIT_BYTES`), sizes within one.

    Each item takes ``item_bytes``; ``free_bytes`` None (a device that cannot say, such as MPS) keeps one
    part. Raises :class:`~core.errors.NotEnoughMemoryError` if one item
    alone does not fit.
    """
    if len(items) == 0:
        return []
    if free_bytes is None or item_bytes <= 0:
        return [items]
    room = usable * free_bytes
    fit = int(room // item_bytes)
    if fit >= 1:
        fit = max(1, min(fit, int(INDEX_LIMIT_BYTES // item_bytes)))
    if fit < 1:
        raise NotEnoughMemoryError(
            f"one batch item needs {_gib(item_bytes)} on the GPU and the device has {_gib(free_bytes)} free, "
            f"{usable:.0%} of it usable: the batch cannot run there even one item at a time")
    parts = -(-len(items) // fit)
    return [items[part.start:part.stop] for part in split_batch(len(items), parts)]


def visible_devices(count: int) -> list[str]:
    """What each device process's ``CUDA_VISIBLE_DEVICES`` holds: the caller's own list if set, else 0..count-1."""
    configured = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [d.strip() for d in configured.split(",") if d.strip()] if configured else []
    ids = ids or [str(i) for i in range(count)]
    if len(ids) < count:
        raise ValueError(f"{count} devices asked for, CUDA_VISIBLE_DEVICES={configured!r} names {len(ids)}")
    return ids[:count]


# -- one process per device ---------------------------------------------------------

_executors: dict[str, ProcessPoolExecutor] = {}  # device id -> its single process


def _init_device_process(device_id: str, lifeline: Connection) -> None:
    """In a new device process, before anything imports torch: see one GPU, and exit with the caller."""
    pool_lifeline.hold_on(lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the caller decides
    os.environ["CUDA_VISIBLE_DEVICES"] = device_id


def _executor(device_id: str) -> ProcessPoolExecutor:
    executor = _executors.get(device_id)
    if executor is not None and getattr(executor, "_broken", False):
        shutdown(device_id)
        executor = None
    if executor is None:
        pool_main.refuse_pool_while_importing_main()
        context = pool_main.pool_context("spawn")
        executor = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_init_device_process,
                                       initargs=(device_id, pool_lifeline.caller_lifeline(context)))
        _executors[device_id] = executor
    return executor


def shutdown(device_id: str | None = None) -> None:
    """Stop one device's process (or all of them); the next map starts it again."""
    for key in [device_id] if device_id is not None else list(_executors):
        executor = _executors.pop(key, None)
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def map_devices(fn: Callable[[Any], Any], parts: Sequence[Any], devices: Sequence[str]) -> list[Any]:
    """``fn(parts[i])`` in the process of GPU ``devices[i]``, all at once; results in the order of ``parts``.

    ``fn`` must be importable by name (a module-level function). A part that
    raises gives :class:`~core.errors.TaskFailedError`, a device process
    that dies :class:`~core.errors.WorkerCrashedError`; both name the GPU,
    and the process is started again at the next map. Interrupted (Ctrl-C),
    it kills the device processes at once rather than wait for their parts.
    """
    if len(parts) != len(devices):
        raise ValueError(f"map_devices needs one device per part, got {len(parts)} parts and {len(devices)} devices")
    futures = [_executor(device).submit(fn, part) for device, part in zip(devices, parts)]
    try:
        return _gather(futures, devices)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # Ctrl-C: a GPU's part may run for minutes, and the exit would wait
            for device in devices:
                _kill(device)
        raise


def _kill(device_id: str) -> None:
    """Stop a device's process now, whatever it runs; the next map starts it again."""
    executor = _executors.pop(device_id, None)
    if executor is None:
        return
    for process in list((getattr(executor, "_processes", None) or {}).values()):  # the executor's own table
        process.kill()
    executor.shutdown(wait=False, cancel_futures=True)


def _gather(futures: list, devices: Sequence[str]) -> list[Any]:
    """Every part's result in order; the first failure, naming its GPU, once all parts are done."""
    n = len(futures)
    results: list[Any] = [None] * n
    failure: BaseException | None = None
    for i, (device, future) in enumerate(zip(devices, futures)):
        try:
            results[i] = future.result()  # waits for every part, so no device is left running a failed map
        except BrokenProcessPool as exc:
            shutdown(device)
            if failure is None:
                failure = WorkerCrashedError(f"the process of GPU {device} (part {i} of {n}) died while "
                                             f"running its part", i, results)
                failure.__cause__ = exc
        except Exception as exc:
            if failure is None:
                failure = TaskFailedError(f"part {i} of {n} on GPU {device} failed: "
                                          f"{type(exc).__name__}: {exc}", i, results)
                failure.__cause__ = exc
    if failure is not None:
        raise failure
    return results
