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
from dataclasses import dataclass

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache.layout import KV_LORA_RANK, ROPE_DIM, quantize_fp8_rows
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
    counts = set(batch.extend_lens_cpu)
    return counts.pop() if len(counts) == 1 else None


def request_key_slots(batch: ForwardBatch, requests: slice, key_lens: torch.Tensor,
                      num_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool slots of the first key_lens[i] positions of each request of batch rows `requests`,
    back to back ([num_keys] int64, num_keys = key_lens' sum known on the host), and each request's
    first row among them ([requests] int64)."""
    device = key_lens.device
    base = torch.cumsum(key_lens, 0) - key_lens
    req_of_key = torch.repeat_interleave(torch.arange(key_lens.shape[0], device=device), key_lens,
                                         output_size=num_keys)
    pos = torch.arange(num_keys, device=device) - base[req_of_key]
    table = batch.block_table[requests].long()
    return table[req_of_key, pos // batch.page_size] * batch.page_size + pos % batch.page_size, base


def positions_to_slots(batch: ForwardBatch, positions: torch.Tensor) -> torch.Tensor:
    """Top-k positions [tokens, k] -> pool slot ids [tokens, k] int32 (-1 stays -1)."""
    table = batch.block_table[request_of_token(batch)]
    return ref.paged_transform_ref(positions, table, batch.page_size)


# The ragged indexer's logits are [query rows, keys of the rows' requests] fp32. A prefill chunk
# batched with the decode tokens of many long requests would make one call of every request's keys
# (2048 + 63 rows against 64 requests of 32K keys: 17 GB on an H100). Pieces stay within this: a
# 2048-token chunk of a 128K prompt in one call. Each further piece costs ~0.7 ms of host time a
# layer (H100, docs/PERFORMANCE.md, "Prefill chunks among long decodes").
EXTEND_LOGITS_BYTES = 1 << 30


@dataclass(frozen=True)
class RaggedPiece:
    """One ragged indexer call of an EXTEND batch: token rows [rows] of requests [requests], which
    see the first key_lens[i] keys of the piece's i-th request (its last row's position + 1)."""

    rows: slice
    requests: slice
    key_lens: list[int]


def ragged_pieces(extend_lens: list[int], seq_lens: list[int], max_logits: int) -> list[RaggedPiece]:
    """Cut an EXTEND batch (causal: request r's rows take positions seq_lens[r] - extend_lens[r]
    on) into calls of at most max_logits logits: runs of whole requests where they fit together, and
    a request that does not fit alone in slices of its rows, max_logits // seq_len rows each."""
    pieces, first, rows, keys, row0 = [], 0, 0, 0, 0

    def close(end: int) -> None:
        if end > first:
            pieces.append(RaggedPiece(slice(row0, row0 + rows), slice(first, end), seq_lens[first:end]))

    for r, (n, length) in enumerate(zip(extend_lens, seq_lens)):
        if (rows + n) * (keys + length) > max_logits:
            close(r)
            first, row0, rows, keys = r, row0 + rows, 0, 0
            if n * length > max_logits:
                step, prefix = max(1, max_logits // length), length - n
                for a in range(0, n, step):
                    b = min(n, a + step)
                    pieces.append(RaggedPiece(slice(row0 + a, row0 + b), slice(r, r + 1), [prefix + b]))
                first, row0 = r + 1, row0 + n
                continue
        rows, keys = rows + n, keys + length
    close(len(seq_lens))
    return pieces


def heads_padded(q: torch.Tensor) -> torch.Tensor:
    """q [N, H, 576] with zero queries up to a multiple of 64 heads (FlashMLA and our tiles take
    heads in 64s), contiguous."""
    if q.shape[1] % 64:
        q = torch.cat([q, q.new_zeros(q.shape[0], 64 - q.shape[1] % 64, q.shape[2])], dim=1)
    return q.contiguous()


# A prefill step over an FP8 latent pool runs sparse MLA on FlashMLA's prefill kernel, over its
# requests' rows gathered and dequantized to bf16 (the ragged top-k transform, seed 002), rather
# than on the FP8 decode kernel a row a token. On the H200 (docs/PERFORMANCE.md, "FP8 prefill on
# FlashMLA's prefill kernel"): at 128 heads 1.10x from 128 tokens, 1.20x at 1024, 1.31-1.34x from
# 4096; at 64 heads 1.42-1.48x from 256 tokens but 0.85x at 64 and 0.36x at 16, where the prefill
# kernel's ~62 µs floor shows. Hence from MIN_GATHERED_HEAD_ROWS query tokens x heads. The gather
# reads at 3.7 TB/s: at 256 rows a token (512 tokens of a 128K context) the gain is down to 1.06x,
# hence at most GATHERED_ROWS_PER_TOKEN rows a token, and no more than EXTEND_LOGITS_BYTES of rows.
MIN_GATHERED_HEAD_ROWS = 128 * 128
GATHERED_ROWS_PER_TOKEN = 256


def gathers_fp8_rows(batch: ForwardBatch, q: torch.Tensor, topk: int) -> bool:
    """Whether an EXTEND step's sparse MLA of q [tokens, heads (padded), 576] over an FP8 pool
    gathers its rows for the prefill kernel."""
    import dsa_kernels

    rows = sum(batch.seq_lens_cpu)
    return (batch.num_tokens * q.shape[1] >= MIN_GATHERED_HEAD_ROWS
            and rows <= GATHERED_ROWS_PER_TOKEN * batch.num_tokens
            and rows * 2 * (KV_LORA_RANK + ROPE_DIM) <= EXTEND_LOGITS_BYTES
            and dsa_kernels.sparse_mla_prefill_on_flashmla(q, topk))


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
            seq_len = batch.seq_lens_cpu[r]
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

    def __init__(self, extend_logits_bytes: int = EXTEND_LOGITS_BYTES):
        self.reference = TorchDsaBackend()
        self.extend_logits_bytes = extend_logits_bytes

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
            return self._extend_topk(q_fp8, w, keys, batch, context, topk)
        logits = self._paged_logits(q_fp8, w, keys, batch, context, clean_logits=False)
        # The ragged transform with zero offsets leaves positions within the request. It reads each
        # row's first `context` columns only, so the logits skip their -inf fill past them.
        zeros = torch.zeros(batch.num_tokens, dtype=torch.int32, device=q.device)
        return dsa_kernels.topk_transform(logits, context, topk, "ragged", offsets=zeros)

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
                                                page_size=batch.page_size, max_context_len=batch.max_seq_len,
                                                next_n=next_n, clean_logits=clean_logits, backend=backend)

    def _extend_topk(self, q_fp8, w, keys, batch: ForwardBatch, context, topk: int) -> torch.Tensor:
        """Prefill chunks, and the decode tokens batched with them, through the ragged path, in
        pieces whose logits stay within extend_logits_bytes (ragged_pieces; they follow the rows).
        A piece's logits are freed before the next piece's are made."""
        picked = [self._piece_topk(q_fp8, w, keys, batch, piece, context, topk)
                  for piece in ragged_pieces(batch.extend_lens_cpu, batch.seq_lens_cpu, self.extend_logits_bytes // 4)]
        return picked[0] if len(picked) == 1 else torch.cat(picked)

    @staticmethod
    def _piece_topk(q_fp8, w, keys, batch: ForwardBatch, piece: RaggedPiece, context, topk: int) -> torch.Tensor:
        import dsa_kernels

        rows = piece.rows
        logits, starts = KernelDsaBackend._ragged_logits(q_fp8[rows], w[rows], keys, batch, piece)
        # The ragged transform with zero offsets leaves positions within the request. It reads each
        # row's [start, start + context) only, so the logits skip their -inf fill there.
        # a row ranks its own request's keys, the piece's logits hold every request's side by side
        return dsa_kernels.topk_transform(logits, context[rows], topk, "ragged", row_starts=starts,
                                          offsets=torch.zeros_like(starts), max_length=max(piece.key_lens))

    @staticmethod
    def _ragged_logits(q_fp8, w, keys, batch: ForwardBatch, piece: RaggedPiece) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the piece's requests' keys [0, piece.key_lens[i]) into one buffer; query t sees
        its request's range up to its own position. -> (logits [rows, sum key_lens], row starts
        [rows] int32)."""
        import dsa_kernels

        # Key counts on the device without a copy from the host (which would wait for the GPU):
        # requests of a run see their seq_len, a slice of one request what its last row sees.
        if piece.requests.stop - piece.requests.start > 1:
            key_lens = batch.seq_lens[piece.requests].long()
        else:
            key_lens = batch.positions[piece.rows.stop - 1 : piece.rows.stop].long() + 1
        slots, base = request_key_slots(batch, piece.requests, key_lens, sum(piece.key_lens))
        k_fp8, k_scale = ref.gather_index_keys_ref(keys, slots, batch.page_size)
        start = base[request_of_token(batch)[piece.rows] - piece.requests.start]
        end = start + batch.positions[piece.rows].long() + 1
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
        heads = q.shape[1]
        q = heads_padded(q)
        if batch.mode is ForwardMode.EXTEND and pool.fp8 and gathers_fp8_rows(batch, q, topk_positions.shape[1]):
            rows, first_row = request_key_slots(batch, slice(None), batch.seq_lens.long(), sum(batch.seq_lens_cpu))
            kv = dsa_kernels.gather_kv_rows(kv, rows.int())
            indices = ref.ragged_transform_ref(topk_positions, first_row[request_of_token(batch)])
            out, _ = dsa_kernels.sparse_mla_prefill(q, kv, indices, softmax_scale)
        else:  # a bf16 pool is a plain [S, 576] KV buffer for the sparse prefill kernel
            prefill = batch.mode is ForwardMode.EXTEND and not pool.fp8
            kernel = dsa_kernels.sparse_mla_prefill if prefill else dsa_kernels.sparse_mla_decode
            out, _ = kernel(q, kv, positions_to_slots(batch, topk_positions).contiguous(), softmax_scale)
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
