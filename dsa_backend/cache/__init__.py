"""Paged KV cache of a DSA model: one page allocator over the MLA latent and indexer-key pools, and the
prefix cache that keeps pages past their requests."""

from __future__ import annotations

import torch

from dsa_backend.cache.allocator import OutOfPages, PageAllocator, pages_needed
from dsa_backend.cache.pools import IndexerKeyPool, MlaKVPool
from dsa_backend.cache.prefix_cache import PrefixCache
from dsa_backend.config import ModelConfig

__all__ = ["KVCache", "OutOfPages", "PageAllocator", "PrefixCache", "indexer_is_fp8", "pages_needed"]


def indexer_is_fp8(kv_cache_dtype: str, device: torch.device | str) -> bool:
    """Whether the indexer keys are stored in the FP8 layout (132 B per key).

    fp8 stores both pools in FP8. auto keeps the MLA latent in the model dtype, and the indexer keys
    in FP8 on CUDA, as DeepSeek's own inference code does: the DSA kernels read only that layout,
    and exact keys would send every indexer call to the per-request reference. On the CPU auto
    keeps the keys exact, so top-k sets match transformers' indexer.
    """
    return kv_cache_dtype == "fp8" or (kv_cache_dtype == "auto" and torch.device(device).type == "cuda")


class KVCache:
    """Both pools for every attention layer, the MTP layers' included (layer ids after the main ones)."""

    def __init__(self, config: ModelConfig, num_pages: int, page_size: int = 64, *,
                 dtype: torch.dtype = torch.bfloat16, kv_cache_dtype: str = "auto",
                 mtp_has_indexer: bool = True, device: torch.device | str = "cpu", index_fp8: bool | None = None):
        """index_fp8 overrides indexer_is_fp8(kv_cache_dtype, device), e.g. to size a CUDA pool on "meta"."""
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        if kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"kv_cache_dtype must be 'auto' or 'fp8', got {kv_cache_dtype!r}")
        fp8 = kv_cache_dtype == "fp8"
        if index_fp8 is None:
            index_fp8 = indexer_is_fp8(kv_cache_dtype, device)
        num_mtp = config.num_nextn_predict_layers
        num_layers = config.num_hidden_layers + num_mtp
        full_layers = config.full_indexer_layers
        if mtp_has_indexer:
            full_layers += tuple(range(config.num_hidden_layers, num_layers))
        self.page_size = page_size
        self.allocator = PageAllocator(num_pages)
        self.mla = MlaKVPool(num_layers, num_pages * page_size, config.kv_lora_rank, config.qk_rope_head_dim,
                             dtype, fp8, device)
        self.indexer = IndexerKeyPool(full_layers, num_pages, page_size, config.index_head_dim, dtype, index_fp8,
                                      device)

    def move_kv_cache(self, dst_slots: torch.Tensor, src_slots: torch.Tensor) -> None:
        """Copy every layer's KV (both pools) from src_slots to dst_slots [N]; dst must be distinct."""
        if dst_slots.shape != src_slots.shape:
            raise ValueError(f"dst_slots {tuple(dst_slots.shape)} and src_slots {tuple(src_slots.shape)} differ")
        self.mla.buffer[:, dst_slots] = self.mla.buffer[:, src_slots]
        self.indexer.move(dst_slots, src_slots)

    @staticmethod
    def bytes_per_page(config: ModelConfig, page_size: int, kv_cache_dtype: str, dtype: torch.dtype,
                       device: torch.device | str) -> int:
        """Memory one page costs in both pools on `device` (for sizing the pools from a memory budget)."""
        probe = KVCache(config, 1, page_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype, device="meta",
                        index_fp8=indexer_is_fp8(kv_cache_dtype, device))
        return (probe.mla.bytes_per_token + probe.indexer.bytes_per_token) * page_size
