"""PyTorch references for every DSA kernel: the CPU path of the dispatch layer and the test oracle.

Conventions shared with the Triton kernels (see kernels/dispatch.py for the public entry points):
- Indexer score of key t for query token i:
      score[i, t] = k_scale[t] * sum_h w[i, h] * relu(q[i, h] . k_fp8[t])
  q and k_fp8 are the e4m3 values (exact products, fp32 sums). The caller folds q's own per-token
  scale, softmax_scale and heads^-0.5 into w, as DeepGEMM's fp8 MQA logits expect.
- Positions a kernel cannot see (past a token's context, outside [k_start, k_end)) are -inf.
- Top-k returns positions (0-based within the row's range) in ascending order, -1 padded; ties
  go to the lower position. Rows no longer than k return every position (dense attention).
- Slot ids: slot = page * page_size + offset; -1 is an invalid entry everywhere.
The byte layouts come from dsa_backend.cache.layout and are not redefined here.
"""

from __future__ import annotations

import math

import torch

from dsa_backend.cache.layout import (
    INDEX_FP8_BYTES,
    INDEX_HEAD_DIM,
    KV_LORA_RANK,
    MLA_FP8_BYTES,
    ROPE_DIM,
    pack_mla_fp8,
    quantize_fp8_rows,
    quantize_index_keys,
    unpack_mla_fp8,
)

FP8 = torch.float8_e4m3fn
# Query tokens per step of the references' loops: bounds the [tokens, heads, keys] intermediates.
_TOKEN_CHUNK = 256


def hadamard_matrix(n: int = INDEX_HEAD_DIM, device=None) -> torch.Tensor:
    """Sylvester Hadamard matrix [n, n] float32 scaled by n^-0.5 (fast_hadamard_transform's order)."""
    if n & (n - 1):
        raise ValueError(f"hadamard size must be a power of two, got {n}")
    i = torch.arange(n, device=device)
    bits = torch.bitwise_and(i[:, None], i[None, :])
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits = bits >> 1
    return (1 - 2 * parity).float() * n**-0.5


