"""Inputs the sparse MLA benchmarks share."""

from __future__ import annotations

import torch

from dsa_kernels import dispatch


def random_fp8_pool(slots: int) -> torch.Tensor:
    """An FP8 MLA pool [slots, 656] (the layout FlashMLA's sparse decode reads) of random latents."""
    pool = torch.zeros(slots, 656, dtype=torch.uint8, device="cuda")
    dispatch.store_mla_kv(pool, torch.randn(slots, 512, device="cuda"), torch.randn(slots, 64, device="cuda"),
                          torch.arange(slots, device="cuda"))
    return pool
