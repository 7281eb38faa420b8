"""DSA attention backends: indexer top-k and sparse MLA over the paged pools.

Two backends share one contract. `indexer_topk` returns top-k as token positions within each
request (-1 = unused, ascending) and `sparse_mla` maps positions to pool slots through the block
table, so a shared layer or the MTP layer can reuse a top-k across batches of the same requests.
Positions are KV positions: in a draft tree (batch.tree) node i of a tree based at b sits at
position b + i, so top-k names each node's own slot although siblings share a RoPE position; the
indexer ranges only over what the token sees (TreeVisibility), and sparse MLA reads only the top-k.
- TorchDsaBackend: the reference (CPU, and the oracle on the GPU), built on dsa_kernels.reference.
- KernelDsaBackend: dsa_kernels dispatch (DeepGEMM / FlashMLA / Triton). Prefill (EXTEND) takes
  the ragged indexer path, decode-like modes the paged one with one context length per query token.
`default_backend(device)` picks the kernel backend on CUDA, the reference elsewhere.
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache.layout import quantize_fp8_rows
from dsa_backend.cache.pools import IndexerKeyPool, MlaKVPool
from dsa_kernels import reference as ref

log = logging.getLogger(__name__)


def per_token_context_lens(batch: ForwardBatch) -> torch.Tensor:
    """Keys visible to each query token, as one row per token: [tokens, 1] int32.

    However many query tokens a request has (next_n draft tokens in verify, say), paged kernels
    get one row per query token; the (batch, next_n) shape is what hung SGLang's MTP on DSA.
    """
    return (batch.positions + 1).to(torch.int32).view(-1, 1)


def request_of_token(batch: ForwardBatch) -> torch.Tensor:
    """Batch row of each query token: [tokens] int64 (no host sync)."""
    rows = torch.arange(batch.batch_size, device=batch.extend_lens.device)
    return torch.repeat_interleave(rows, batch.extend_lens.long(), output_size=batch.num_tokens)


def shared_page_walk(batch: ForwardBatch) -> int | None:
    """The next_n of a paged indexer call where every request has the same number n of query
    tokens (decode, a chain verify, a batch of equal draft trees): a request's n tokens then
    share one walk over its pages (seed 001). None where the counts differ."""
    n, rest = divmod(batch.num_tokens, batch.batch_size)
    if rest == 0 and (n == 1 or bool((batch.extend_lens == n).all())):  # n == 1: one each, no sync
        return n
    return None


def positions_to_slots(batch: ForwardBatch, positions: torch.Tensor) -> torch.Tensor:
    """Top-k positions [tokens, k] -> pool slot ids [tokens, k] int32 (-1 stays -1)."""
    table = batch.block_table[request_of_token(batch)]
    return ref.paged_transform_ref(positions, table, batch.page_size)


def fold_indexer_scales(q: torch.Tensor, weights: torch.Tensor, fp8: bool,
                        softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], weights [T, H] -> (q as the logits kernels take it, weights [T, H] fp32).

    The kernels score k_scale * sum_h w_h relu(q_h . k): relu commutes with positive scales, so
    softmax_scale and, for the FP8 pool, q's per-(token, head) e4m3 scale fold into w.
    """
    w = weights.float() * softmax_scale
    if not fp8:
        return q, w
    values, scale = quantize_fp8_rows(q, q.shape[-1])
    return values, w * scale.squeeze(-1)


