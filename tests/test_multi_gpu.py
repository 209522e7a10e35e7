"""Several GPUs: how a batch splits across devices and into sub-batches, and the per-device processes.

The splitting rules are pure functions, tested here without a GPU; so is
the machinery of one process per device, with CPU functions standing in
for the solves (each process must see only its own device). The tests
marked ``gpu`` run the common-noise solver itself on the lent GPU machine:
sub-batches and a batch too large for one GPU give the one-batch answer,
and (with two GPUs or more) the split across devices gives the one-GPU
answer.

The tolerance of the GPU comparisons: every path is the same whatever its
batch (its own seed, its own stopping test, particle streams that do not
depend on its place in the batch), and with zero tolerances every path
runs exactly ``max_iter`` Picard iterations. What may differ is the order
in which the FP kernel's float64 atomic adds land, run to run even on one
GPU: about 1e-15 relative in a histogram bin, which Newton's stopping test
(``newton_tol`` 1e-10) or a float32 particle rounded the other way can
raise to ~1e-10. rtol 1e-6 and atol 1e-9 leave a wide margin while still
catching a wrong path, a lost one or a shuffled order (those differ at 1e-2).
"""

from __future__ import annotations

import os
import time

import device_tasks
import numpy as np
import pytest

from core import NotEnoughMemoryError, TaskFailedError, WorkerCrashedError
from core.backends import torch_devices, torch_gpu
from core.errors import ProblemError


@pytest.fixture(autouse=True, scope="module")
def _stop_device_processes():
    yield
    torch_devices.shutdown()


# -- how a batch splits across devices (pure) ----------------------------------------------


@pytest.mark.parametrize("n_items, n_devices", [(64, 2), (65, 2), (7, 4), (3, 4), (1, 1), (256, 8), (0, 2)])
def test_split_covers_the_batch_in_order_with_sizes_within_one(n_items, n_devices):
    slices = torch_devices.split_batch(n_items, n_devices)
    assert [i for s in slices for i in s] == list(range(n_items))  # gathered by concatenation, in order
    assert len(slices) == min(n_items, n_devices)  # no device gets an empty slice
    sizes = [len(s) for s in slices]
    assert all(size >= 1 for size in sizes)
    assert not sizes or max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def test_split_of_five_paths_over_two_gpus():
    assert torch_devices.split_batch(5, 2) == [range(0, 3), range(3, 5)]


def test_split_refuses_no_devices():
    with pytest.raises(ValueError, match="n_devices >= 1"):
        torch_devices.split_batch(4, 0)


# -- sub-batches from the memory model (pure) ------------------------------------------------


@pytest.mark.parametrize("n_items, item_bytes, free_bytes", [
    (100, 1e9, 80e9), (100, 1e9, 10e9), (7, 3.0, 16.0), (5, 1.0, 1e12), (64, 2.5e8, 1.2e9)])
