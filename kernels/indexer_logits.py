"""Lightning-indexer logits in Triton: paged (decode / verify / draft-extend) and ragged (prefill).

score[i, t] = k_scale[t] * sum_h w[i, h] * relu(q[i, h] . k[t])  (convention: kernels/reference.py)

The paged kernel walks each request's pages once for all of its next_n query tokens: one
program holds the request's [next_n * 64, 128] e4m3 queries and multiplies them with every key
tile it loads, so next_n = 2 or 4 adds matrix work, not key-cache traffic (the pass SGLang had to
revert did this through DeepGEMM; here each token keeps its own causal length). Key tiles come
either as two TMA bulk copies (a tile inside one page: the memory-bound next_n = 1 case) or as
loads gathered through the block table key by key (paged_config says which; docs/PERFORMANCE.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host-side TMA descriptors: every key tile is gathered
    TensorDescriptor = None
try:
    from . import indexer_gluon
    from .gluon_compat import compiles, with_fallback
except (ImportError, AttributeError):  # a Triton without Gluon's Hopper API: paged logits stay on the Triton kernel
    indexer_gluon = None
_GLUON = "the Gluon paged indexer kernel"

from dsa_backend.cache.layout import INDEX_FP8_BYTES, INDEX_HEAD_DIM

from .device import capability, num_sms
from .host_math import cdiv, next_power_of_2
from .reference import pool_parts
from .specialization import logits_rows


@triton.jit
def _scores_tile(q, w, k, k_scale, ROWS_Q: tl.constexpr, H: tl.constexpr, BLOCK_K: tl.constexpr):
    """k [BLOCK_K, D] e4m3, q [ROWS_Q*H, D] e4m3, w [ROWS_Q*H], k_scale [BLOCK_K] -> [BLOCK_K, ROWS_Q].

    Keys are the matrix M dimension and (token, head) the N dimension, so the sum over heads
    runs along N, inside a thread's accumulator registers, instead of across warps.
    """
    s = tl.dot(k, tl.trans(q))
    s = tl.maximum(s, 0.0) * w[None, :]
    s = tl.sum(tl.reshape(s, (BLOCK_K, ROWS_Q, H)), axis=2)
    return s * k_scale[:, None]


@triton.jit
def _key_tile(keys, scales, bt_row, first, req_len, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_K: tl.constexpr,
              TMA: tl.constexpr):
    """Keys [BLOCK_K, D] e4m3 from position `first` on, and their scales; past req_len: zeros or
    stale values, which the caller masks."""
    if TMA:  # the tile lies inside one page: one lookup, two bulk copies
        page = tl.load(bt_row + first // PAGE, mask=first < req_len, other=0)
        k = keys.load([page, first % PAGE, 0]).reshape(BLOCK_K, D)
        k_scale = scales.load([page, first % PAGE]).reshape(BLOCK_K)
    else:  # one block-table lookup per key
        pos = first + tl.arange(0, BLOCK_K)
        live = pos < req_len
        page = tl.load(bt_row + pos // PAGE, mask=live, other=0).to(tl.int64)
        base = page * (PAGE * (D + 4))
        off = pos % PAGE
        k = tl.load(keys + (base + off * D)[:, None] + tl.arange(0, D)[None, :], mask=live[:, None], other=0.0)
        k_scale = tl.load(scales + (base + PAGE * D) // 4 + off, mask=live, other=0.0)
    return k, k_scale


@triton.jit(do_not_specialize=["stride_bt"])  # kernels/specialization.py
def _paged_logits_kernel(
    q_ptr, w_ptr, keys, scales, bt_ptr, stride_bt, lens_ptr, out_ptr, stride_out, max_len,
    NEXT_N: tl.constexpr, NP: tl.constexpr, H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_K: tl.constexpr, KEYS_PER_PROG: tl.constexpr, CLEAN: tl.constexpr, TMA: tl.constexpr,
):
    # NP = next_n rounded up to a power of two (Triton tile sizes); padded tokens are masked off
    req = tl.program_id(0)
    start = tl.program_id(1) * KEYS_PER_PROG
    j = tl.arange(0, NP)
    tok_ok = j < NEXT_N
    tok = req * NEXT_N + j
    lens = tl.load(lens_ptr + tok, mask=tok_ok, other=0)
    req_len = tl.max(lens, axis=0)
    out_rows = out_ptr + tok[:, None].to(tl.int64) * stride_out
    if start < req_len:
        r = tl.arange(0, NP * H)
        rows = req.to(tl.int64) * NEXT_N * H + r
        row_ok = r < NEXT_N * H
        d = tl.arange(0, D)
        q = tl.load(q_ptr + rows[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptr + rows, mask=row_ok, other=0.0)
        bt_row = bt_ptr + req.to(tl.int64) * stride_bt
        for k0 in range(0, KEYS_PER_PROG, BLOCK_K):
            pos = start + k0 + tl.arange(0, BLOCK_K)
            k, k_scale = _key_tile(keys, scales, bt_row, start + k0, req_len, D, PAGE, BLOCK_K, TMA)
            s = tl.trans(_scores_tile(q, w, k, k_scale, NP, H, BLOCK_K))
            s = tl.where(pos[None, :] < lens[:, None], s, float("-inf"))
            if CLEAN:
                tl.store(out_rows + pos[None, :], s, mask=tok_ok[:, None] & (pos[None, :] < max_len))
            else:
                # a length past max_len (a caller's error) must not write past the row
                written = tl.minimum(req_len, max_len)
                tl.store(out_rows + pos[None, :], s, mask=tok_ok[:, None] & (pos[None, :] < written))
    elif CLEAN:
        for k0 in range(0, KEYS_PER_PROG, BLOCK_K):
            pos = start + k0 + tl.arange(0, BLOCK_K)
            ninf = tl.full((NP, BLOCK_K), float("-inf"), tl.float32)
            tl.store(out_rows + pos[None, :], ninf, mask=tok_ok[:, None] & (pos[None, :] < max_len))


@triton.jit
def _fill_past_lengths_kernel(out_ptr, stride_out, lens_ptr, width, BLOCK: tl.constexpr):
    """-inf in one row's columns from its length on, BLOCK of them a program."""
    row = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    length = tl.load(lens_ptr + row)
    tl.store(out_ptr + row.to(tl.int64) * stride_out + pos, tl.full((BLOCK,), float("-inf"), tl.float32),
             mask=(pos >= length) & (pos < width))


