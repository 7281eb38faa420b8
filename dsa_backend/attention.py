"""DSA attention backend: indexer top-k and sparse MLA over the paged pools.

This is the PyTorch reference (CPU, and the oracle for GPU kernels). Prefill (EXTEND) takes the
ragged path: each request's keys are its own range of positions. Decode-like modes (DECODE,
TARGET_VERIFY, DRAFT_EXTEND) take the paged path: keys are read through the block table with one
context length per query token. Both return top-k as token positions within the request
(-1 = unused); sparse MLA turns positions into pool slots through the block table.
"""

from __future__ import annotations

import torch

from dsa_backend.batch import ForwardBatch
from dsa_backend.cache.pools import IndexerKeyPool, MlaKVPool

# Query tokens per chunk in the reference sparse attention: bounds the gathered [n, topk, 576].
_QUERY_CHUNK = 256


def per_token_context_lens(batch: ForwardBatch) -> torch.Tensor:
    """Keys visible to each query token, as one row per token: [tokens, 1] int32.

    However many query tokens a request has (next_n draft tokens in verify, say), paged kernels
    get one row per query token; the (batch, next_n) shape is what hung SGLang's MTP on DSA.
    """
    return (batch.positions + 1).to(torch.int32).view(-1, 1)


class TorchDsaBackend:
    """Reference implementation of the two DSA steps of a layer."""

    def indexer_topk(self, q: torch.Tensor, weights: torch.Tensor, pool: IndexerKeyPool, layer: int,
                     batch: ForwardBatch, topk: int, softmax_scale: float) -> torch.Tensor:
        """q [T, heads, D], weights [T, heads] -> top-k key positions [T, topk] int32 (-1 padded).

        score[t, s] = sum_h weights[t, h] * relu(softmax_scale * q[t, h] . k[s]), for s <= position[t].
        """
        out = torch.full((batch.num_tokens, topk), -1, dtype=torch.int32, device=q.device)
        context = per_token_context_lens(batch).view(-1)
        offsets = batch.token_offsets
        for r in range(batch.batch_size):
            rows = slice(offsets[r], offsets[r + 1])
            kv_len = int(batch.seq_lens[r])
            keys = pool.load(layer, batch.slots(r, torch.arange(kv_len, device=q.device)))
            scores = torch.relu(torch.matmul(q[rows].float(), keys.float().T) * softmax_scale)
            logits = torch.matmul(weights[rows].float().unsqueeze(1), scores).squeeze(1)  # [n, kv_len]
            visible = torch.arange(kv_len, device=q.device)[None, :] < context[rows, None]
            logits = logits.masked_fill(~visible, float("-inf"))
            k = min(topk, kv_len)
            values, indices = logits.topk(k, dim=-1)
            out[rows, :k] = torch.where(values == float("-inf"), -1, indices).to(torch.int32)
        return out

    def sparse_mla(self, q: torch.Tensor, pool: MlaKVPool, layer: int, batch: ForwardBatch,
                   topk_positions: torch.Tensor, softmax_scale: float) -> torch.Tensor:
        """Absorbed MLA: q [T, heads, kv_lora_rank + rope] over the selected latents -> [T, heads, kv_lora_rank]."""
        out = q.new_empty(q.shape[0], q.shape[1], pool.kv_lora_rank)
        offsets = batch.token_offsets
        for r in range(batch.batch_size):
            for start in range(offsets[r], offsets[r + 1], _QUERY_CHUNK):
                rows = slice(start, min(start + _QUERY_CHUNK, offsets[r + 1]))
                positions = topk_positions[rows].long()
                kv = pool.load(layer, batch.slots(r, positions.clamp(min=0)))  # [n, topk, 576]
                scores = torch.einsum("nhd,nkd->nhk", q[rows].float(), kv.float()) * softmax_scale
                scores = scores.masked_fill((positions < 0)[:, None, :], float("-inf"))
                probs = torch.softmax(scores, dim=-1)
                out[rows] = torch.einsum("nhk,nkc->nhc", probs, kv[..., : pool.kv_lora_rank].float()).to(q.dtype)
        return out