class TorchDsaBackend:
    """Reference implementation of the two DSA steps of a layer (a loop over requests)."""

    def indexer_topk(self, q: torch.Tensor, weights: torch.Tensor, pool: IndexerKeyPool, layer: int,
                     batch: ForwardBatch, topk: int, softmax_scale: float) -> torch.Tensor:
        """q [T, heads, D] (Hadamard-rotated for an FP8 pool), weights [T, heads] -> top-k key
        positions [T, topk] int32, -1 padded.

        score[t, s] = sum_h weights[t, h] * relu(softmax_scale * q[t, h] . k[s]), for s <= position[t];
        with an FP8 pool, q is quantized to e4m3 per (token, head) as the keys are.
        """
        q_in, w = fold_indexer_scales(q, weights, pool.fp8, softmax_scale)
        keys = pool.buffer[pool.index_of_layer[layer]]
        context = per_token_context_lens(batch)
        out = torch.full((batch.num_tokens, topk), -1, dtype=torch.int32, device=q.device)
        offsets = batch.token_offsets
        for r in range(batch.batch_size):
            rows = slice(offsets[r], offsets[r + 1])
            n = offsets[r + 1] - offsets[r]
            seq_len = int(batch.seq_lens[r])
            if batch.tree is None:
                logits = ref.paged_indexer_logits_ref(q_in[rows], w[rows], keys, batch.block_table[r : r + 1],
                                                      context[rows], batch.page_size, seq_len, n)
                out[rows] = ref.topk_positions_ref(logits, context[rows], topk)
                continue
            # Score every key of the request, then rank each token's visible keys only, in
            # position order (so ties break as in a plain causal pass over the same sequence).
            every_key = torch.full_like(context[rows], seq_len)
            logits = ref.paged_indexer_logits_ref(q_in[rows], w[rows], keys, batch.block_table[r : r + 1],
                                                  every_key, batch.page_size, seq_len, n)
            visible = batch.tree.visible_positions(rows, int(context[rows].max()))
            picked = ref.topk_positions_ref(logits.gather(1, visible), context[rows], topk)
            out[rows] = torch.where(picked >= 0, visible.gather(1, picked.long().clamp_min(0)), -1).to(torch.int32)
        return out

    def sparse_mla(self, q: torch.Tensor, pool: MlaKVPool, layer: int, batch: ForwardBatch,
                   topk_positions: torch.Tensor, softmax_scale: float) -> torch.Tensor:
        """Absorbed MLA: q [T, heads, kv_lora_rank + rope] over the selected latents -> [T, heads, kv_lora_rank]."""
        slots = positions_to_slots(batch, topk_positions)
        out, _ = ref.sparse_mla_ref(q, pool.buffer[layer], slots, softmax_scale, v_dim=pool.kv_lora_rank)
        return out.to(q.dtype)


@functools.cache
def _note_fallback(what: str) -> None:
    log.info("DSA kernel backend: %s uses the PyTorch reference", what)