def fill_past_lengths(out: torch.Tensor, lengths: torch.Tensor) -> None:
    """-inf into out [N, W] fp32 (rows may be strided) from each row's length on: clean_logits for
    a kernel that leaves those columns unwritten. Writes only the rows' tails (H100: DeepGEMM's
    paged logits clean in one launch instead of three torch passes over the whole matrix)."""
    n, width = out.shape
    if n and width:
        block = 4096
        _fill_past_lengths_kernel[(n, cdiv(width, block))](
            out, out.stride(0), lengths.reshape(-1).to(torch.int32).contiguous(), width, BLOCK=block)


def _check_q(q_fp8: torch.Tensor, weights: torch.Tensor) -> None:
    if q_fp8.dtype != torch.float8_e4m3fn or q_fp8.dim() != 3 or q_fp8.shape[-1] != INDEX_HEAD_DIM:
        raise ValueError(f"q_fp8 must be float8_e4m3fn [tokens, heads, {INDEX_HEAD_DIM}], got "
                         f"{q_fp8.dtype} {tuple(q_fp8.shape)}")
    if weights.shape != q_fp8.shape[:2] or weights.dtype != torch.float32:
        raise ValueError(f"weights must be float32 {tuple(q_fp8.shape[:2])}, got {weights.dtype} {tuple(weights.shape)}")


