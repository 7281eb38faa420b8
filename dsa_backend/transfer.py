"""Copies between host and GPU that never wait for the work queued on the GPU.

A plain copy from pageable memory synchronizes the stream, so it waits for every kernel queued
before it. With overlap scheduling the GPU runs one step while the host builds the next, and one
such copy would serialize them again; these go through pinned memory instead.
"""

from __future__ import annotations

import torch


def to_device(cpu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`cpu` on `device`, copied behind the queued work instead of after it finishes."""
    if device.type == "cuda":
        return cpu.pin_memory().to(device, non_blocking=True)
    return cpu.to(device)


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
