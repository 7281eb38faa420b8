"""Multi-head latent attention with DSA: the latent KV is cached, attention reads only the top-k."""

from __future__ import annotations

import torch
from torch import nn

import dsa_kernels

from dsa_backend.batch import ForwardBatch
from dsa_backend.cache import KVCache
from dsa_backend.config import ModelConfig
from dsa_backend.models.indexer import Indexer
from dsa_backend.models.layers import RMSNorm
from dsa_backend.weights import stacked_projections

# The latent norms use their own epsilon in the releases, not rms_norm_eps.
_LATENT_NORM_EPS = 1e-6


class MlaAttention(nn.Module):
    def __init__(self, c: ModelConfig, layer_id: int, has_indexer: bool, is_nextn: bool = False):
        super().__init__()
        self.c = c
        self.layer_id = layer_id
        self.is_nextn = is_nextn
        h, heads = c.hidden_size, c.num_attention_heads
        # Projections of one input run as one GEMM (one quantization of it, one launch): the
        # checkpoint's q_a, indexer wk and kv_a stacked by rows, and q_b with the indexer's wq_b.
        stacked = stacked_projections(c, has_indexer)
        self.qkv_a_rows = [rows for _, rows in stacked["qkv_a_proj"]]
        self.q_heads_rows = [rows for _, rows in stacked["q_heads_proj"]]
        self.qkv_a_proj = nn.Linear(h, sum(self.qkv_a_rows), bias=False)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, _LATENT_NORM_EPS)
        self.q_heads_proj = nn.Linear(c.q_lora_rank, sum(self.q_heads_rows), bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, _LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * c.v_head_dim, h, bias=False)
        self.indexer = Indexer(c, layer_id) if has_indexer else None

    def _select_topk(self, x, index_qk, cos, sin, batch, cache, backend, prev_topk):
        # A shared layer must never fall back to an indexer it does not have; only the MTP layer
        # may run its own when no top-k is handed to it.
        if self.indexer is not None and (not self.is_nextn or prev_topk is None):
            return self.indexer(x, *index_qk, cos, sin, batch, cache, backend)
        if prev_topk is None:
            what = "the MTP layer has no indexer weights" if self.is_nextn else "it is a shared top-k layer"
            raise ValueError(f"layer {self.layer_id} needs top-k indices from an earlier layer: {what}")
        return prev_topk

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch,
                cache: KVCache, backend, prev_topk: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (output [T, hidden], top-k positions [T, index_topk] used by this layer)."""
        c = self.c
        heads = c.num_attention_heads
        q_a, *index_k, kv_a = self.qkv_a_proj(x).split(self.qkv_a_rows, dim=-1)
        q, *index_q = self.q_heads_proj(self.q_a_layernorm(q_a)).split(self.q_heads_rows, dim=-1)
        q_nope, q_rope = q.view(-1, heads, c.qk_head_dim).split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rope = kv_a.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        k_rope = dsa_kernels.rope(k_rope, cos, sin, interleaved=True)
        cache.mla.store(self.layer_id, batch.out_cache_loc, latent, k_rope)
        # index_q + index_k: the indexer's query and key projections, none in a layer without one
        topk = self._select_topk(x, index_q + index_k, cos, sin, batch, cache, backend, prev_topk)

        # Absorb kv_b_proj into the query and the output so attention runs on the cached latent.
        kv_b = self.kv_b_proj.weight.view(heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        w_uk, w_uv = kv_b[:, : c.qk_nope_head_dim], kv_b[:, c.qk_nope_head_dim :]
        q_latent = torch.einsum("thd,hdc->thc", q_nope, w_uk)
        q_absorbed = dsa_kernels.rope(q_rope, cos, sin, interleaved=True, prefix=q_latent)  # [q_latent | rope]
        out_latent = backend.sparse_mla(q_absorbed, cache.mla, self.layer_id, batch, topk, c.softmax_scale)
        out = torch.einsum("thc,hvc->thv", out_latent, w_uv)
        return self.o_proj(out.reshape(-1, heads * c.v_head_dim)), topk