def paged_config(batch: int, max_context_len: int, next_n: int, num_sms: int = 132, page_size: int = 64,
                 tma: bool = True) -> dict:
    """Tile shape for the paged kernel: 64-key tiles, in key chunks that give every SM work.

    From the H200 sweeps in docs/PERFORMANCE.md (CUDA-graph times, 2026-11-22): next_n 1 is
    memory-bound and loads its tiles by TMA when pages hold whole tiles (6-7% faster than gathered
    loads at batch 32 / 128, 32K keys; gathered, 512-key chunks were best); next_n 2 and 4 gather
    (TMA was 15-25% slower there) in 2048-key chunks, with two stages and 4 warps at next_n 2,
    three stages and 8 warps at next_n 4. Chunks shrink until there are 4 programs per SM at
    next_n 1, 2 above it; 128-key tiles were 10-25% slower. tma=False: a GPU without TMA (before
    Hopper) gathers at next_n 1 too."""
    tma = tma and TensorDescriptor is not None and next_n == 1 and page_size % 64 == 0
    keys_per_prog = 512 if next_n == 1 and not tma else 2048
    programs = (4 if next_n == 1 else 2) * num_sms
    while keys_per_prog > 128 and batch * cdiv(max_context_len, keys_per_prog) < programs:
        keys_per_prog //= 2
    wide = next_n > 2
    return dict(BLOCK_K=64, KEYS_PER_PROG=keys_per_prog, num_warps=8 if wide else 4, num_stages=3 if wide else 2,
                TMA=tma)


def _key_sources(index_pool: torch.Tensor, page_size: int, block_k: int, tma: bool) -> tuple:
    """What _key_tile reads: TMA descriptors of the pool's key and scale parts, or typed views."""
    if not tma:
        return index_pool.view(torch.float8_e4m3fn), index_pool.view(torch.float32)
    keys, scales = pool_parts(index_pool, page_size)
    return (TensorDescriptor.from_tensor(keys, block_shape=[1, block_k, INDEX_HEAD_DIM]),
            TensorDescriptor.from_tensor(scales, block_shape=[1, block_k]))


def _has_tma(device: torch.device) -> bool:
    """TMA copies exist from Hopper (sm_90) on; the interpreter (CPU) emulates them."""
    return device.type != "cuda" or capability(device) >= (9, 0)


def gluon_paged_runs(device: torch.device, page_size: int = 64) -> bool:
    """Whether paged logits can take kernels/indexer_gluon.py's kernel here."""
    return (indexer_gluon is not None and compiles(_GLUON) and page_size % indexer_gluon.BLOCK_K == 0
            and indexer_gluon.runs_on(device))


def gluon_paged_config(device: torch.device, batch: int, max_context_len: int, next_n: int,
                       page_size: int, heads: int = 64) -> dict | None:
    """The Gluon kernel's config where the default path takes it (Hopper, pages of whole 64-key
    tiles), else None."""
    if not gluon_paged_runs(device, page_size):
        return None
    return indexer_gluon.gluon_config(batch, max_context_len, next_n, num_sms(device), heads)


