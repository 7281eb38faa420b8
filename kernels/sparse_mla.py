"""Sparse MLA attention in Triton: absorbed q [N, H, 576] over the top-k rows of the latent cache.

One kernel serves decode (paged pool, bf16 [S, 576] or FP8 [S, 656]) and prefill (a bf16
[Nk, 576] buffer is just a pool): rows are gathered by index, -1 (or >= S) is skipped. Each key
tile is one [keys, 512] latent block plus its 64 rope dims: QK is one 512-deep product plus the
rope product, split between the two warpgroups by keys; PV is one [heads, keys] x [keys, 512]
product into a [heads, 512] accumulator that they split by columns. An FP8 row is dequantized to
bf16 with its four tile scales on load, as FlashMLA does, but in float32 (FlashMLA rounds the scale
to bf16 first). The earlier form kept four 128-wide tiles and scaled scores and probabilities
instead: exact in float32, but it spilled and ran at 0.30x FlashMLA at batch 128 against 0.58x for
this one (docs/PERFORMANCE.md). When N * H / BLOCK_H programs cannot fill the GPU, the top-k
range is split across programs and a second small kernel merges the partial results by their
log-sum-exp (split-K, as FlashMLA does: one extra launch); on Hopper two or four splits of the
Gluon kernel meet and merge in the kernel instead (kernels/sparse_mla_gluon.py).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsa_backend.cache.layout import KV_LORA_RANK, MLA_FP8_BYTES, ROPE_DIM

from . import batch_invariant
from .cache_store import _to_bf16
from .device import num_sms
from .host_math import cdiv, next_power_of_2
from .triton_dot import INTERPRET, dot

try:
    from . import sparse_mla_gluon
    from .gluon_compat import compiles, with_fallback
except (ImportError, AttributeError):  # a Triton without Gluon's Hopper API: the Triton kernel serves
    sparse_mla_gluon = None
_GLUON = "the Gluon sparse MLA kernel"
# Under batch-invariant mode every row splits top-k into pieces of this many keys, whatever the
# batch: 4 splits of 2048 cost 1.0-2.4x the default split on an H100 (docs/PERFORMANCE.md,
# "Sparse MLA under batch-invariant mode").
INVARIANT_KEYS_PER_SPLIT = 512
PARTIAL_BYTES = 256 << 20  # at most this much of fp32 partial results in flight (sparse_mla)

_LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)  # lse leaves in natural log


@triton.jit
def _latent_rows_scaled(kv_ptr, kv_f32_ptr, row, ok, FP8: tl.constexpr):
    """The gathered rows' 512 latent dims: FP8 ones times their tile scales in float32, bf16 ones
    as they are. FP8 bytes: 512 e4m3 | 4 fp32 tile scales | 64 bf16 rope."""
    k = tl.load(kv_ptr + row[:, None] + tl.arange(0, 512)[None, :], mask=ok[:, None], other=0.0)
    if FP8:
        scale = tl.load(kv_f32_ptr + row[:, None] // 4 + 128 + tl.arange(0, 4)[None, :], mask=ok[:, None], other=0.0)
        rows: tl.constexpr = k.shape[0]
        k = tl.reshape(tl.reshape(k.to(tl.float32), (rows, 4, 128)) * scale[:, :, None], (rows, 512))
    return k


@triton.jit
def _latent_rows(kv_ptr, kv_f32_ptr, row, ok, FP8: tl.constexpr):
    """The gathered rows' 512 latent dims as bf16."""
    return _latent_rows_scaled(kv_ptr, kv_f32_ptr, row, ok, FP8).to(tl.bfloat16)


