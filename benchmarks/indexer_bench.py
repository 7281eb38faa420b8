"""What the indexer benchmarks share: a pool of random FP8 key pages."""

from __future__ import annotations

import torch


def random_index_pool(pages: int, page_size: int = 64, device: str = "cuda") -> torch.Tensor:
    """Key pages [pages, page_size * 132] uint8 in the indexer pool's layout (dsa_backend.cache.layout):
    e4m3 keys from randn and fp32 scales in [0.01, 0.03), made 4096 pages at a time to bound the
    float temporaries."""
    pool = torch.empty(pages, page_size * 132, dtype=torch.uint8, device=device)
    keys = page_size * 128
    for s in range(0, pages, 4096):
        e = min(pages, s + 4096)
        pool[s:e, :keys] = torch.randn(e - s, keys, device=device).to(torch.float8_e4m3fn).view(torch.uint8)
        pool[s:e, keys:] = (torch.rand(e - s, page_size, device=device) * 0.02 + 0.01).view(torch.uint8)
    return pool
