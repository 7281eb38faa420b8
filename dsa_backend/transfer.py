"""Copies between host and GPU that never wait for the work queued on the GPU.

A plain copy from pageable memory synchronizes the stream, so it waits for every kernel queued
before it. With overlap scheduling the GPU runs one step while the host builds the next, and one
such copy would serialize them again; these go through pinned memory instead.
"""

from __future__ import annotations

import numpy as np
import torch

# Triton specializes a pointer argument on its 16-byte alignment. Fields packed end to end start
# wherever the fields before them end, and a kernel that reads one compiles again whenever that
# flips: the block table behind a batch's int32 lengths did at every odd batch size, after a
# warm-up that had seen only aligned tables (H200, tests/test_warmup.py).
FIELD_ALIGN_BYTES = 16


def to_device(cpu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`cpu` on `device`, copied behind the queued work instead of after it finishes."""
    if device.type == "cuda":
        return cpu.pin_memory().to(device, non_blocking=True)
    return cpu.to(device)


def fields_to_device(fields: list[list[int]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Int lists as `dtype` tensors on `device`, in one copy (to_device), each one starting on a
    FIELD_ALIGN_BYTES boundary."""
    per_block = FIELD_ALIGN_BYTES // dtype.itemsize
    starts = np.cumsum([0] + [-(-len(f) // per_block) * per_block for f in fields])
    packed = np.zeros(starts[-1], dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    for start, values in zip(starts, fields):
        packed[start: start + len(values)] = values
    on_device = to_device(torch.from_numpy(packed), device)
    return [on_device[start: start + len(values)] for start, values in zip(starts, fields)]


class HostCopy:
    """Device tensors on their way to the host: the copies are queued now, behind the work that
    makes them, and `wait` returns them as lists once they have landed."""

    def __init__(self, *tensors: torch.Tensor | None):
        on_gpu = [t is not None and t.device.type == "cuda" for t in tensors]
        self.tensors = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                        if gpu else t for t, gpu in zip(tensors, on_gpu)]
        self.event = None
        if any(on_gpu):
            self.event = torch.cuda.Event()
            self.event.record()

    def wait(self) -> list[list | None]:
        if self.event is not None:
            self.event.synchronize()
        return [None if t is None else t.tolist() for t in self.tensors]
