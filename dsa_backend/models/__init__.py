"""DSA model: MLA with the lightning indexer, MoE, YaRN RoPE, and the MTP layer."""

from __future__ import annotations

from pathlib import Path

import torch

from dsa_backend.config import ModelConfig
from dsa_backend.models.fp8_linear import expect_fp8_weights
from dsa_backend.models.model import DsaForCausalLM, ForwardOutput
from dsa_backend.parallel import TensorParallel
from dsa_backend.weights import CheckpointInfo, load_weights

__all__ = ["DsaForCausalLM", "ForwardOutput", "load_model"]


def load_model(model_dir: str | Path, dtype: torch.dtype, device: torch.device | str = "cpu",
               config: ModelConfig | None = None, keep_fp8: bool = False,
               tp: TensorParallel = TensorParallel()) -> tuple[DsaForCausalLM, CheckpointInfo]:
    """Build the model from a checkpoint directory, weights validated and converted to `dtype`;
    keep_fp8: an FP8 checkpoint's block weights stay e4m3 (models/fp8_linear.py); tp: this rank's
    shard (dsa_backend/parallel.py; the model's config is then the rank's sizes)."""
    config = config or ModelConfig.from_pretrained(model_dir)
    state, info = load_weights(model_dir, config, dtype, keep_fp8, tp, device)
    with torch.device("meta"):
        model = DsaForCausalLM(config.sharded(tp.size), info.mtp_has_indexer, tp=tp)
    expect_fp8_weights(model, state)
    model.load_state_dict(state, strict=True, assign=True)
    # Inference everywhere but in tools/train_mtp, which turns gradients back on for the MTP layer.
    return model.to(device).eval().requires_grad_(False), info
