"""Meetings of a launch's programs in global memory, for kernels whose programs wait for each other
(the one-launch top-k's rounds, the split sparse MLA's merge in the Gluon kernel).

One int32 counter per group of programs, per device and stream, zeroed once and never reset. A
group's programs add up to 128 between them and wait for the next multiple of 128, so the counters
stay multiples of 128 between launches whatever the group sizes; they are compared by difference,
so wrapping around is harmless. Waiting programs must all be resident at once: such kernels are
launched cooperatively (the driver refuses a grid that cannot be), and a grid the driver refused
is not tried again at that size on that device (refused / refuse).
"""

from __future__ import annotations

import functools
import logging

import torch

from .device import num_sms

log = logging.getLogger(__name__)
_counters: dict = {}
_refused: dict = {}  # per (kernel, device), the smallest grid the driver refused to launch cooperatively


@functools.cache
def _warn_capture_once(kernel: str, instead: str) -> None:
    log.warning("%s captured in a CUDA graph before any eager call on its stream: that graph takes %s; run one call "
                "on the capture stream before capturing", kernel, instead)


def counters(device: torch.device, groups: int, kernel: str, instead: str) -> torch.Tensor | None:
    """The meeting counters of `groups` groups on the current stream (a launch on another stream
    must not share them); None inside a CUDA-graph capture on a stream that has none yet, where the
    caller takes `instead` (said once in a warning). Made there, they would be zeroed only when that
    graph replays, while graphs captured later on the stream share them and may replay first, over
    whatever the memory held: meetings that let a program through early. Nor can a capture make them
    on a side stream (PyTorch's default capture mode refuses it: H100, 2026-11-26). A graph keeps
    the counters of the stream it was captured on, wherever it replays: nothing else may use them
    meanwhile. Groups of several programs never outnumber the SMs, so the first buffer is final."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    buf = _counters.get((device, stream))
    if buf is None or buf.numel() < groups:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            _warn_capture_once(kernel, instead)
            return None
        buf = _counters[(device, stream)] = torch.zeros(max(groups, num_sms(device)), device=device, dtype=torch.int32)
    return buf


def refused(kernel: str, device: torch.device, grid: int) -> bool:
    """Whether the driver already refused `kernel`'s cooperative launch of this many programs or fewer."""
    return grid >= _refused.get((kernel, device), grid + 1)


def refuse(kernel: str, device: torch.device, grid: int) -> None:
    """Remember that the driver refused this grid (e.g. an MPS client given fewer SMs than the device has)."""
    _refused[(kernel, device)] = min(grid, _refused.get((kernel, device), grid))


def is_refusal(exc: RuntimeError) -> bool:
    """Whether a launch failed because the grid cannot be resident at once."""
    return "cooperative" in str(exc)
