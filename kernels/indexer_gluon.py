"""Paged indexer logits for decode, verify and draft-extend on Hopper, in Gluon: the MMA of one
key tile runs while the program scores the one before, or, on large grids, while other programs on
the SM score theirs.

Same contract and output as kernels/indexer_logits.py's paged kernel, bit for bit. A program walks
one request's pages for NEXT_N of its tokens: all of them at next_n 1, 2 and 4 (at 4 two on grids
of at most two programs an SM); at other next_n one or two (TOKENS_A_PROGRAM), a request's
programs side by side in the grid, so that their reads of its pages after the first come from L2.
Each 64-key tile (inside one page, so page_size % 64 == 0) arrives with its 64 scales by two TMA
copies on one mbarrier, STAGES tiles ahead, and meets the tokens in MMA units of up to two tokens
(N = 64 or 128; next_n 4 takes two units a tile). Two schedules (OVERLAP):
- overlapped: the program issues unit u's `wgmma`, waits only for unit u - 1's
  (`warpgroup_mma_wait(num_outstanding=1)`) and runs its relu / weight / head sum under the
  running MMA, so two accumulators live at once. The unit loop is unrolled: rolled, ptxas
  serialized the wgmma pipeline (C7514: an accumulator read while an MMA is in flight, across the
  loop's back edge), so the MMA did not in fact run under the scoring.
- one MMA at a time: the program waits for each unit's MMA before scoring it. One accumulator
  halves the registers, so twice the programs fit an SM and theirs fill each other's waits; with
  nothing in flight across iterations the tile loop stays rolled. UNROLLED takes STAGES tiles an
  iteration, so that each tile's stage and barrier phase are constants (next_n 2, two stages: 243
  instructions a tile, against the one-tile loop's 265 with three).
A tile's stage is refilled as soon as its last MMA is done, before that unit is scored.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from dsa_backend.cache.layout import INDEX_HEAD_DIM

from .device import l2_bytes
from .gluon_compat import barrier, tma_load
from .host_math import cdiv
from .specialization import logits_rows

BLOCK_K = 64  # keys per tile: one wgmma M block, and the TMA box inside a page
D = gl.constexpr(INDEX_HEAD_DIM)
# The TMA tiles' shared layouts, made once: ~10 µs of host time each a call otherwise
KEY_TILE_LAYOUT = gl.NVMMASharedLayout.get_default_for([1, BLOCK_K, INDEX_HEAD_DIM], gl.float8e4nv)
SCALE_TILE_LAYOUT = gl.NVMMASharedLayout.get_default_for([1, BLOCK_K], gl.float32)


@gluon.jit
def _issue_tile(keys, scales, bars, k_smem, sc_smem, page, first, stage, PAGE: gl.constexpr):
    mbarrier.expect(bars.index(stage), keys.block_type.nbytes + scales.block_type.nbytes)
    tma_load(keys, [page, first % PAGE, 0], bars.index(stage), k_smem.index(stage))
    tma_load(scales, [page, first % PAGE], bars.index(stage), sc_smem.index(stage))


@gluon.jit
def _refill(keys, scales, bars, k_smem, sc_smem, page_next, f_next, stage, bt_row, length, PAGE: gl.constexpr,
            BLOCK: gl.constexpr):
    """Issue the next tile (page_next, f_next) into `stage` and look up the page of the one after."""
    _issue_tile(keys, scales, bars, k_smem, sc_smem, page_next, f_next, stage, PAGE)
    f_next += BLOCK
    return f_next, gl.load(bt_row + f_next // PAGE, mask=f_next < length, other=0)


@gluon.jit
def _page(first_pages, ahead, i: gl.constexpr, first, length):
    """Tile i's page from the program's first pages; page 0 for a tile past the request's keys."""
    return gl.where(first < length, gl.sum(gl.where(ahead == i, first_pages, 0), axis=0), 0)


@gluon.jit
def _score_unit(acc, w, sc, lens, first, out_rows, stride_out, limit, BLOCK: gl.constexpr, GROUP: gl.constexpr,
                H: gl.constexpr, STORE: gl.constexpr, EVICT: gl.constexpr):
    """acc [BLOCK, GROUP * H] = keys . q per (token, head) -> the GROUP tokens' logits of keys
    first .. first + BLOCK - 1, stored; lens [GROUP] are the tokens' own causal lengths."""
    s = gl.maximum(acc, 0.0) * w[None, :]
    # the (token, head) columns split in place: a thread's registers hold whole head runs
    y = gl.convert_layout(gl.sum(gl.reshape(s, [BLOCK, GROUP, H]), axis=2), STORE)
    y = y * sc[:, None]
    pos = first + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, STORE))[:, None]
    row = gl.arange(0, GROUP, layout=gl.SliceLayout(0, STORE))[None, :]
    gl.store(out_rows + row.to(gl.int64) * stride_out + pos, gl.where(pos < lens[None, :], y, float("-inf")),
             mask=pos < limit, eviction_policy=EVICT)


