"""What the sparse MLA benchmarks share: their random FP8 pool, and their rows' JSON record."""

from __future__ import annotations

import json
import time

import torch

from dsa_kernels import dispatch


def random_fp8_pool(slots: int) -> torch.Tensor:
    """An FP8 MLA pool [slots, 656] (the layout FlashMLA's sparse decode reads) of random latents."""
    pool = torch.zeros(slots, 656, dtype=torch.uint8, device="cuda")
    dispatch.store_mla_kv(pool, torch.randn(slots, 512, device="cuda"), torch.randn(slots, 64, device="cuda"),
                          torch.arange(slots, device="cuda"))
    return pool


def save_rows(path: str, rows: list, **extra) -> None:
    """The rows so far, with the date and the GPU, to `path`: rewritten after every row, so that a call
    cut off by its timeout keeps the finished ones."""
    with open(path, "w") as f:
        json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), **extra, rows=rows), f,
                  indent=1)