def test_sub_batches_fit_cover_in_order_and_are_as_few_as_possible(n_items, item_bytes, free_bytes):
    items = range(10, 10 + n_items)  # a device's slice need not start at 0
    parts = torch_devices.sub_batches(items, item_bytes, free_bytes)
    assert [i for part in parts for i in part] == list(items)
    fit = int(torch_devices.USABLE_FRACTION * free_bytes // item_bytes)
    fit = max(1, min(fit, int(torch_devices.INDEX_LIMIT_BYTES // item_bytes)))  # 32-bit offsets' reach
    assert all(len(part) * item_bytes <= torch_devices.USABLE_FRACTION * free_bytes for part in parts)
    assert all(len(part) == 1 or len(part) * item_bytes <= torch_devices.INDEX_LIMIT_BYTES for part in parts)
    assert len(parts) == -(-n_items // fit)  # one part fewer would not fit
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1


def test_no_part_outgrows_32_bit_offsets_however_much_memory_is_free():
    """On the H200 a part sized by its 139 GB alone overflowed a Triton kernel's int32 offsets."""
    parts = torch_devices.sub_batches(range(1000), 1e8, 139e9)
    assert max(len(part) for part in parts) * 1e8 <= 2**31
    assert [i for part in parts for i in part] == list(range(1000))


def test_a_slice_of_ten_that_fits_four_at_a_time_runs_as_four_three_three():
    assert torch_devices.sub_batches(range(10), 1.0, 4 / torch_devices.USABLE_FRACTION) == [
        range(0, 4), range(4, 7), range(7, 10)]


def test_one_item_too_large_for_the_device_is_a_clear_error():
    with pytest.raises(NotEnoughMemoryError) as caught:
        torch_devices.sub_batches(range(8), 3 * 2**30, 2 * 2**30)
    assert str(caught.value) == (
        "one batch item needs 3.00 GiB on the GPU and the device has 2.00 GiB free, 75% of it usable: "
        "the batch cannot run there even one item at a time")


def test_unknown_free_memory_or_no_items_keep_the_batch_whole():
    assert torch_devices.sub_batches(range(5), 1e9, None) == [range(5)]
    assert torch_devices.sub_batches(range(0), 1e9, 1.0) == []


def test_the_common_noise_memory_estimate_is_one_path_on_the_gpu():
    from plugins.mfg.common_noise import device_bytes_per_path
    from plugins.mfg.problem import CommonNoiseProblem
    from plugins.mfg.specs import COMMON_NOISE

    small, large = CommonNoiseProblem(K=2, N=5_000), CommonNoiseProblem(K=2_000, N=5_000)
    for variant in ("torch:hjb_host", "torch:hjb_device"):
        # the solver runs the paths in sub-batches that fit, so a device needs room for one path, whatever K
        assert COMMON_NOISE.memory(large, variant) == COMMON_NOISE.memory(small, variant)
        assert COMMON_NOISE.memory(large, variant) == device_bytes_per_path(large, variant == "torch:hjb_device")
    assert COMMON_NOISE.memory(large, "numba") > COMMON_NOISE.memory(small, "numba")  # the K results, on the host


# -- which device ids the processes get; how many GPUs are used -----------------------------


def test_device_ids_follow_the_callers_own_visible_list(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert torch_devices.visible_devices(2) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    assert torch_devices.visible_devices(2) == ["2", "3"]
    with pytest.raises(ValueError, match="names 3"):
        torch_devices.visible_devices(4)


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_gpu_count_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("CROSSOVER_GPUS", value)
    with pytest.raises(ProblemError, match="CROSSOVER_GPUS="):
        torch_gpu.gpu_count()


def test_no_gpu_here_means_none_used(monkeypatch):
    monkeypatch.setenv("CROSSOVER_GPUS", "4")
    if torch_gpu.BACKEND.probe().available:
        pytest.skip("this machine has a GPU")
    assert torch_gpu.gpu_count() == 0


# -- one process per device (CPU functions stand in for the solves) ------------------------


def test_each_part_runs_in_its_own_process_seeing_only_its_device():
    out = torch_devices.map_devices(device_tasks.who_am_i, [0, 1, 2], ["4", "5", "6"])
    assert [part for part, _, _ in out] == [0, 1, 2]
    assert [seen for _, seen, _ in out] == ["4", "5", "6"]
    assert len({pid for _, _, pid in out}) == 3 and os.getpid() not in {pid for _, _, pid in out}
    again = torch_devices.map_devices(device_tasks.who_am_i, [7], ["5"])  # the processes persist
    assert again[0][2] == out[1][2]


def test_a_failing_part_names_its_gpu_and_keeps_the_others():
    with pytest.raises(TaskFailedError, match=r"part 1 of 3 on GPU b failed: ValueError: part one refuses") as caught:
        torch_devices.map_devices(device_tasks.fail_on_one, [0, 1, 2], ["a", "b", "c"])
    assert caught.value.partial_results == [0, None, 2]


def test_a_dead_device_process_is_a_clear_error_and_is_restarted():
    with pytest.raises(WorkerCrashedError, match=r"the process of GPU y \(part 1 of 2\) died"):
        torch_devices.map_devices(device_tasks.die_on_one, [0, 1], ["x", "y"])
    assert torch_devices.map_devices(device_tasks.die_on_one, [0, 2], ["x", "y"]) == [0, 2]
    torch_devices.shutdown()


def test_an_interrupted_map_kills_the_device_processes_at_once():
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        torch_devices.map_devices(device_tasks.interrupt_on_zero, [0, 1], ["p", "q"])
    assert time.monotonic() - started < 30  # not the minute part 1 would have run
    assert torch_devices.map_devices(device_tasks.who_am_i, [5], ["q"])[0][:2] == (5, "q")  # started afresh


def test_paths_split_across_two_device_processes_gather_in_order(monkeypatch):
    """The whole multi-GPU path of solve_torch, with CPU torch standing in for each device."""
    torch = pytest.importorskip("torch")
    from plugins.mfg import common_noise
    from plugins.mfg.fp import torch_kernel as fp_torch
    from plugins.mfg.hjb import torch_kernel as hjb_torch

    problem = _common_noise(K=5, N=2_000, Nx=31, Nt=10, max_iter=3)
    for module in (fp_torch, hjb_torch):  # here as in device_tasks.on_cpu_torch, which the device processes run
        monkeypatch.setattr(module, "gpu_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch_gpu, "free_for_batches", lambda: None)
    here = common_noise.solve_torch(problem, hjb_device=True, devices=1)
    monkeypatch.setattr(torch_gpu, "gpu_count", lambda devices=None: 2)
    monkeypatch.setattr(common_noise, "solve_paths", device_tasks.solve_paths_on_cpu_torch)
    split = common_noise.solve_torch(problem, hjb_device=True, devices=2)
    for key in ("theta", "iterations", "U_mean", "M_mean", "U_quantiles", "M_quantiles"):
        np.testing.assert_array_equal(split[key], here[key], err_msg=key)  # CPU torch has no atomics: exact


# -- on the GPU ----------------------------------------------------------------------------


def _common_noise(**fields):
    from plugins.mfg.problem import CommonNoiseProblem

    # zero tolerances: every path runs exactly max_iter iterations, however it is batched
    return CommonNoiseProblem(**{"preset": "lq", "rtol": 0.0, "atol": 0.0, "seed": 7, **fields})


def _same_answer(a: dict, b: dict) -> None:
    np.testing.assert_array_equal(a["theta"], b["theta"])  # the same paths, in the same order
    np.testing.assert_array_equal(a["iterations"], b["iterations"])
    for key in ("U_mean", "M_mean", "U_std", "M_std"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-9, err_msg=key)


@pytest.mark.gpu
@pytest.mark.parametrize("hjb_device", [True, False])
def test_sub_batches_give_the_one_batch_answer(monkeypatch, hjb_device):
    from plugins.mfg import common_noise

    problem = _common_noise(K=8, N=20_000, Nt=20, max_iter=4)
    whole = common_noise.solve_torch(problem, hjb_device=hjb_device, devices=1)
    three = common_noise.device_bytes_per_path(problem, hjb_device) * 3 / torch_devices.USABLE_FRACTION
    monkeypatch.setattr(torch_gpu, "free_for_batches", lambda: three)  # room for 3 paths: 3 + 3 + 2
    _same_answer(common_noise.solve_torch(problem, hjb_device=hjb_device, devices=1), whole)


@pytest.mark.gpu
@pytest.mark.parametrize("fields", [{"N": 200_000, "Nx": 101, "Nt": 50}, {"N": 2_000, "Nx": 401, "Nt": 200}])
def test_the_per_path_memory_estimate_covers_a_batch_peak(fields):
    """The sub-batches are sized by it: a batch of 6 paths must peak below 6 times one path's estimate."""
    import torch

    from plugins.mfg import common_noise

    problem = _common_noise(K=6, max_iter=2, **fields)
    common_noise.solve_batch(problem, False, range(2))  # compiles and caches outside the measured run
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    common_noise.solve_batch(problem, False, range(6))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= 6 * common_noise.device_bytes_per_path(problem, False), (peak, fields)


@pytest.mark.gpu
def test_a_batch_too_large_for_one_gpu_is_split_and_completed():
    """Issue 12's third fault: K paths whose one batch would need 1.25x the card's whole memory."""
    import torch

    from plugins.mfg import common_noise

    fields = {"N": 2_000, "Nx": 401, "Nt": 200, "max_iter": 2}
    # the HJB with numba on the host: the device's sweep is launch-bound, ~2 s at Nt = 100 whatever K
    per_path = common_noise.device_bytes_per_path(_common_noise(K=1, **fields), False)
    k = int(1.25 * torch.cuda.get_device_properties(0).total_memory / per_path) + 1
    problem = _common_noise(K=k, **fields)
    assert len(torch_devices.sub_batches(range(k), per_path, torch_gpu.free_for_batches())) >= 2
    paths = common_noise.solve_paths((problem, False, range(k)))
    assert len(paths) == k and [int(p["iterations"]) for p in paths] == [2] * k
    assert all(np.all(np.isfinite(p["M"])) and np.all(np.isfinite(p["U"])) for p in paths)
    # the first two paths and the last, each set solved as a batch of its own, are the same paths
    for alone in (range(0, 2), range(k - 1, k)):
        for k_alone, path in zip(alone, common_noise.solve_batch(problem, False, alone)):
            np.testing.assert_array_equal(paths[k_alone]["theta"], path["theta"])
            for key in ("U", "M"):
                # atol on the field's scale: U near its zeros differed by 2e-9 (of max |U| 1.8) on the H200
                scale = float(np.max(np.abs(path[key])))
                np.testing.assert_allclose(paths[k_alone][key], path[key], rtol=1e-6, atol=1e-8 * scale)


@pytest.mark.gpu
@pytest.mark.skipif("torch_gpu.gpu_count() < 2", reason="needs two GPUs or more")
@pytest.mark.parametrize("hjb_device", [True, False])
def test_two_gpus_give_the_one_gpu_answer(hjb_device):
    from plugins.mfg.common_noise import solve_torch

    problem = _common_noise(K=6, N=50_000, Nt=20, max_iter=5)
    one = solve_torch(problem, hjb_device=hjb_device, devices=1)
    _same_answer(solve_torch(problem, hjb_device=hjb_device, devices=2), one)


@pytest.mark.gpu
@pytest.mark.skipif("torch_gpu.gpu_count() < 2", reason="needs two GPUs or more")
def test_each_gpu_process_sees_its_own_card():
    count = torch_gpu.gpu_count()
    seen = torch_devices.map_devices(device_tasks.gpu_seen, list(range(count)), torch_devices.visible_devices(count))
    assert [visible for visible, _, _ in seen] == [1] * count  # each process sees exactly one device
    uuids = [uuid for _, _, uuid in seen]
    if None not in uuids:
        assert len(set(uuids)) == count  # and no two see the same card
