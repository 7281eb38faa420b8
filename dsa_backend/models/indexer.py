"""The lightning indexer: scores every cached key for each query token and keeps the top-k."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import dsa_kernels

from dsa_backend.batch import ForwardBatch
from dsa_backend.cache import KVCache
from dsa_backend.config import ModelConfig
from dsa_kernels.reference import hadamard_matrix


class Indexer(nn.Module):
    def __init__(self, c: ModelConfig, layer_id: int):
        super().__init__()
        self.c = c
        self.layer_id = layer_id
        # Its wq_b and wk run stacked with the attention's projections of the same input (mla.py).
        self.k_norm = nn.LayerNorm(c.index_head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(c.hidden_size, c.index_n_heads, bias=False)
        self.softmax_scale = c.index_head_dim**-0.5
        self._hadamard: dict = {}  # (device, dtype) -> [D, D]; built once, not a checkpoint tensor

    def _rotation(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.device, like.dtype)
        if key not in self._hadamard:
            self._hadamard[key] = hadamard_matrix(self.c.index_head_dim).to(like.device, like.dtype)
        return self._hadamard[key]

    def forward(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: ForwardBatch, cache: KVCache, backend) -> torch.Tensor:
        """x [T, hidden], q = wq_b(q_lora) [T, heads * head_dim], k = wk(x) [T, head_dim] ->
        top-k positions [T, index_topk] int32."""
        c = self.c
        q = q.view(-1, c.index_n_heads, c.index_head_dim)
        k = self.k_norm(k)
        r = c.qk_rope_head_dim
        q = dsa_kernels.rope(q, cos, sin, c.indexer_rope_interleaved, rotary_dim=r)
        k = dsa_kernels.rope(k, cos, sin, c.indexer_rope_interleaved, rotary_dim=r)
        if cache.indexer.fp8:
            # Rotating both sides keeps q.k and spreads outliers before e4m3 quantization (the pool
            # quantizes k, the backend q).
            h = self._rotation(q)
            q, k = q @ h, k @ h
        cache.indexer.store(self.layer_id, batch.out_cache_loc, k)
        # The head weights stay in float32, as in the releases.
        weights = F.linear(x.float(), self.weights_proj.weight.float()) * c.index_n_heads**-0.5
        return backend.indexer_topk(q, weights, cache.indexer, self.layer_id, batch, c.index_topk,
                                    self.softmax_scale)