def paged_indexer_logits(
    q_fp8: torch.Tensor, weights: torch.Tensor, index_pool: torch.Tensor, block_table: torch.Tensor,
    context_lens: torch.Tensor, page_size: int, max_context_len: int, next_n: int = 1,
    clean_logits: bool = True, config: dict | None = None,
) -> torch.Tensor:
    """q [N, H, 128] e4m3, weights [N, H] fp32 -> logits [N, max_context_len] fp32 (-inf masked).

    block_table [N // next_n, max_pages] int32 (a per-token [N, ...] table is strided down);
    context_lens [N] or [N, 1] int32, each token's own causal length. clean_logits=False leaves
    columns past the request's longest token unwritten (top-k never reads them). Without an
    explicit config, Hopper runs kernels/indexer_gluon.py's kernel, in key chunks sized to the
    grid; the output is the same bit for bit.
    """
    _check_q(q_fp8, weights)
    n, heads, _ = q_fp8.shape
    if n % next_n:
        raise ValueError(f"tokens ({n}) must be a multiple of next_n ({next_n})")
    batch = n // next_n
    if block_table.shape[0] == n and next_n > 1:
        block_table = block_table[::next_n]
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table has {block_table.shape[0]} rows, expected {batch} (or {n})")
    lens = context_lens.reshape(-1)
    if lens.numel() != n:
        raise ValueError(f"context_lens must hold one length per query token ({n}), got {tuple(context_lens.shape)}")
    if index_pool.shape[-1] != page_size * INDEX_FP8_BYTES or not index_pool.is_contiguous():
        raise ValueError(f"index_pool must be contiguous uint8 [pages, {page_size * INDEX_FP8_BYTES}]")
    if n == 0 or max_context_len == 0:
        return logits_rows(n, max_context_len, q_fp8.device)

    def triton_config():  # TMA key tiles where the GPU has TMA
        return paged_config(batch, max_context_len, next_n, page_size=page_size, tma=_has_tma(q_fp8.device))

    gluon_cfg = None if config else gluon_paged_config(q_fp8.device, batch, max_context_len, next_n, page_size, heads)
    if gluon_cfg is not None:
        return with_fallback(
            _GLUON,
            lambda: indexer_gluon.paged_indexer_logits(q_fp8.contiguous(), weights.contiguous(),
                                                       *pool_parts(index_pool, page_size), block_table,
                                                       lens.to(torch.int32), max_context_len, next_n, clean_logits,
                                                       gluon_cfg),
            lambda: paged_indexer_logits(q_fp8, weights, index_pool, block_table, context_lens, page_size,
                                         max_context_len, next_n, clean_logits, config=triton_config()))
    out = logits_rows(n, max_context_len, q_fp8.device)
    cfg = dict(config or triton_config())
    cfg.setdefault("TMA", False)
    if cfg["TMA"] and TensorDescriptor is None:
        raise ValueError("TMA key tiles need triton.tools.tensor_descriptor, which this Triton lacks")
    if cfg["TMA"] and page_size % cfg["BLOCK_K"]:
        raise ValueError(f"TMA key tiles must lie inside a page: BLOCK_K {cfg['BLOCK_K']}, page_size {page_size}")
    grid = (batch, cdiv(max_context_len, cfg["KEYS_PER_PROG"]))
    _paged_logits_kernel[grid](
        q_fp8.contiguous(), weights.contiguous(), *_key_sources(index_pool, page_size, cfg["BLOCK_K"], cfg["TMA"]),
        block_table, block_table.stride(0), lens.to(torch.int32),
        out, out.stride(0), max_context_len,
        NEXT_N=next_n, NP=next_power_of_2(next_n), H=heads, D=INDEX_HEAD_DIM, PAGE=page_size, CLEAN=clean_logits, **cfg,
    )
    return out


