"""Per-device constants that the launch wrappers read on every call, looked up once: torch's
property query takes ~8 µs of host time (H100 machine, 2026-11-26), which an eager engine would
pay several times a layer."""

from __future__ import annotations

import functools

import torch


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors (4 off CUDA: the interpreter's stand-in)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


@functools.cache
def capability(device: torch.device) -> tuple[int, int]:
    """Compute capability ((0, 0) off CUDA)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


@functools.cache
def l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size