@gluon.jit
def _score(acc, w0, w1, sc, lens0, lens1, group: gl.constexpr, first, out_rows, stride_out, limit,
           BLOCK: gl.constexpr, GROUP: gl.constexpr, H: gl.constexpr, STORE: gl.constexpr, EVICT: gl.constexpr):
    """Score token group `group` of the tile whose keys start at `first`; sc: the tile's key scales."""
    rows = out_rows + group * GROUP * stride_out
    if group == 0:
        _score_unit(acc, w0, sc, lens0, first, rows, stride_out, limit, BLOCK, GROUP, H, STORE, EVICT)
    else:
        _score_unit(acc, w1, sc, lens1, first, rows, stride_out, limit, BLOCK, GROUP, H, STORE, EVICT)


@gluon.jit(do_not_specialize=["stride_bt", "bt_width", "max_len"])  # kernels/specialization.py
def _paged_logits_kernel(
    q_ptr, w_ptr, keys, scales, bt_ptr, stride_bt, bt_width, lens_ptr, out_ptr, stride_out, max_len,
    H: gl.constexpr, PAGE: gl.constexpr, BLOCK: gl.constexpr, KEYS_PER_PROG: gl.constexpr, STAGES: gl.constexpr,
    NEXT_N: gl.constexpr, TOKENS_PER_REQ: gl.constexpr, CLEAN: gl.constexpr, EVICT: gl.constexpr,
    OVERLAP: gl.constexpr, UNROLLED: gl.constexpr, num_warps: gl.constexpr,
):
    # each key tile meets the request's NEXT_N tokens in GROUPS MMA units of GROUP tokens
    GROUP: gl.constexpr = 1 if NEXT_N == 1 else 2
    GROUPS: gl.constexpr = NEXT_N // GROUP
    N: gl.constexpr = GROUP * H
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, N, 32])
    STORE: gl.constexpr = gl.BlockedLayout([1, GROUP], [32, 1], [num_warps, 1], [0, 1])
    SCALES: gl.constexpr = gl.SliceLayout(1, STORE)
    QL: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    N_TILES: gl.constexpr = KEYS_PER_PROG // BLOCK
    UNITS: gl.constexpr = N_TILES * GROUPS
    start = gl.program_id(1) * KEYS_PER_PROG
    # A request's TOKENS_PER_REQ tokens go to PROGRAMS_PER_REQ programs of NEXT_N; the last one's
    # run ends at the request's last token, so it may repeat tokens of the one before.
    PROGRAMS_PER_REQ: gl.constexpr = (TOKENS_PER_REQ + NEXT_N - 1) // NEXT_N
    req = gl.program_id(0) // PROGRAMS_PER_REQ
    tok = req * TOKENS_PER_REQ + gl.minimum(gl.program_id(0) % PROGRAMS_PER_REQ * NEXT_N, TOKENS_PER_REQ - NEXT_N)
    # Everything the first MMA needs is loaded at once, before any of it is used: the lengths, q,
    # the weights and the first STAGES + 1 tiles' pages (masked by the table's width, not by the
    # lengths, so that these loads do not wait for them): one memory round trip, then the TMAs.
    token = gl.arange(0, GROUP, layout=gl.SliceLayout(0, STORE))
    lens0 = gl.load(lens_ptr + tok + token)
    lens1 = gl.load(lens_ptr + tok + (GROUPS - 1) * GROUP + token)
    bt_row = bt_ptr + req.to(gl.int64) * stride_bt
    gl.static_assert(STAGES < 8)
    ahead = gl.arange(0, 8, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
    first_pages = gl.load(bt_row + (start + ahead * BLOCK) // PAGE,
                          mask=(ahead <= STAGES) & ((start + ahead * BLOCK) // PAGE < bt_width), other=0)
    h = gl.arange(0, NEXT_N * H, layout=gl.SliceLayout(1, QL))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
    q = gl.load(q_ptr + (tok.to(gl.int64) * H + h)[:, None] * D + d[None, :])
    col = gl.arange(0, N, layout=gl.SliceLayout(0, MMA))
    w0 = gl.load(w_ptr + tok.to(gl.int64) * H + col)
    w1 = gl.load(w_ptr + tok.to(gl.int64) * H + (GROUPS - 1) * N + col)
    length = gl.maximum(gl.max(lens0, axis=0), gl.max(lens1, axis=0))  # the page walk's end
    out_rows = out_ptr + tok.to(gl.int64) * stride_out
    limit = max_len if CLEAN else gl.minimum(length, max_len)  # never past the row, whatever the length
    if start < length:
        k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, 1, BLOCK, D], keys.layout)
        sc_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK], scales.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        barrier()  # the barriers are in place before the first TMA
        # Tile i lives in stage i % STAGES. The first STAGES tiles are issued now; later ones once
        # every MMA of the tile before them in their stage is done. Tiles past the request's keys
        # read page 0 and are masked at the store.
        for i in gl.static_range(STAGES):
            if i < N_TILES:
                f = start + i * BLOCK
                _issue_tile(keys, scales, bars, k_smem, sc_smem, _page(first_pages, ahead, i, f, length), f, i, PAGE)
        f_next = start + STAGES * BLOCK
        page_next = _page(first_pages, ahead, STAGES, f_next, length)
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NEXT_N * H, D], gl.float8e4nv)
        q_smem = gl.allocate_shared_memory(gl.float8e4nv, [NEXT_N * H, D], q_layout, q)
        fence_async_shared()
        barrier()  # q is in place for every warp before the first MMA
        zero = gl.zeros([BLOCK, N], gl.float32, MMA)
        if OVERLAP:  # unit u + 1's MMA runs while unit u is scored; unrolled: see the module docstring
            mbarrier.wait(bars.index(0), 0)
            acc = warpgroup_mma(k_smem.index(0).reshape([BLOCK, D]), q_smem.slice(0, N).permute((1, 0)), zero,
                                use_acc=False, is_async=True)
            for u in gl.static_range(1, UNITS):
                t = u // GROUPS
                stage = t % STAGES
                if u % GROUPS == 0:
                    mbarrier.wait(bars.index(stage), (t // STAGES) & 1)
                running = warpgroup_mma(k_smem.index(stage).reshape([BLOCK, D]),
                                        q_smem.slice((u % GROUPS) * N, N).permute((1, 0)), zero, use_acc=False,
                                        is_async=True)
                done = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                sc = sc_smem.index(((u - 1) // GROUPS) % STAGES).reshape([BLOCK]).load(SCALES)
                if (u - 1) % GROUPS == GROUPS - 1:  # unit u - 1 was tile t - 1's last MMA: refill its stage
                    barrier()  # every warp is past that MMA and has the tile's scales
                    if t - 1 + STAGES < N_TILES:
                        f_next, page_next = _refill(keys, scales, bars, k_smem, sc_smem, page_next, f_next,
                                                    (t - 1) % STAGES, bt_row, length, PAGE, BLOCK)
                _score(done, w0, w1, sc, lens0, lens1, (u - 1) % GROUPS, start + ((u - 1) // GROUPS) * BLOCK, out_rows,
                       stride_out, limit, BLOCK, GROUP, H, STORE, EVICT)
                acc = running
            done = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            sc = sc_smem.index((N_TILES - 1) % STAGES).reshape([BLOCK]).load(SCALES)
            _score(done, w0, w1, sc, lens0, lens1, GROUPS - 1, start + (N_TILES - 1) * BLOCK, out_rows, stride_out,
                   limit, BLOCK, GROUP, H, STORE, EVICT)
        else:  # one MMA at a time, other programs on the SM fill the wait; a tile an iteration, or STAGES (UNROLLED)
            STEP: gl.constexpr = STAGES if UNROLLED else 1
            gl.static_assert(N_TILES % STEP == 0)
            for i in range(N_TILES // STEP):
                for s in gl.static_range(STEP):
                    t = i * STEP + s
                    stage = s if UNROLLED else t % STAGES
                    mbarrier.wait(bars.index(stage), (i if UNROLLED else t // STAGES) & 1)
                    sc = sc_smem.index(stage).reshape([BLOCK]).load(SCALES)
                    for g in gl.static_range(GROUPS):
                        done = warpgroup_mma(k_smem.index(stage).reshape([BLOCK, D]),
                                             q_smem.slice(g * N, N).permute((1, 0)), zero, use_acc=False)
                        if g == GROUPS - 1:  # the tile's last MMA is done: refill its stage
                            barrier()  # every warp is past that MMA and has the tile's scales
                            if t + STAGES < N_TILES:
                                f_next, page_next = _refill(keys, scales, bars, k_smem, sc_smem, page_next, f_next,
                                                            stage, bt_row, length, PAGE, BLOCK)
                        _score(done, w0, w1, sc, lens0, lens1, g, start + t * BLOCK, out_rows, stride_out, limit,
                               BLOCK, GROUP, H, STORE, EVICT)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
    elif CLEAN:
        for k0 in range(0, KEYS_PER_PROG, BLOCK):
            pos = start + k0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, STORE))[:, None]
            row = gl.arange(0, NEXT_N, layout=gl.SliceLayout(0, STORE))[None, :]
            gl.store(out_rows + row.to(gl.int64) * stride_out + pos,
                     gl.full([BLOCK, NEXT_N], float("-inf"), gl.float32, STORE), mask=pos < max_len)


@functools.cache
def runs_on(device: torch.device) -> bool:
    """wgmma and TMA as used here exist on Hopper (sm_90) only."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def gluon_config(batch: int, max_context_len: int, next_n: int, num_sms: int, heads: int = 64) -> dict:
    """Key chunk per program, pipeline depth and MMA schedule.

    From the H100 / H200 measurements in docs/PERFORMANCE.md (CUDA graphs).
    - next_n 1: four programs fit an SM (110 registers, 4 warps); one wave of 1024-key programs
      when it fits, else of 2048, else 1024 keys. Grids that 1024-key programs would not give two
      programs an SM take the longest chunk of at most 512 keys that gives 1.5 (else 64 keys): 1.04-
      1.6x faster there than 1024-key programs or the Triton kernel (H100, batch 1 to 64). Between
      two and three an SM, 1024 keys are 1.01-1.13x faster than 512 with the keys read from HBM.
    - next_n 2 / 4: 2048 / 1024 keys, halved until every SM has a program (down to 256), else 128
      keys if that gives half the SMs one, else 64 (1.1-1.5x faster there than the Triton kernel).
      Two programs an SM that overlap each MMA with the scoring of the one before (226 / 255
      registers), except on grids of more than four programs an SM, where programs that wait for
      each MMA (116 / 154 registers: four / three an SM; two stages) hide more of the latency; at
      next_n 2 their loop takes both stages an iteration (118 registers), at next_n 4 that would
      take 182. next_n 4 grids of at most two programs an SM take programs of two tokens instead
      (next_n 2's config at 2 * batch requests: as many programs, or twice as many): 1.04-1.26x
      faster with the keys read from HBM at 15 of 16 such grids (H100, batch 1-66, 4K-128K keys;
      0.99x at 1 / 32K), 0.95x at three programs an SM.
    - At 32 heads or fewer (GLM-5's indexer), next_n 4 does a key's products and scoring of 64
      heads at next_n 2, in two MMA units of N = 64 that leave registers for more programs an SM.
      Its chunks go up to 2048 keys where those make one wave (at most four programs an SM) that
      gives no SM more keys than 1024-key chunks would; such a wave of more than two programs an
      SM waits for each MMA, of at most two it takes programs of two tokens. H100, 32 heads,
      against the 64-head config: 1.07x at 32 / 32K, 1.30x at 24 / 32K, 1.27x / 1.17x at 128 / 100
      rows of 4K. 2048-key chunks lost past one wave (0.78x at 80 / 16K) and where an SM got more
      keys (0.95x at 20 / 32K, 160 / 4K). The grids left to 1024-key chunks at two to three
      programs an SM (67-99 rows of 4K keys, 9-12 of 32K, 3 of 128K) take programs of two tokens
      that wait for each MMA, two tiles an iteration, as next_n 2's large grids do: the fastest of
      every config at six such grids, 1.08-1.13x the 64-head config's overlapped programs at nine.
    - Any other next_n takes programs of one token (next_n 1's config over batch * next_n rows),
      or of two (next_n 2's over batch * ceil(next_n / 2) requests) from next_n 7, and from 5 where
      those are more than four an SM: a request's pages are read once a program, the repeats from
      L2, which bounds the one-token programs on large grids. 1.3-1.7x faster than the Triton
      kernel at next_n 3, 1.6-2.5x at 5-8 (H100, batch 1 to 128). next_n 2 and 4 in programs of one
      token took 0.75-1.14x the time of their own."""
    def programs(kpp):
        return batch * cdiv(max_context_len, kpp)

    def busiest(kpp):  # keys on the SM with the most programs
        return cdiv(programs(kpp), num_sms) * kpp

    if next_n == 1:
        if programs(1024) >= 2 * num_sms:
            kpp = next((k for k in (1024, 2048) if programs(k) <= 4 * num_sms), 1024)
        else:
            kpp = next((k for k in (512, 256, 128) if 2 * programs(k) >= 3 * num_sms), 64)
        return dict(KEYS_PER_PROG=kpp, STAGES=4, OVERLAP=True, UNROLLED=False)
    if next_n not in (2, 4):
        pairs = gluon_config(batch * cdiv(next_n, 2), max_context_len, 2, num_sms, heads)
        if next_n >= 7 or (next_n > 4 and not pairs["OVERLAP"]):  # not OVERLAP: > 4 programs an SM
            return dict(pairs, TOKENS_A_PROGRAM=2)
        return dict(gluon_config(batch * next_n, max_context_len, 1, num_sms, heads), TOKENS_A_PROGRAM=1)
    few_heads = heads <= 32
    one_wave_of_2048 = programs(2048) <= 4 * num_sms and busiest(2048) <= busiest(1024)
    longest = 2048 if next_n == 2 or (few_heads and one_wave_of_2048) else 1024
    kpp = next((k for k in (2048, 1024, 512, 256) if k <= longest and programs(k) >= num_sms),
               128 if 2 * programs(128) >= num_sms else 64)
    if programs(kpp) > (2 if next_n == 4 and kpp == 2048 else 4) * num_sms:
        return dict(KEYS_PER_PROG=kpp, STAGES=2, OVERLAP=False, UNROLLED=next_n == 2)
    if next_n == 4 and programs(kpp) <= 2 * num_sms:
        return dict(gluon_config(2 * batch, max_context_len, 2, num_sms, heads), TOKENS_A_PROGRAM=2)
    if next_n == 4 and few_heads:  # 1024-key chunks, two to three programs an SM
        return dict(KEYS_PER_PROG=kpp, STAGES=2, OVERLAP=False, UNROLLED=True, TOKENS_A_PROGRAM=2)
    return dict(KEYS_PER_PROG=kpp, STAGES=4, OVERLAP=True, UNROLLED=False)


def _logits_eviction(out: torch.Tensor) -> str:
    """The L2 policy of the logits' stores. The key reads stream past L2 (32 rows of 32K keys are
    138 MB against 50 MB), and with a normal policy they evict the logits written early before
    the top-k reads them back. Logits that fit half of L2 are stored evict_last; the top-k's read
    of them is evict_first, which hands the lines back (docs/PERFORMANCE.md, "The logits stored
    evict_last")."""
    return "evict_last" if out.numel() * out.element_size() <= l2_bytes(out.device) // 2 else ""


def paged_indexer_logits(q_fp8, weights, keys, scales, block_table, context_lens, max_context_len: int, next_n: int,
                         clean_logits: bool, config: dict) -> torch.Tensor:
    """Arguments as kernels/indexer_logits.paged_indexer_logits (next_n 1, 2 or 4), already checked
    there; keys [pages, page_size, 128] and scales [pages, page_size] are its pool_parts views."""
    n, heads, _ = q_fp8.shape
    out = logits_rows(n, max_context_len, q_fp8.device)
    key_tiles = TensorDescriptor.from_tensor(keys, [1, BLOCK_K, INDEX_HEAD_DIM], KEY_TILE_LAYOUT)
    scale_tiles = TensorDescriptor.from_tensor(scales, [1, BLOCK_K], SCALE_TILE_LAYOUT)
    config = dict(config)
    per_program = config.pop("TOKENS_A_PROGRAM", next_n)
    grid = (n // next_n * cdiv(next_n, per_program), cdiv(max_context_len, config["KEYS_PER_PROG"]))
    _paged_logits_kernel[grid](
        q_fp8, weights, key_tiles, scale_tiles, block_table, block_table.stride(0), block_table.shape[1], context_lens,
        out, out.stride(0), max_context_len, H=heads, PAGE=keys.shape[1], BLOCK=BLOCK_K, NEXT_N=per_program,
        TOKENS_PER_REQ=next_n, CLEAN=clean_logits, EVICT=_logits_eviction(out), num_warps=4, **config,
    )
    return out