class KernelDsaBackend:
    """The two DSA steps through dsa_kernels (GPU). What the kernels do not cover falls back to the
    reference, logged once: the indexer over an exact key pool (the kernels read only the FP8
    layout, which kv_cache_dtype "auto" gives on CUDA too), and sparse MLA unless q and an exact
    pool are bf16. Draft trees need no mask
    kernel: the indexer ranks each token's visible keys (_tree_topk), sparse MLA reads the top-k."""

    def __init__(self):
        self.reference = TorchDsaBackend()

    def indexer_topk(self, q: torch.Tensor, weights: torch.Tensor, pool: IndexerKeyPool, layer: int,
                     batch: ForwardBatch, topk: int, softmax_scale: float) -> torch.Tensor:
        """Same contract as TorchDsaBackend.indexer_topk."""
        import dsa_kernels

        if not pool.fp8 or q.shape[-1] != 128:
            _note_fallback("the indexer over an exact key pool (kv_cache_dtype='auto' off CUDA)")
            return self.reference.indexer_topk(q, weights, pool, layer, batch, topk, softmax_scale)
        q_fp8, w = fold_indexer_scales(q, weights, True, softmax_scale)
        keys = pool.buffer[pool.index_of_layer[layer]]
        context = per_token_context_lens(batch)
        if batch.tree is not None:
            return self._tree_topk(q_fp8, w, keys, batch, context, topk)
        if batch.mode is ForwardMode.EXTEND:
            logits, starts = self._ragged_logits(q_fp8, w, keys, batch)
        else:
            logits, starts = self._paged_logits(q_fp8, w, keys, batch, context, clean_logits=False), None
        # The ragged transform with zero offsets leaves positions within the request. It reads each
        # row's [start, start + context) only, so the logits skip their -inf fill past those ranges.
        zeros = torch.zeros(batch.num_tokens, dtype=torch.int32, device=q.device)
        return dsa_kernels.topk_transform(logits, context, topk, "ragged", row_starts=starts, offsets=zeros)

    @staticmethod
    def _tree_topk(q_fp8, w, keys, batch: ForwardBatch, context, topk: int) -> torch.Tensor:
        """Draft trees without a tree-mask kernel: score every key of the request with the paged
        kernel, move each token's ancestors' logits in place to the columns right behind its
        prefix, so that its visible keys fill its row's first `context` columns in position order,
        take the causal top-k there and map the picks back to KV positions. Ties break to the
        lower position, as in a plain pass over the token's path."""
        import dsa_kernels

        every_key = batch.seq_lens[request_of_token(batch)].to(torch.int32).view(-1, 1)
        logits = KernelDsaBackend._paged_logits(q_fp8, w, keys, batch, every_key, clean_logits=False)
        base, ancestors = batch.tree.base[:, None], batch.tree.ancestors
        # Column base + j takes the logit of the token's j-th node from the root; past the token's
        # own depth, of its own node again, so that a column written twice gets one value twice.
        step = torch.arange(ancestors.shape[1], device=base.device)[None, :].minimum(context.long() - 1 - base)
        path = base + ancestors.gather(1, step)
        logits.scatter_(1, base + step, logits.gather(1, path))
        zeros = torch.zeros(batch.num_tokens, dtype=torch.int32, device=q_fp8.device)
        picked = dsa_kernels.topk_transform(logits, context, topk, "ragged", offsets=zeros).long()
        on_path = path.gather(1, (picked - base).clamp(0, ancestors.shape[1] - 1))
        return torch.where(picked < base, picked, on_path).to(torch.int32)  # -1 (unused) < base stays -1

    @staticmethod
    def _paged_logits(q_fp8, w, keys, batch: ForwardBatch, context, clean_logits: bool) -> torch.Tensor:
        """Logits [T, max seq_len] of each token against its request's first `context` keys."""
        import dsa_kernels

        next_n, table, backend = shared_page_walk(batch), batch.block_table, "auto"
        if next_n is None:
            # Uneven counts: each token walks alone, through a copy of its request's table row.
            # Ours scores a request's tokens in neighbouring programs, which find its keys in L2;
            # DeepGEMM reads them from HBM for every token (up to 2.4x slower; docs/PERFORMANCE.md,
            # "One page walk a request in tree verify").
            table, next_n, backend = batch.block_table[request_of_token(batch)], 1, "ours"
        return dsa_kernels.paged_indexer_logits(q_fp8, w, keys, table.contiguous(), context,
                                                page_size=batch.page_size, max_context_len=int(batch.seq_lens.max()),
                                                next_n=next_n, clean_logits=clean_logits, backend=backend)

    @staticmethod
    def _ragged_logits(q_fp8, w, keys, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather every request's keys [0, seq_len) into one buffer; query t sees its request's
        range up to its own position. -> (logits [T, sum seq_lens], row starts [T] int32)."""
        import dsa_kernels

        seq_lens = batch.seq_lens.long()
        base = torch.cumsum(seq_lens, 0) - seq_lens
        num_keys = int(seq_lens.sum())
        req_of_key = torch.repeat_interleave(torch.arange(batch.batch_size, device=seq_lens.device), seq_lens,
                                             output_size=num_keys)
        pos = torch.arange(num_keys, device=seq_lens.device) - base[req_of_key]
        slots = batch.block_table.long()[req_of_key, pos // batch.page_size] * batch.page_size + pos % batch.page_size
        k_fp8, k_scale = ref.gather_index_keys_ref(keys, slots, batch.page_size)
        start = base[request_of_token(batch)]
        end = start + batch.positions.long() + 1
        logits = dsa_kernels.ragged_indexer_logits(q_fp8, w, k_fp8.contiguous(), k_scale, start.int(), end.int(),
                                                   clean_logits=False)
        return logits, start.int()

    def sparse_mla(self, q: torch.Tensor, pool: MlaKVPool, layer: int, batch: ForwardBatch,
                   topk_positions: torch.Tensor, softmax_scale: float) -> torch.Tensor:
        """Same contract as TorchDsaBackend.sparse_mla."""
        import dsa_kernels

        kv = pool.buffer[layer]
        if q.dtype != torch.bfloat16 or not (pool.fp8 or kv.dtype == torch.bfloat16) or q.shape[-1] != 576:
            _note_fallback(f"sparse MLA with q {q.dtype} over a {kv.dtype} pool")
            return self.reference.sparse_mla(q, pool, layer, batch, topk_positions, softmax_scale)
        slots = positions_to_slots(batch, topk_positions).contiguous()
        heads = q.shape[1]
        if heads % 64:  # FlashMLA and the Triton tiles take heads in multiples of 64; pad with zero queries
            q = torch.cat([q, q.new_zeros(q.shape[0], 64 - heads % 64, q.shape[2])], dim=1)
        q = q.contiguous()
        if pool.fp8 or batch.mode is not ForwardMode.EXTEND:
            out, _ = dsa_kernels.sparse_mla_decode(q, kv, slots, softmax_scale)
        else:  # a bf16 pool is a plain [S, 576] KV buffer for the sparse prefill kernel
            out, _ = dsa_kernels.sparse_mla_prefill(q, kv, slots, softmax_scale)
        return out[:, :heads]


def default_backend(device: torch.device | str):
    """The kernel backend on CUDA, the reference elsewhere or without Triton (absent DeepGEMM /
    FlashMLA are no error: dsa_kernels falls back to its Triton kernels)."""
    if torch.device(device).type == "cuda" and importlib.util.find_spec("triton") is not None:
        return _kernel_backend()
    return _torch_backend()


@functools.cache
def _kernel_backend() -> KernelDsaBackend:
    return KernelDsaBackend()


@functools.cache
def _torch_backend() -> TorchDsaBackend:
    return TorchDsaBackend()
