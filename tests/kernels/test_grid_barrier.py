"""The meeting counters and the memory of refused cooperative launches (kernels/grid_barrier.py),
which the one-launch top-k and the split sparse MLA share."""

import torch

from dsa_kernels import grid_barrier


def test_a_refused_grid_size_is_not_tried_again_nor_any_larger():
    device = torch.device("cuda", 7)  # never launched: only the bookkeeping
    assert not grid_barrier.refused("kernel a", device, 100)
    grid_barrier.refuse("kernel a", device, 100)
    grid_barrier.refuse("kernel a", device, 120)  # a larger refusal does not raise the bar
    assert grid_barrier.refused("kernel a", device, 100) and grid_barrier.refused("kernel a", device, 500)
    assert not grid_barrier.refused("kernel a", device, 99)
    assert not grid_barrier.refused("kernel b", device, 500)  # each kernel's own record
    assert grid_barrier.is_refusal(RuntimeError("too many blocks in cooperative launch"))
    assert not grid_barrier.is_refusal(RuntimeError("an illegal memory access was encountered"))


def test_counters_start_at_zero_and_are_one_buffer_per_stream_that_grows():
    device = torch.device("cpu")
    grid_barrier._counters.pop((device, 0), None)
    small = grid_barrier.counters(device, 3, "kernel", "instead")
    assert small.dtype == torch.int32 and small.numel() >= 3 and not small.any()
    assert grid_barrier.counters(device, 2, "kernel", "instead") is small  # kernels share it
    large = grid_barrier.counters(device, small.numel() + 1, "kernel", "instead")
    assert large.numel() == small.numel() + 1 and not large.any()