@triton.jit
def _rope_rows(kv_ptr, kv_bf16_ptr, row, ok, FP8: tl.constexpr):
    """The gathered rows' 64 bf16 rope dims."""
    dr = tl.arange(0, 64)
    if FP8:
        rope = tl.load(kv_bf16_ptr + row[:, None] // 2 + 264 + dr[None, :], mask=ok[:, None], other=0.0)
    else:
        rope = tl.load(kv_ptr + row[:, None] + 512 + dr[None, :], mask=ok[:, None], other=0.0)
    return rope


@triton.jit(do_not_specialize=["num_splits"])  # kernels/specialization.py
def _sparse_mla_kernel(
    q_ptr, stride_qn, stride_qh, kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, num_slots,
    idx_ptr, stride_idx, topk, out_ptr, lse_ptr, scale_log2, keys_per_split, num_splits,
    H: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr,
    PARTIAL: tl.constexpr, UPCAST: tl.constexpr,
):
    # a flat grid with the head blocks fastest: the programs that gather the same KV rows run side
    # by side, so all but the first read them from L2 (and N is not capped at 65535 as grid y/z are)
    pid = tl.program_id(0)
    h = (pid % (H // BLOCK_H)) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = pid // (H // BLOCK_H) % num_splits
    n = pid // (H // BLOCK_H) // num_splits
    d = tl.arange(0, 512)
    q_row = q_ptr + n.to(tl.int64) * stride_qn + h[:, None] * stride_qh
    q = tl.load(q_row + d[None, :])
    q_rope = tl.load(q_row + 512 + tl.arange(0, 64)[None, :])
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, 512), tl.float32)
    lo = split * keys_per_split
    for j0 in range(lo, tl.minimum(lo + keys_per_split, topk), BLOCK_N):  # a split past topk does nothing
        j = j0 + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + n.to(tl.int64) * stride_idx + j, mask=j < topk, other=-1)
        ok = (idx >= 0) & (idx < num_slots)
        row = tl.where(ok, idx, 0).to(tl.int64) * stride_kv
        k = _latent_rows(kv_ptr, kv_f32_ptr, row, ok, FP8)
        k_rope = _rope_rows(kv_ptr, kv_bf16_ptr, row, ok, FP8)
        # Triton gives a product whose result reaches another product all 8 warps along its 64 rows,
        # so both warpgroups would compute the same QK tile. The two QK products are scaled apart
        # (added raw, one would become the other's accumulator) and the softmax sits in a branch
        # that is always taken: the PV product then reads the branch's results, which the rule
        # does not trace, and QK is split across the warpgroups by keys (no spills either).
        qk = dot(q, tl.trans(k), UPCAST) * scale_log2 + dot(q_rope, tl.trans(k_rope), UPCAST) * scale_log2
        qk = tl.where(ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing valid yet
        if topk > 0:
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(qk - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            p = p.to(tl.bfloat16)
        else:
            alpha = tl.zeros_like(m_i)
            p = tl.zeros((BLOCK_H, BLOCK_N), tl.bfloat16)
        m_i = m_new
        acc = acc * alpha[:, None] + dot(p, k, UPCAST)
    has = l_i > 0
    l_safe = tl.where(has, l_i, 1.0)
    inv = tl.where(has, 1.0 / l_safe, 0.0)
    lse = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))  # base 2
    o_row = ((n * num_splits + split) * H + h).to(tl.int64)[:, None] * 512 + d[None, :]
    if PARTIAL:  # float32 partials and base-2 lse for _merge_splits_kernel
        tl.store(out_ptr + o_row, acc * inv[:, None])
        tl.store(lse_ptr + (n * num_splits + split) * H + h, lse)
    else:  # final bf16 output, rounded to nearest even on the CPU as on the GPU
        tl.store(out_ptr + o_row, _to_bf16(acc * inv[:, None]))
        tl.store(lse_ptr + n * H + h, lse * _LN2)


