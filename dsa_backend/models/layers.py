"""Small building blocks shared by the DSA layers: RMSNorm, the dense SwiGLU MLP, RoPE's cos / sin
(dsa_kernels.rope applies them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import dsa_kernels

from dsa_backend.config import RopeConfig
from dsa_backend.models.fp8_linear import Fp8Linear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalized in float32, scaled in x's dtype (one kernel for bf16 on a GPU)
        return dsa_kernels.rms_norm(x, self.weight, self.eps)


class DenseMlp(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up one GEMM (the loader stacks the checkpoint's
    gate_proj and up_proj, weights.GATE_UP). With FP8 weights the activation is quantized for the
    down projection in the pass that computes it (dsa_kernels.silu_mul_quantize)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if isinstance(self.down_proj, Fp8Linear):
            return self.down_proj.on_quantized(*dsa_kernels.silu_mul_quantize(gate_up), gate_up.dtype)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class RotaryEmbedding(nn.Module):
    """cos/sin [T, dim / 2] for token positions, with the YaRN attention factor folded in."""

    def __init__(self, rope: RopeConfig):
        super().__init__()
        inv_freq, self.attention_factor = rope.inv_freq_and_attention_factor()
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        return freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor
