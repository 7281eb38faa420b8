"""Byte layouts of the two KV pools, as PyTorch reference pack/unpack functions.

MLA latent, FP8 (656 B per token, the layout FlashMLA's sparse kernels read):
    [0, 512)    512 latent values, float8 e4m3, in 4 tiles of 128
    [512, 528)  4 float32 tile scales (value = e4m3 * scale)
    [528, 656)  64 rope values, bfloat16
Indexer keys, FP8 (132 B per token): a page of P tokens holds P*128 e4m3 values, then P float32
per-token scales. GPU kernels write and read exactly these bytes; tests compare against these
functions.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# Keeps the scale of an all-zero row finite; any tiny positive value works.
_MIN_AMAX = 1e-4

KV_LORA_RANK = 512
ROPE_DIM = 64
MLA_TILE = 128
MLA_FP8_BYTES = KV_LORA_RANK + 4 * (KV_LORA_RANK // MLA_TILE) + 2 * ROPE_DIM  # 656
INDEX_HEAD_DIM = 128
INDEX_FP8_BYTES = INDEX_HEAD_DIM + 4  # 132


def quantize_fp8_rows(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the last dim in groups of `group` to e4m3 with one float32 scale per group.

    x: [..., D] -> values [..., D] e4m3, scales [..., D // group] float32.
    """
    grouped = x.float().unflatten(-1, (-1, group))
    scale = grouped.abs().amax(-1).clamp_min(_MIN_AMAX) / FP8_MAX
    values = (grouped / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return values.flatten(-2), scale


def dequantize_fp8_rows(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_fp8_rows, in float32."""
    group = values.shape[-1] // scale.shape[-1]
    return (values.float().unflatten(-1, (-1, group)) * scale.unsqueeze(-1)).flatten(-2)


def pack_mla_fp8(latent: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """latent [T, 512], rope [T, 64] -> [T, 656] uint8 in the FlashMLA FP8 layout."""
    values, scale = quantize_fp8_rows(latent, MLA_TILE)
    return torch.cat(
        [
            values.view(torch.uint8),
            scale.contiguous().view(torch.uint8).view(-1, 16),
            rope.to(torch.bfloat16).contiguous().view(torch.uint8).view(-1, 2 * ROPE_DIM),
        ],
        dim=-1,
    )


def unpack_mla_fp8(packed: torch.Tensor) -> torch.Tensor:
    """[T, 656] uint8 -> [T, 576] float32 (dequantized latent, then rope)."""
    values = packed[:, :KV_LORA_RANK].contiguous().view(FP8)
    scale = packed[:, KV_LORA_RANK : KV_LORA_RANK + 16].contiguous().view(torch.float32)
    rope = packed[:, KV_LORA_RANK + 16 :].contiguous().view(torch.bfloat16)
    return torch.cat([dequantize_fp8_rows(values, scale), rope.float()], dim=-1)


def quantize_index_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [T, 128] -> values [T, 128] e4m3, per-token scales [T] float32."""
    values, scale = quantize_fp8_rows(keys, INDEX_HEAD_DIM)
    return values, scale.squeeze(-1)
