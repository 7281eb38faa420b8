"""Batch-invariant GEMM and row reductions (placeholder being written)."""

from __future__ import annotations

import torch


def enable_batch_invariant_mode(device: torch.device) -> None:
    raise NotImplementedError