def rotate_hadamard(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x @ H in float32 (the rotation applied before FP8 quantization)."""
    return x.float() @ hadamard_matrix(x.shape[-1], x.device)


# ---------------------------------------------------------------- cache stores (in place)


def store_index_keys_ref(
    pool: torch.Tensor, keys: torch.Tensor, slots: torch.Tensor, page_size: int, rotate: bool = False
) -> None:
    """Quantize keys [T, 128] and write them into pool [num_pages, page_size*132] uint8.

    Page layout: page_size*128 e4m3 values, then page_size float32 scales. Slots < 0 are skipped.
    """
    keep = slots >= 0
    keys, slots = keys[keep], slots[keep].long()
    if rotate:
        keys = rotate_hadamard(keys)
    values, scale = quantize_index_keys(keys)
    page, off = slots // page_size, slots % page_size
    cols = off[:, None] * INDEX_HEAD_DIM + torch.arange(INDEX_HEAD_DIM, device=pool.device)
    pool[page[:, None], cols] = values.view(torch.uint8)
    scale_cols = page_size * INDEX_HEAD_DIM + off[:, None] * 4 + torch.arange(4, device=pool.device)
    pool[page[:, None], scale_cols] = scale.contiguous().view(torch.uint8).view(-1, 4)


def store_mla_ref(pool: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor, slots: torch.Tensor) -> None:
    """Write latent [T, 512] + rope [T, 64] at pool[slot]: bf16 [S, 576] or FP8 uint8 [S, 656]."""
    keep = slots >= 0
    latent, rope, slots = latent[keep], rope[keep], slots[keep].long()
    if pool.dtype == torch.uint8:
        pool[slots] = pack_mla_fp8(latent, rope)
    else:
        pool[slots] = torch.cat([latent, rope], dim=-1).to(pool.dtype)


def pool_parts(index_pool: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 pool's keys [pages, page_size, 128] e4m3 and scales [pages, page_size] fp32, as strided
    views (a page is page_size keys of 128 B, then their scales): what the kernels read, and what
    TMA descriptors are cut from."""
    keys = index_pool[:, : page_size * INDEX_HEAD_DIM].view(FP8)
    scales = index_pool.view(torch.float32)[:, page_size * INDEX_HEAD_DIM // 4:]
    return keys.unflatten(1, (page_size, INDEX_HEAD_DIM)), scales


def gather_index_keys_ref(pool: torch.Tensor, slots: torch.Tensor, page_size: int):
    """Read back keys at slots [T] -> (values [T, 128] e4m3, scales [T] float32).

    An exact pool ([slots, D] in a float dtype, kv_cache_dtype "auto") gives its rows and unit scales.
    """
    slots = slots.long()
    if pool.dtype != torch.uint8:
        return pool[slots], torch.ones(slots.shape[0], device=pool.device)
    page, off = slots // page_size, slots % page_size
    keys, scales = pool_parts(pool, page_size)
    return keys[page, off], scales[page, off]  # an index a key, not a byte (2.1M keys: 4 GB less)


# ---------------------------------------------------------------- indexer logits


def _scores(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor) -> torch.Tensor:
    """q [N, H, D] e4m3, w [N, H], k [T, D] e4m3, k_scale [T] -> [N, T] float32."""
    dots = torch.matmul(q.float(), k.float().T).relu_()  # [N, H, T]
    return torch.matmul(w.float().unsqueeze(1), dots).squeeze(1) * k_scale.float()[None, :]


def paged_indexer_logits_ref(
    q_fp8: torch.Tensor,
    weights: torch.Tensor,
    index_pool: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    page_size: int,
    max_context_len: int,
    next_n: int = 1,
) -> torch.Tensor:
    """Logits [N, max_context_len] float32 of q [N, H, 128] e4m3 against the paged key cache.

    Token i belongs to request i // next_n (block_table row); context_lens [N] (or [N, 1]) is its
    own causal key count. index_pool is the FP8 page layout, or an exact [slots, D] pool (then q
    is float too and the key scales are 1).
    """
    lens = context_lens.reshape(-1).long().clamp(max=max_context_len)
    n = q_fp8.shape[0]
    out = torch.full((n, max_context_len), float("-inf"), device=q_fp8.device)
    # One key gather per request, shared by its next_n tokens; tokens in chunks bound [chunk, H, keys].
    for b in range(n // next_n if next_n else 0):
        first, last = b * next_n, (b + 1) * next_n
        length = int(lens[first:last].max())
        if length == 0:
            continue
        pos = torch.arange(length, device=q_fp8.device)
        slots = block_table[b, pos // page_size].long() * page_size + pos % page_size
        k, k_scale = gather_index_keys_ref(index_pool, slots, page_size)
        for s in range(first, last, _TOKEN_CHUNK):
            e = min(s + _TOKEN_CHUNK, last)
            visible = pos[None, :] < lens[s:e, None]
            out[s:e, :length] = _scores(q_fp8[s:e], weights[s:e], k, k_scale).masked_fill(~visible, float("-inf"))
    return out


def ragged_indexer_logits_ref(
    q_fp8: torch.Tensor,
    weights: torch.Tensor,
    k_fp8: torch.Tensor,
    k_scale: torch.Tensor,
    k_start: torch.Tensor,
    k_end: torch.Tensor,
) -> torch.Tensor:
    """Prefill logits [Nq, Nk] float32: query i sees keys [k_start[i], k_end[i]) of k_fp8 [Nk, 128]."""
    logits = _scores(q_fp8, weights, k_fp8, k_scale)
    pos = torch.arange(k_fp8.shape[0], device=q_fp8.device)
    inside = (pos[None, :] >= k_start[:, None]) & (pos[None, :] < k_end[:, None])
    return logits.masked_fill(~inside, float("-inf"))


# ---------------------------------------------------------------- top-k and its transforms


def topk_positions_ref(
    logits: torch.Tensor, lengths: torch.Tensor, k: int, row_starts: torch.Tensor | None = None
) -> torch.Tensor:
    """Top-k positions [N, k] int32 of logits[i, start_i : start_i + len_i], ascending, -1 padded."""
    n, width = logits.shape
    lengths = lengths.reshape(-1).long()
    starts = torch.zeros_like(lengths) if row_starts is None else row_starts.reshape(-1).long()
    span = max(int(lengths.max()) if n else 0, 1)
    j = torch.arange(span, device=logits.device)
    valid = j[None, :] < lengths[:, None]
    cols = (starts[:, None] + j[None, :]).clamp(0, max(width - 1, 0))
    vals = logits.float().gather(1, cols) if width else torch.zeros(n, span, device=logits.device)
    # -0.0 and 0.0 are one value; invalid columns sort last, behind every valid one.
    vals = torch.where(vals == 0, torch.zeros_like(vals), vals)
    order = torch.sort(torch.where(valid, vals, float("-inf")), dim=1, descending=True, stable=True)[1]
    order = torch.where(valid.gather(1, order), order, -1)
    if span < k:
        order = torch.cat([order, order.new_full((n, k - span), -1)], dim=1)
    top = order[:, :k]
    big = torch.iinfo(torch.int64).max
    top = torch.sort(torch.where(top < 0, big, top), dim=1)[0]
    return torch.where(top == big, -1, top).to(torch.int32)


def paged_transform_ref(
    positions: torch.Tensor, block_table: torch.Tensor, page_size: int, next_n: int = 1
) -> torch.Tensor:
    """Positions [N, k] -> pool slot ids via block_table [N // next_n, max_pages]; -1 stays -1."""
    req = torch.arange(positions.shape[0], device=positions.device) // next_n
    pos = positions.long().clamp_min(0)
    pages = block_table.long()[req[:, None], pos // page_size]
    slots = pages * page_size + pos % page_size
    return torch.where(positions >= 0, slots, -1).to(torch.int32)


def ragged_transform_ref(positions: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """Positions [N, k] -> indices into the ragged KV buffer: position + offsets[i]; -1 stays -1."""
    if offsets is None:
        raise RuntimeError(
            "ragged top-k transform needs per-token offsets (topk_indices_offset) but got None; "
            "decode-like modes must use the paged transform"
        )
    shifted = positions.long() + offsets.reshape(-1, 1).long()
    return torch.where(positions >= 0, shifted, -1).to(torch.int32)


# ---------------------------------------------------------------- sparse MLA


def dequantize_mla_rows(kv_pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """kv_pool rows [...] -> [..., 576] float32, from a bf16 [S, 576] or FP8 uint8 [S, 656] pool
    (an exact pool of another width gives rows of its own width)."""
    flat = rows.reshape(-1).long()
    if kv_pool.dtype == torch.uint8:
        if kv_pool.shape[-1] != MLA_FP8_BYTES:
            raise ValueError(f"FP8 MLA pool rows must be {MLA_FP8_BYTES} bytes, got {kv_pool.shape[-1]}")
        kv = unpack_mla_fp8(kv_pool[flat])
    else:
        kv = kv_pool[flat].float()
    return kv.view(*rows.shape, kv.shape[-1])


def sparse_mla_ref(
    q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor, sm_scale: float, chunk: int = 64,
    v_dim: int = KV_LORA_RANK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [N, H, 576] over kv_pool rows indices [N, topk] (-1 = skip), in float32.

    Returns out [N, H, 512] float32 and lse [N, H] float32 (natural log; -inf for a row with no
    valid index, whose output is 0). V is the first v_dim (512) dims of each latent row.
    """
    n, h, _ = q.shape
    out = torch.zeros(n, h, v_dim, device=q.device)
    lse = torch.full((n, h), float("-inf"), device=q.device)
    num_slots = kv_pool.shape[0]
    for s in range(0, n, chunk):
        idx = indices[s : s + chunk].long()
        valid = (idx >= 0) & (idx < num_slots)
        kv = dequantize_mla_rows(kv_pool, idx.clamp(0, num_slots - 1))
        scores = torch.einsum("nhd,ntd->nht", q[s : s + chunk].float(), kv) * sm_scale
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
        out[s : s + chunk] = torch.einsum("nht,ntd->nhd", probs, kv[..., :v_dim])
        lse[s : s + chunk] = row_lse
    return out, lse


def default_sm_scale(d_qk: int = KV_LORA_RANK + ROPE_DIM) -> float:
    """1/sqrt(d_qk); DeepSeek-V3.2 multiplies in its YaRN mscale^2, which the caller owns."""
    return 1.0 / math.sqrt(d_qk)


__all__ = [
    "INDEX_FP8_BYTES",
    "hadamard_matrix",
    "rotate_hadamard",
    "store_index_keys_ref",
    "store_mla_ref",
    "gather_index_keys_ref",
    "pool_parts",
    "paged_indexer_logits_ref",
    "ragged_indexer_logits_ref",
    "topk_positions_ref",
    "paged_transform_ref",
    "ragged_transform_ref",
    "dequantize_mla_rows",
    "sparse_mla_ref",
    "default_sm_scale",
]


# ---------------------------------------------------------------- block-scaled FP8 GEMMs

FP8_BLOCK = 128  # the checkpoints' quantization block (weights 128 x 128, activations 1 x 128)


def quantize_act_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scales [M, ceil(K/128)]): 1 x 128 groups along K, the
    last one zero-padded (padding changes no group's amax)."""
    m, k = x.shape
    padded = torch.nn.functional.pad(x.float(), (0, -k % FP8_BLOCK))
    values, scale = quantize_fp8_rows(padded, FP8_BLOCK)
    return values[:, :k].contiguous(), scale


def silu_mul_quantize_ref(h: torch.Tensor, row_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h [M, 2I] (gate then up) -> quantize_act_ref of silu(gate) * up (times row_weight [M]), in h's dtype."""
    gate, up = h.chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate) * up
    if row_weight is not None:
        act = (act * row_weight[:, None]).to(h.dtype)
    return quantize_act_ref(act)


def dequantize_weight_ref(w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """w [..., N, K] e4m3 with w_scale [..., N/128 or N, K/128] (blocks, or per-row scales) -> float32."""
    n, k = w.shape[-2:]
    rows = 1 if w_scale.shape[-2] == n and n > 1 else FP8_BLOCK
    scale = w_scale.float().repeat_interleave(rows, -2)[..., :n, :].repeat_interleave(FP8_BLOCK, -1)[..., :k]
    return w.float() * scale


def fp8_linear_ref(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The block-scaled GEMM on dequantized operands, float32 [M, N] (kernels/fp8_gemm.py)."""
    a_full = a.float() * a_scale.repeat_interleave(FP8_BLOCK, -1)[:, : a.shape[1]]
    return a_full @ dequantize_weight_ref(w, w_scale).T


def fp8_grouped_linear_ref(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                           ends: torch.Tensor, align: int = 1) -> torch.Tensor:
    """Rows of a in runs by group against w[g], float32 [R, N]: group g's rows end at ends[g] and
    start at the previous end rounded up to a multiple of align; rows in no run are zeros."""
    out = torch.zeros(a.shape[0], w.shape[1], dtype=torch.float32, device=a.device)
    previous = 0
    for g, end in enumerate(ends.tolist()):
        start = -(-previous // align) * align
        if end > start:
            out[start:end] = fp8_linear_ref(a[start:end], a_scale[start:end], w[g], w_scale[g])
        previous = end
    return out


# ---------------------------------------------------------------- the layers' RMSNorm and RoPE


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalized in float32 and scaled in x's dtype, as the releases' modeling code does."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
             rotary_dim: int | None = None) -> torch.Tensor:
    """Rotate the first rotary_dim dims (all by default) of x [T, ..., D] by position; the rest
    are kept. cos / sin: [T, rotary_dim / 2].

    Pairs are (x0, x1), (x2, x3), ... when interleaved, else (x_i, x_{i+R/2}) (half-split). The
    interleaved output is de-interleaved (rotated evens, then rotated odds), as in the releases; q
    and k get the same permutation, so their dot products are unchanged.
    """
    r = rotary_dim or x.shape[-1]
    rot = x[..., :r]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot.chunk(2, dim=-1)
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    c, s = cos.view(shape).to(x.dtype), sin.view(shape).to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., r:]], dim=-1)



# ---------------------------------------------------------------- the MoE router


def route_ref(logits: torch.Tensor, bias: torch.Tensor, n_group: int, topk_group: int, top_k: int,
              renormalize: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's sigmoid router past its GEMM: logits [T, E] float32 -> (weights [T, top_k]
    float32, expert ids [T, top_k] int64), the k in no particular order.

    The bias steers which experts are chosen, not how much they weigh: experts come from the
    topk_group groups with the largest sums of their two best biased scores, then the top_k
    biased scores among them; their weights are the unbiased scores, renormalized to sum to 1
    if asked, times `scaling`."""
    scores = logits.sigmoid()
    choice = scores + bias
    tokens, experts = logits.shape
    group_scores = choice.view(tokens, n_group, -1).topk(2, dim=-1)[0].sum(-1)
    groups = group_scores.topk(topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, groups, 1)
    expert_mask = group_mask.unsqueeze(-1).expand(-1, n_group, experts // n_group).reshape(tokens, experts)
    choice = choice.masked_fill(~expert_mask.bool(), float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def sum_pairs_ref(y: torch.Tensor, row_of_pair: torch.Tensor, k: int) -> torch.Tensor:
    """Each token's k pair outputs (pair t * k + s at row row_of_pair[t * k + s] of y) summed in
    float32, in y's dtype: the routed experts' outputs back by token."""
    return y[row_of_pair].view(-1, k, y.shape[1]).sum(1, dtype=torch.float32).to(y.dtype)


def expert_runs_ref(expert_of_pair: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, expert) pairs [P] (the expert ids of ids [T, k] flattened) -> (order [P] int64: the
    pairs sorted by expert, stably, so that each expert's pairs are one run; ends [E] int32: where
    each expert's run ends, an expert no pair chose having an empty one)."""
    sorted_experts, order = expert_of_pair.sort(stable=True)
    experts = torch.arange(num_experts, device=expert_of_pair.device)
    return order, torch.searchsorted(sorted_experts, experts, right=True).to(torch.int32)
