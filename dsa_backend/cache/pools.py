"""The two paged KV pools of a DSA model, and moving KV between slots in both.

A slot is page * page_size + offset; one page id addresses the same tokens in both pools.
MLA latent pool: per layer [slots, kv_lora_rank + rope] in the model dtype, or [slots, 656] uint8
in the FP8 layout. Indexer-key pool (only layers that run their own indexer): per layer
[pages, page_size * 132] uint8 in the FP8 layout, or [slots, index_head_dim] in the model dtype
for exact reference runs. Layouts are defined in layout.py.
"""

from __future__ import annotations

import torch

from dsa_backend.cache import layout


class MlaKVPool:
    """Compressed MLA latent (kv_lora_rank) and rope key per token, per layer."""

    def __init__(self, num_layers: int, num_slots: int, kv_lora_rank: int, rope_dim: int,
                 dtype: torch.dtype, fp8: bool, device: torch.device | str):
        self.fp8 = fp8
        self.kv_lora_rank = kv_lora_rank
        self.dtype = dtype
        if fp8:
            if (kv_lora_rank, rope_dim) != (layout.KV_LORA_RANK, layout.ROPE_DIM):
                raise ValueError(f"the FP8 MLA layout needs kv_lora_rank 512 and rope 64, "
                                 f"got {kv_lora_rank} and {rope_dim}")
            self.buffer = torch.zeros(num_layers, num_slots, layout.MLA_FP8_BYTES, dtype=torch.uint8, device=device)
        else:
            self.buffer = torch.zeros(num_layers, num_slots, kv_lora_rank + rope_dim, dtype=dtype, device=device)

    @property
    def bytes_per_token(self) -> int:
        return self.buffer.shape[0] * self.buffer.shape[2] * self.buffer.element_size()

    def store(self, layer: int, slots: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor) -> None:
        """latent [T, kv_lora_rank], rope [T, rope_dim] -> the layer's slots [T]."""
        if self.fp8:
            self.buffer[layer, slots] = layout.pack_mla_fp8(latent, rope)
        else:
            self.buffer[layer, slots] = torch.cat([latent, rope], dim=-1).to(self.dtype)

    def load(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """slots [...] -> [..., kv_lora_rank + rope] in the model dtype (dequantized if FP8)."""
        rows = self.buffer[layer, slots.reshape(-1)]
        if self.fp8:
            rows = layout.unpack_mla_fp8(rows).to(self.dtype)
        return rows.view(*slots.shape, -1)


class IndexerKeyPool:
    """Indexer keys of the full-indexer layers; shared layers own no keys."""

    def __init__(self, full_layers: tuple[int, ...], num_pages: int, page_size: int, head_dim: int,
                 dtype: torch.dtype, fp8: bool, device: torch.device | str):
        self.index_of_layer = {layer: i for i, layer in enumerate(full_layers)}
        self.page_size = page_size
        self.fp8 = fp8
        self.dtype = dtype
        n = len(full_layers)
        if fp8:
            if head_dim != layout.INDEX_HEAD_DIM:
                raise ValueError(f"the FP8 indexer layout needs index_head_dim 128, got {head_dim}")
            self.buffer = torch.zeros(n, num_pages, page_size * layout.INDEX_FP8_BYTES, dtype=torch.uint8,
                                      device=device)
        else:
            self.buffer = torch.zeros(n, num_pages * page_size, head_dim, dtype=dtype, device=device)

    @property
    def bytes_per_token(self) -> int:
        per_layer = self.buffer.shape[2] // self.page_size if self.fp8 else self.buffer.shape[2]
        return self.buffer.shape[0] * per_layer * self.buffer.element_size()

    def _value_and_scale_bytes(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat byte offsets within one layer of each slot's 128 values and 4 scale bytes."""
        page, offset = slots // self.page_size, slots % self.page_size
        page_base = page * self.page_size * layout.INDEX_FP8_BYTES
        values = page_base[:, None] + offset[:, None] * layout.INDEX_HEAD_DIM + torch.arange(
            layout.INDEX_HEAD_DIM, device=slots.device)
        scale_base = page_base + self.page_size * layout.INDEX_HEAD_DIM + offset * 4
        scales = scale_base[:, None] + torch.arange(4, device=slots.device)
        return values, scales

    def store(self, layer: int, slots: torch.Tensor, keys: torch.Tensor) -> None:
        """keys [T, head_dim] -> the layer's slots [T]."""
        i = self.index_of_layer[layer]
        if not self.fp8:
            self.buffer[i, slots] = keys.to(self.dtype)
            return
        values, scales = layout.quantize_index_keys(keys)
        flat = self.buffer[i].view(-1)
        value_at, scale_at = self._value_and_scale_bytes(slots)
        flat[value_at] = values.view(torch.uint8)
        flat[scale_at] = scales.contiguous().view(torch.uint8).view(-1, 4)

    def load(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """slots [N] -> keys [N, head_dim] in the model dtype (dequantized if FP8)."""
        i = self.index_of_layer[layer]
        if not self.fp8:
            return self.buffer[i, slots]
        flat = self.buffer[i].view(-1)
        value_at, scale_at = self._value_and_scale_bytes(slots)
        values = flat[value_at].view(layout.FP8)
        scales = flat[scale_at].contiguous().view(torch.float32)
        return layout.dequantize_fp8_rows(values, scales).to(self.dtype)

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        for layer in self.index_of_layer:
            i = self.index_of_layer[layer]
            if not self.fp8:
                self.buffer[i, dst] = self.buffer[i, src]
                continue
            flat = self.buffer[i].view(-1)
            src_values, src_scales = self._value_and_scale_bytes(src)
            dst_values, dst_scales = self._value_and_scale_bytes(dst)
            flat[dst_values] = flat[src_values]
            flat[dst_scales] = flat[src_scales]
