"""Where a Gluon sparse MLA grid's splits meet (kernels/sparse_mla_gluon.py, at two or four splits in
one wave): each split counts in at its (row, head block)'s counter in global memory
(kernels/grid_barrier.py), waits for the others, and merges a 1 / MERGE share of the value columns,
its own part of that share from shared memory and the others' through L2."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from . import sparse_mla_gluon_tiles as tile
from .gluon_compat import barrier, reinterpret


@gluon.jit
def arrive(counter, MERGE: gl.constexpr):
    """Count this split in at its group's counter (128 / MERGE), after the barrier that puts every
    thread's stores before the release; returns the count before."""
    barrier()
    return gl.atomic_add(counter, 128 // MERGE, sem="acq_rel", scope="gpu")


@gluon.jit
def wait_for_the_group(counter, arrived):
    """Wait until the counter reaches the multiple of 128 after `arrived` (this group's count before
    one of this program's arrivals): every split's partials are then visible."""
    target = (arrived & -128) + 128
    while gl.atomic_add(counter, 0, sem="acquire", scope="gpu") - target < 0:
        pass
    barrier()


@gluon.jit
def keep_share(acc, inv, o_smem, free, n_tiles, part_ptr, n, split, h0, c0, H: gl.constexpr, MERGE: gl.constexpr):
    """A warpgroup's value columns c0 .. c0 + 255 times 1 / l, float32, once both MMA warpgroups are
    done with the key buffers (the last tile's `free`): all of them into o_smem ([share, head,
    column], over those buffers), and to the split's partials in global memory only the columns
    other splits merge."""
    COLS: gl.constexpr = 512 // MERGE
    o = acc * gl.convert_layout(inv, gl.SliceLayout(1, tile.PV), assert_trivial=True)[:, None]
    if n_tiles > 0:
        mbarrier.wait(free.index((n_tiles - 1) % 2), ((n_tiles - 1) // 2) & 1)
    shares = gl.permute(gl.reshape(o, [64, 256 // COLS, COLS]), [1, 0, 2])
    o_smem.slice(c0 // COLS, 256 // COLS, dim=0).store(shares)
    h = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, tile.PV))
    col = c0 + gl.arange(0, 256, layout=gl.SliceLayout(0, tile.PV))
    gl.store(part_ptr + ((n * MERGE + split) * H + h).to(gl.int64)[:, None] * 512 + col[None, :], o,
             mask=(col // (512 // MERGE) != split)[None, :])


@gluon.jit
def merge_share(o_smem, part_ptr, part_lse_ptr, out_ptr, lse_ptr, n, split, h0, H: gl.constexpr,
                MERGE: gl.constexpr):
    """Split `split`'s share of its group's merge, as sparse_mla's merge kernel does it: value columns
    split * 512 / MERGE onwards of its 64 heads, every split's partials weighted by their
    log-sum-exp (its own from o_smem, the others' from L2), out in bf16; split 0 writes the
    natural-log lse. Each thread holds every split of its columns, 16 bytes of each: a pass takes
    64 / MERGE columns (32 registers a thread; 128 / MERGE spilled in the scorer's loop at two
    splits, ptxas for sm_90, Triton 3.9)."""
    COLS: gl.constexpr = 512 // MERGE
    WIDTH: gl.constexpr = 64 // MERGE
    LANES: gl.constexpr = WIDTH // 4
    L3: gl.constexpr = gl.BlockedLayout([MERGE, 1, 4], [1, 32 // LANES, LANES], [1, 4, 1], [2, 1, 0])
    HEADS: gl.constexpr = gl.SliceLayout(2, L3)
    OUT: gl.constexpr = gl.SliceLayout(0, L3)
    s = gl.arange(0, MERGE, layout=gl.SliceLayout(1, HEADS))
    h = h0 + gl.arange(0, 64, layout=gl.SliceLayout(0, HEADS))
    part = (n * MERGE + s[:, None]) * H + h[None, :]  # [MERGE, 64]
    lse = gl.load(part_lse_ptr + part, cache_modifier=".cg")
    top = gl.max(lse, axis=0)
    top = gl.where(top == float("-inf"), 0.0, top)  # every split empty: weights 0, lse -inf
    w = gl.exp2(lse - top[None, :])
    total = gl.sum(w, axis=0)
    has = total > 0
    safe = gl.where(has, total, 1.0)
    if split == 0:
        gl.store(lse_ptr + n * H + h, gl.where(has, (top + gl.log2(safe)) * 0.6931471805599453, float("-inf")))
    inv = gl.convert_layout(gl.where(has, 1.0 / safe, 0.0), gl.SliceLayout(1, OUT))
    rows = part.to(gl.int64)[:, :, None] * 512
    col_in = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    mine = (s == split)[:, None, None]
    others = (s != split)[:, None, None]
    # o_smem's bytes as shares of a rank-2 layout, which can take a runtime index
    own = reinterpret(o_smem, gl.float32, [MERGE, 64, COLS], gl.SwizzledSharedLayout(4, 1, 8, [1, 0])).index(split)
    col_out = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, OUT))[None, :]
    h_out = (n * H + h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, OUT))).to(gl.int64)[:, None] * 512
    for c in gl.static_range(0, COLS, WIDTH):
        first = split * COLS + c
        vals = gl.load(part_ptr + rows + first + col_in, mask=others, other=0.0, cache_modifier=".cg")
        vals = gl.where(mine, own.slice(c, WIDTH, dim=1).load(OUT)[None, :, :], vals)
        o = gl.sum(vals * w[:, :, None], axis=0) * inv[:, None]
        gl.store(out_ptr + h_out + first + col_out, o.to(gl.bfloat16))