@triton.jit(do_not_specialize=["num_q"])  # kernels/specialization.py
def _ragged_logits_kernel(
    q_ptr, w_ptr, k_ptr, kscale_ptr, ks_ptr, ke_ptr, out_ptr, stride_out, num_q, num_k,
    BLOCK_Q: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
    BLOCK_K: tl.constexpr, KEYS_PER_PROG: tl.constexpr, CLEAN: tl.constexpr,
):
    tok = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    start = tl.program_id(1) * KEYS_PER_PROG
    tok_ok = tok < num_q
    ks = tl.load(ks_ptr + tok, mask=tok_ok, other=2147483647)
    ke = tl.load(ke_ptr + tok, mask=tok_ok, other=0)
    lo = tl.min(ks, axis=0)
    hi = tl.max(ke, axis=0)
    out_rows = out_ptr + tok[:, None].to(tl.int64) * stride_out
    if (start < hi) & (start + KEYS_PER_PROG > lo):
        # Unclean, only the tiles some query of the block sees: in a batch of short requests that
        # is a few tiles of the chunk (H100, 16 requests of 1024 tokens: 2.5x faster). Clean, the
        # whole chunk in the same pass: its tiles no query sees cost less computed than filled by a
        # loop of their own or a second launch (both up to 1.5x slower, docs/PERFORMANCE.md).
        first = start if CLEAN else tl.maximum(start, lo // BLOCK_K * BLOCK_K)
        last = start + KEYS_PER_PROG if CLEAN else tl.minimum(start + KEYS_PER_PROG, hi)
        rows = tl.program_id(0).to(tl.int64) * BLOCK_Q * H + tl.arange(0, BLOCK_Q * H)
        row_ok = rows < num_q * H
        d = tl.arange(0, D)
        q = tl.load(q_ptr + rows[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptr + rows, mask=row_ok, other=0.0)
        for k0 in range(first, last, BLOCK_K):
            pos = k0 + tl.arange(0, BLOCK_K)
            live = (pos >= lo) & (pos < hi)
            k = tl.load(k_ptr + pos[:, None].to(tl.int64) * D + d[None, :], mask=live[:, None], other=0.0)
            k_scale = tl.load(kscale_ptr + pos, mask=live, other=0.0)
            s = tl.trans(_scores_tile(q, w, k, k_scale, BLOCK_Q, H, BLOCK_K))
            inside = (pos[None, :] >= ks[:, None]) & (pos[None, :] < ke[:, None])
            s = tl.where(inside, s, float("-inf"))
            tl.store(out_rows + pos[None, :], s, mask=tok_ok[:, None] & (pos[None, :] < num_k))
    elif CLEAN:
        for k0 in range(0, KEYS_PER_PROG, BLOCK_K):
            pos = start + k0 + tl.arange(0, BLOCK_K)
            ninf = tl.full((BLOCK_Q, BLOCK_K), float("-inf"), tl.float32)
            tl.store(out_rows + pos[None, :], ninf, mask=tok_ok[:, None] & (pos[None, :] < num_k))


def ragged_indexer_logits(
    q_fp8: torch.Tensor, weights: torch.Tensor, k_fp8: torch.Tensor, k_scale: torch.Tensor,
    k_start: torch.Tensor, k_end: torch.Tensor, clean_logits: bool = True, config: dict | None = None,
) -> torch.Tensor:
    """Prefill logits [Nq, Nk] fp32; query i sees keys [k_start[i], k_end[i]) of k_fp8 [Nk, 128].

    Same contract as DeepGEMM's fp8_mqa_logits; clean_logits=False leaves key tiles that no query
    of a program's BLOCK_Q-token block can see unwritten.
    """
    _check_q(q_fp8, weights)
    num_q, heads, _ = q_fp8.shape
    num_k = k_fp8.shape[0]
    if k_start is None or k_end is None:
        raise RuntimeError("ragged indexer logits need per-token key ranges k_start/k_end; got None")
    if k_fp8.shape != (num_k, INDEX_HEAD_DIM) or k_scale.shape != (num_k,):
        raise ValueError(f"k_fp8 must be [Nk, {INDEX_HEAD_DIM}] and k_scale [Nk]")
    out = logits_rows(num_q, num_k, q_fp8.device)
    if num_q == 0 or num_k == 0:
        return out
    # from the H200 sweeps in docs/PERFORMANCE.md (4096 causal queries over 32K keys, CUDA graphs):
    # four queries (a 256-wide MMA) per program and 2048-key chunks, 1.31x faster than two and 512
    cfg = dict(config or dict(BLOCK_Q=4, BLOCK_K=64, KEYS_PER_PROG=2048, num_warps=8, num_stages=3))
    grid = (cdiv(num_q, cfg["BLOCK_Q"]), cdiv(num_k, cfg["KEYS_PER_PROG"]))
    _ragged_logits_kernel[grid](
        q_fp8.contiguous(), weights.contiguous(), k_fp8.contiguous(), k_scale.float().contiguous(),
        k_start.to(torch.int32), k_end.to(torch.int32), out, out.stride(0), num_q, num_k,
        H=heads, D=INDEX_HEAD_DIM, CLEAN=clean_logits, **cfg,
    )
    return out