@triton.jit
def _merge_rows(part_ptr, part_lse_ptr, part, ok, out_ptr, lse_ptr, row):
    """Combine the float32 partial rows `part` (where ok) of one (row, head) by their log-sum-exp
    into output row `row`: the whole [pieces, 512] in one load, one trip to L2 a program."""
    cols = tl.arange(0, 512)
    lse = tl.load(part_lse_ptr + part, mask=ok, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # every piece empty: weights 0, lse -inf
    w = tl.exp2(lse - top)
    total = tl.sum(w, axis=0)
    vals = tl.load(part_ptr + part.to(tl.int64)[:, None] * 512 + cols[None, :], mask=ok[:, None], other=0.0)
    has = total > 0
    inv = tl.where(has, 1.0 / tl.where(has, total, 1.0), 0.0)
    tl.store(out_ptr + row.to(tl.int64) * 512 + cols, _to_bf16(tl.sum(vals * w[:, None], axis=0) * inv))
    tl.store(lse_ptr + row, tl.where(has, (top + tl.log2(tl.where(has, total, 1.0))) * _LN2, float("-inf")))


@triton.jit
def _merge_splits_kernel(part_ptr, part_lse_ptr, out_ptr, lse_ptr, num_splits, H: tl.constexpr, SPLITS: tl.constexpr):
    """Combine the splits of one (row, head), partials [N, num_splits, H, 512]."""
    nh = tl.program_id(0)  # n * H + h
    s = tl.arange(0, SPLITS)
    _merge_rows(part_ptr, part_lse_ptr, (nh // H * num_splits + s) * H + nh % H, s < num_splits, out_ptr, lse_ptr, nh)


@triton.jit
def _merge_balanced_kernel(part_ptr, part_lse_ptr, out_ptr, lse_ptr, tiles_per_unit, total_tiles, H: tl.constexpr,
                           PIECES: tl.constexpr, CTAS: tl.constexpr):
    """The merge of a balanced grid (kernels/sparse_mla_gluon_schedule.balanced_share, same CTAs):
    program (c, head) merges the unit that CTA c's program starts and does not finish, if any, from
    its pieces: c's run of it (partial row (c, 0) if that is c's first run, else (c, 1)), then the
    first runs, rows (c', 0), of the programs after c's that the unit reaches, in their CTA of c's
    rank. Units a program finished are out. A program is CTAS CTAs (2: a pair, each 64 heads of a
    128-head unit); unit u is row u % rows, head block u // rows (balanced_unit there)."""
    c = tl.program_id(0)
    head = tl.program_id(1)
    program, rank = c // CTAS, c % CTAS
    programs = tl.num_programs(0) // CTAS
    first = program * total_tiles // programs
    last = (program + 1) * total_tiles // programs
    u = (last - 1) // tiles_per_unit  # the unit of the program's last tile
    unit_end = (u + 1) * tiles_per_unit
    if (u * tiles_per_unit >= first) & (unit_end > last):
        pieces = (unit_end * programs + total_tiles - 1) // total_tiles - program  # the programs it reaches
        p = tl.arange(0, PIECES)
        slot = tl.where(p == 0, (u * tiles_per_unit > first).to(tl.int32), 0)
        rows = total_tiles // tiles_per_unit // (H // (64 * CTAS))
        _merge_rows(part_ptr, part_lse_ptr, (((program + p) * CTAS + rank) * 2 + slot) * 64 + head, p < pieces,
                    out_ptr, lse_ptr, u % rows * H + (u // rows * CTAS + rank) * 64 + head)


def balanced_pieces(units: int, tiles: int, programs: int) -> int:
    """The most programs one unit of a balanced grid reaches: each holds at least
    units * tiles // programs of its tiles."""
    return cdiv(tiles - 1, units * tiles // programs) + 1


def merge_warps(split: int) -> int:
    """Warps of a merge program: one per 8 splits (at least two, at most eight), so a thread holds
    at most 128 values up to 64 splits. From the H100 A/Bs in docs/PERFORMANCE.md: at batch 32 / 64
    (splits 2 and 4) whole rows on two warps merged in 4 us where 128-column programs on four warps
    took 12-24 us; at 8-32 splits (1-8 rows) whole rows merged 1.4-2.2x faster than 128-column
    programs, and no shape tried was faster by more than 0.2 us."""
    return min(8, max(2, next_power_of_2(split) // 8))


# The split's cost model, fitted to the Gluon kernel over an FP8 pool on the H100 (split counts 1-8
# at batch 20-128, docs/PERFORMANCE.md, "Split counts past one wave"): a wave of programs takes a
# 64-key tile time per tile plus about one tile of its own (Q, the first gather, the partials), and
# a split adds its partials' trip through L2, plus the merge launch where the splits do not meet
# in the kernel (kernels/sparse_mla_gluon.MERGES, one wave).
_TILE_US = 3.3
_PROGRAM_TILES = 1.1
_MERGE_LAUNCH_US = 3.0
_PARTIAL_US = 0.06  # a (row, head block, split)'s 128 KB of float32 partials, written and read


def _split_time(units: int, tiles: int, split: int, num_sms: int) -> float:
    """Modelled microseconds of `units` (row, head block) programs of `tiles` tiles split `split` ways."""
    waves = cdiv(units * split, num_sms)
    merge = 0.0 if split == 1 else _PARTIAL_US * units * split
    meets = sparse_mla_gluon is not None and split in sparse_mla_gluon.MERGES and waves == 1
    if split > 1 and not meets:
        merge += _MERGE_LAUNCH_US
    return waves * (cdiv(tiles, split) + _PROGRAM_TILES) * _TILE_US + merge


# The balanced grid's (sparse_mla_gluon.launch_balanced, a program an SM), fitted the same way to
# its FP8 calls at 33-128 rows of 128 heads (docs/PERFORMANCE.md, "A balanced grid for the batches
# between waves"): a tile costs a little more than in a unit's own program, and a call about six
# tiles more (each run's Q and partials, the merge). It is taken only where it models 5% faster:
# the split model knows neither CTA pairs nor the clock a grid that leaves SMs idle runs at, and
# without the margin the rule took it at 110 rows of 128 heads and lost 4%.
_BALANCED_TILE_US = 3.5
_BALANCED_CALL_TILES = 6.4
_BALANCED_MARGIN = 0.95


def _balanced_time(units: int, tiles: int, num_sms: int) -> float:
    """Modelled microseconds of a balanced grid over `units` programs' worth of `tiles` tiles."""
    return (units * tiles / num_sms + _BALANCED_CALL_TILES) * _BALANCED_TILE_US


def mla_config(n: int, heads: int, topk: int, num_sms: int = 132) -> dict:
    """Tile shape, top-k split count and grid for N query rows of `heads` heads.

    From the H200 runs in docs/PERFORMANCE.md: 64-head, 64-key tiles on 8 warps, one pipeline stage
    (in CUDA graphs 2-10% faster than two or three for decode; two stages do not fit shared memory
    for prefill).

    Within a wave of unsplit programs (num_sms (row, head block) units), the split, at least 64 keys
    each, is whichever _split_time models fastest among the largest power of two that keeps one
    wave (32 at batch 1, 2 at batch 32 of 128 heads; half a wave where programs would be shorter
    than SHORT_PROGRAM_TILES: 16 at batch 2) and 1 to 4 splits (3 at batch 17-22 and 34-44 of 128
    heads). BALANCED: where that split takes a second wave, a balanced grid (a program an SM, a CTA
    pair two at 128 heads over FP8: sparse_mla_gluon.launch_balanced) if it models 5% faster
    (_balanced_wins: 34-41 rows of 128 heads, 67-83 of 64).

    Past a wave, rows run unsplit, the rows of the whole waves on the split grid (CTA pairs at 128
    heads over FP8), and the rest, where it would fill at most half a wave (_tail_balanced), on a
    balanced grid after them (WAVE_ROWS, BALANCED). That is 67-99, 133-165, 199-231... rows of 128
    heads and 133-198 of 64 on 132 SMs: 1.02-1.50x the split grid and 1.02-1.12x a balanced grid
    of all rows on the H100 (docs/PERFORMANCE.md, "Whole waves, then a balanced tail").

    Under batch-invariant mode the split is set by top-k alone (INVARIANT_KEYS_PER_SPLIT), so that a
    row is merged the same way in any batch, and no grid is balanced.
    """
    block_h = 64 if heads % 64 == 0 else 16
    balanced, wave_rows = False, 0
    if batch_invariant.enabled():  # a row's merge must not follow the batch: a split set by top-k alone
        split = max(1, topk // INVARIANT_KEYS_PER_SPLIT)
    else:
        units, tiles = n * (heads // block_h), max(1, topk // 64)
        per_wave = max(1, num_sms // (heads // block_h))  # rows a wave of unsplit programs holds
        if n >= per_wave:
            split, rest = 1, n % per_wave
            balanced = _tail_balanced(rest, per_wave, heads // block_h, tiles, num_sms)
            wave_rows = n - rest if balanced else 0
        else:
            split = _fastest_split(units, tiles, num_sms)
            balanced = _balanced_wins(units, tiles, split, num_sms)
    return dict(BLOCK_H=block_h, BLOCK_N=64, SPLIT=split, BALANCED=balanced, WAVE_ROWS=wave_rows, num_warps=8,
                num_stages=1)


def _balanced_wins(units: int, tiles: int, split: int, num_sms: int) -> bool:
    """Whether a balanced grid models faster than the split grid's `split` for units that one wave
    of unsplit programs holds, where that split takes a second wave: a wave of programs, shorter or
    not, runs faster than a balanced grid's tiles (fewer SMs busy, a higher clock at the power cap;
    no run boundaries)."""
    if cdiv(units * split, num_sms) < 2:
        return False
    return _balanced_time(units, tiles, num_sms) < _BALANCED_MARGIN * _split_time(units, tiles, split, num_sms)


def _tail_balanced(rest: int, per_wave: int, blocks: int, tiles: int, num_sms: int) -> bool:
    """Whether the `rest` rows past whole waves of unsplit programs run on a balanced grid: where they
    would fill at most half a wave, and the model has a balanced grid beat a wave of programs (not
    for short top-k ranges, whose balanced grid is mostly its call). On the H100 (one, two and three
    whole waves, 128 heads over FP8 in pairs, and 64 heads) the balanced tail won 1.08-1.10x at
    exactly half a wave and 1.00-1.05x to 53%, was 0.995-1.026x at 56%, and level or lost from 59%."""
    return 0 < 2 * rest <= per_wave and _balanced_time(rest * blocks, tiles, num_sms) < _split_time(
        rest * blocks, tiles, 1, num_sms)


# Programs shorter than this many tiles fill at most half the SMs: a whole wave of one-tile
# programs took 1.09x as long as half as many of two tiles (H100, batch 2 of 128 heads, kernel and
# merge timed apart; docs/PERFORMANCE.md, "Ours where it is faster than the library"), since the
# partials, not the tiles, are then what the op moves.
SHORT_PROGRAM_TILES = 2


@functools.cache  # an eager engine asks every layer: 3 us of host time a call uncached
def _fastest_split(units: int, tiles: int, num_sms: int) -> int:
    one_wave = _largest_split(units, tiles, num_sms)
    if tiles < SHORT_PROGRAM_TILES * one_wave:
        one_wave = _largest_split(units, tiles, num_sms // 2)
    splits = {one_wave, *range(1, min(4, tiles) + 1)}
    return min(sorted(splits), key=lambda s: _split_time(units, tiles, s, num_sms))


def _largest_split(units: int, tiles: int, programs: int) -> int:
    """The largest power of two that splits `units` into at most `programs` programs of a tile or more."""
    split = 1
    while units * split * 2 <= programs and split * 2 <= tiles:
        split *= 2
    return split


def gluon_runs(q: torch.Tensor, kv_pool: torch.Tensor) -> bool:
    """Whether kernels/sparse_mla_gluon.py's kernel serves these queries: Hopper, 64-head blocks, and
    a bf16 pool's rows 16-element aligned (its cp.async copies 16 bytes at a time)."""
    return (gluon_runs_on(q.device) and q.shape[1] % sparse_mla_gluon.BLOCK_H == 0
            and (kv_pool.dtype == torch.uint8 or kv_pool.stride(0) % 16 == 0))


def gluon_runs_on(device: torch.device) -> bool:
    """Whether kernels/sparse_mla_gluon.py's kernel can run on this device with this Triton."""
    return sparse_mla_gluon is not None and compiles(_GLUON) and sparse_mla_gluon.runs_on(device)


def _pool_views(kv_pool: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], int]:
    """The pool as _latent_rows and _rope_rows read it (rows, float32 words, bf16 words) and its
    row stride in the first view's elements."""
    if kv_pool.dtype == torch.uint8:
        views = (kv_pool.view(torch.float8_e4m3fn), kv_pool.view(torch.float32), kv_pool.view(torch.bfloat16))
        return views, MLA_FP8_BYTES
    return (kv_pool, kv_pool, kv_pool), kv_pool.stride(0)


@triton.jit(do_not_specialize=["num_rows"])  # kernels/specialization.py
def _gather_rows_kernel(kv_ptr, kv_f32_ptr, kv_bf16_ptr, stride_kv, slots_ptr, out_ptr, num_rows,
                        FP8: tl.constexpr, BLOCK_R: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < num_rows
    row = tl.load(slots_ptr + r, mask=ok, other=0).to(tl.int64) * stride_kv
    out = out_ptr + r.to(tl.int64)[:, None] * 576
    latent = _to_bf16(_latent_rows_scaled(kv_ptr, kv_f32_ptr, row, ok, FP8))  # ties to even in the interpreter too
    tl.store(out + tl.arange(0, 512)[None, :], latent, mask=ok[:, None])
    tl.store(out + 512 + tl.arange(0, 64)[None, :], _rope_rows(kv_ptr, kv_bf16_ptr, row, ok, FP8), mask=ok[:, None])


def gather_kv_rows(kv_pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows slots [n] (int32) of a bf16 [S, 576] or FP8 uint8 [S, 656] pool -> bf16 [n, 576],
    FP8 rows dequantized as the kernels above read them (each e4m3 value times its tile's scale in
    float32, rounded to bf16): the contiguous KV of a sparse prefill kernel."""
    fp8 = kv_pool.dtype == torch.uint8
    if fp8 and (kv_pool.shape[-1] != MLA_FP8_BYTES or not kv_pool.is_contiguous()):
        raise ValueError(f"FP8 MLA pool must be contiguous uint8 [S, {MLA_FP8_BYTES}]")
    if not fp8 and (kv_pool.dtype != torch.bfloat16 or kv_pool.shape[-1] != KV_LORA_RANK + ROPE_DIM
                    or kv_pool.stride(-1) != 1):
        raise ValueError(f"bf16 MLA pool must be bf16 [S, {KV_LORA_RANK + ROPE_DIM}] with unit last stride")
    n = slots.numel()
    out = torch.empty(n, KV_LORA_RANK + ROPE_DIM, device=kv_pool.device, dtype=torch.bfloat16)
    if n:
        (views, stride_kv), block_r = _pool_views(kv_pool), 16
        _gather_rows_kernel[(cdiv(n, block_r),)](*views, stride_kv, slots.reshape(-1), out, n, FP8=fp8,
                                                 BLOCK_R=block_r, num_warps=4)
    return out


def sparse_mla(
    q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor, sm_scale: float,
    config: dict | None = None, gluon: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, H, 576] bf16, kv_pool bf16 [S, 576] or uint8 [S, 656], indices [N, topk] int32.

    Returns out [N, H, 512] bf16 and lse [N, H] float32 (natural log, -inf for an empty row).
    Without an explicit config (gluon=None), kernels/sparse_mla_gluon.py's kernel runs wherever it
    can (gluon_runs), at every batch size: one kernel for all batches keeps a row's rounding
    independent of its batch (at batch 1 the two kernels are within 6% of each other). An explicit
    config is the Triton kernel's unless gluon=True, which takes only its SPLIT, BALANCED and
    WAVE_ROWS.
    """
    n, heads, d_qk = q.shape
    if d_qk != KV_LORA_RANK + ROPE_DIM or q.dtype != torch.bfloat16 or q.stride(-1) != 1:
        raise ValueError(f"q must be bf16 [N, H, {KV_LORA_RANK + ROPE_DIM}] with unit last stride")
    fp8 = kv_pool.dtype == torch.uint8
    if fp8 and (kv_pool.shape[-1] != MLA_FP8_BYTES or not kv_pool.is_contiguous()):
        raise ValueError(f"FP8 MLA pool must be contiguous uint8 [S, {MLA_FP8_BYTES}]")
    if not fp8 and (kv_pool.dtype != torch.bfloat16 or kv_pool.shape[-1] != d_qk or kv_pool.stride(-1) != 1):
        raise ValueError(f"bf16 MLA pool must be bf16 [S, {d_qk}] with unit last stride")
    if indices.shape[0] != n or indices.stride(-1) != 1:
        raise ValueError(f"indices must be [N={n}, topk] with unit last stride, got {tuple(indices.shape)}")
    topk = indices.shape[1]
    chosen = gluon is None  # the default path: a Gluon kernel that does not compile hands over to Triton's
    if chosen:
        gluon = config is None and gluon_runs(q, kv_pool)
    cfg = dict(config or mla_config(n, heads, topk))
    split = cfg.pop("SPLIT")
    balanced = cfg.pop("BALANCED", False) and gluon
    wave_rows = cfg.pop("WAVE_ROWS", 0)  # a balanced grid's rows run first in whole waves of the split grid
    block_h, block_n = (sparse_mla_gluon.BLOCK_H, sparse_mla_gluon.BLOCK_N) if gluon else (cfg["BLOCK_H"], cfg["BLOCK_N"])
    if heads % block_h:
        raise ValueError(f"heads ({heads}) must be a multiple of BLOCK_H ({block_h})")
    if split < 1:
        raise ValueError(f"SPLIT must be >= 1, got {split}")
    out = torch.empty(n, heads, KV_LORA_RANK, device=q.device, dtype=torch.bfloat16)
    lse = torch.empty(n, heads, device=q.device, dtype=torch.float32)
    if n == 0:
        return out, lse
    views, stride_kv = _pool_views(kv_pool)
    keys_per_split = cdiv(cdiv(topk, split), block_n) * block_n

    def attend(q, indices, out, lse):  # these rows; split > 1 merges its partials into out, lse
        rows = q.shape[0]
        part, part_lse = out, lse
        if split > 1:
            part = torch.empty(rows, split, heads, KV_LORA_RANK, device=q.device, dtype=torch.float32)
            part_lse = torch.empty(rows, split, heads, device=q.device, dtype=torch.float32)

        def triton_kernel():  # also the Gluon kernel's fallback: mla_config's 64-key tiles divide keys_per_split
            _sparse_mla_kernel[(rows * split * (heads // cfg["BLOCK_H"]),)](
                q, q.stride(0), q.stride(1), *views, stride_kv, kv_pool.shape[0], indices, indices.stride(0), topk,
                part, part_lse, sm_scale * _LOG2E, keys_per_split, split,
                H=heads, FP8=fp8, PARTIAL=split > 1, UPCAST=INTERPRET, **cfg,
            )
            return False

        def gluon_kernel():  # True when its splits met and merged in the kernel
            # not under batch-invariant mode: whether a grid meets depends on the batch, and the
            # meeting's sums may round apart from the merge kernel's
            return sparse_mla_gluon.launch(q, views, stride_kv, kv_pool.shape[0], indices, topk, part, part_lse, out,
                                           lse, sm_scale * _LOG2E, keys_per_split, split, fp8,
                                           merge=not batch_invariant.enabled())

        if not gluon:
            merged = triton_kernel()
        elif chosen:
            merged = with_fallback(_GLUON, gluon_kernel, triton_kernel)
        else:
            merged = gluon_kernel()
        if split > 1 and not merged:
            _merge_splits_kernel[(rows * heads,)](part, part_lse, out, lse, split, H=heads,
                                                  SPLITS=next_power_of_2(split), num_warps=merge_warps(split))

    if balanced:
        if not 0 <= wave_rows < n:
            raise ValueError(f"WAVE_ROWS must leave the balanced grid rows: 0 <= WAVE_ROWS < {n}, got {wave_rows}")

        def run():
            if wave_rows:
                attend(q[:wave_rows], indices[:wave_rows], out[:wave_rows], lse[:wave_rows])
            rest = slice(wave_rows, n)
            _balanced(*(t[rest] if wave_rows else t for t in (q, indices, out, lse)), views, stride_kv,
                      kv_pool.shape[0], sm_scale, fp8)
            return out, lse
        triton_kernel = lambda: sparse_mla(q, kv_pool, indices, sm_scale, gluon=False)  # noqa: E731
        return with_fallback(_GLUON, run, triton_kernel) if chosen else run()

    # Split rows keep fp32 partials. A long run of them (a prefill chunk under batch-invariant mode,
    # where the split does not fall with the rows) goes in slices that bound those to
    # PARTIAL_BYTES; each row's arithmetic is the same in any slice.
    step = n if split == 1 else max(1, PARTIAL_BYTES // (split * heads * KV_LORA_RANK * 4))
    if step >= n:  # one slice: no views to make (four of them cost ~13 µs of host time on the H100 machine)
        attend(q, indices, out, lse)
    else:
        for first in range(0, n, step):
            rows = slice(first, first + step)
            attend(q[rows], indices[rows], out[rows], lse[rows])
    return out, lse


def _balanced(q, indices, out, lse, views, stride_kv, num_slots, sm_scale, fp8):
    """The Gluon kernel's balanced grid, a program an SM (a CTA pair two SMs), then the merge of the
    units it split."""
    pair = sparse_mla_gluon.balanced_pairs(q.shape[1], fp8)
    ctas = 1 + pair  # a program's
    units = q.shape[0] * q.shape[1] // (sparse_mla_gluon.BLOCK_H * ctas)
    tiles = cdiv(indices.shape[1], sparse_mla_gluon.BLOCK_N)
    programs = min(num_sms(q.device) // ctas, units * tiles)
    rows = programs * ctas * 2 * sparse_mla_gluon.BLOCK_H  # partial rows (CTA, first | last run, head)
    part = torch.empty(rows, KV_LORA_RANK, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(rows, device=q.device, dtype=torch.float32)
    if not sparse_mla_gluon.launch_balanced(q, views, stride_kv, num_slots, indices, indices.shape[1], part, part_lse,
                                            out, lse, sm_scale * _LOG2E, fp8, programs, pair):
        return _balanced(q, indices, out, lse, views, stride_kv, num_slots, sm_scale, fp8)  # one CTA a unit now
    pieces = balanced_pieces(units, tiles, programs)
    _merge_balanced_kernel[(programs * ctas, sparse_mla_gluon.BLOCK_H)](
        part, part_lse, out, lse, tiles, units * tiles, H=q.shape[1], PIECES=next_power_of_2(pieces), CTAS=ctas,
        num_warps=merge_warps(pieces))
