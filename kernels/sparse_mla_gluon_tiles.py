"""The Gluon sparse MLA kernel's (kernels/sparse_mla_gluon.py) work on one 64-key tile and on a run's
output, as its two MMA warpgroups do it: QK, the online softmax step, 1 / l, and the output's stores;
and the register layouts its partitions share."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

from .gluon_compat import barrier

# Register layouts of one warpgroup.
QK = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
PV = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16]))
LATENT = gl.constexpr(gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0]))  # bf16 rows: a warp per row, 16 bytes a thread
ROPE_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))  # 64 bf16 rope dims a row


@gluon.jit
def num_tiles(lo, end):
    """64-key tiles in the top-k range lo .. end (none for an empty split)."""
    return gl.cdiv(gl.maximum(end - lo, 0), 64)


@gluon.jit
def qk(q_lat, q_rope, k_lat, k_rope, s_zero):
    """Issue QK of one tile (the 512 latent dims, then the 64 rope dims into the same accumulator)."""
    s = warpgroup_mma(q_lat, k_lat.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_rope, k_rope.permute((1, 0)), s, is_async=True)


@gluon.jit
def online_softmax(s, ok, scale_log2, m_i, l_i):
    """One QK tile through the online softmax (log2 domain; entries not ok masked): P, the factor
    that rescales what came before, and the new running max and sum."""
    s = gl.where(ok[None, :], s * scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing valid yet
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def inverse_sum(l_i):
    """1 / l per row, 0 for a row that saw no valid entry."""
    has = l_i > 0
    return gl.where(has, 1.0 / gl.where(has, l_i, 1.0), 0.0)


@gluon.jit
def store_columns(acc, inv, part_ptr, out_ptr, part_row, row, c0, stage, partial):
    """Value columns c0 .. c0 + 255 of a run's output from acc [64, 256] (layout PV) times 1 / l: float32
    partials in rows part_row .. part_row + 63 of part_ptr when the run covers only part of its top-k
    range, else bf16 in rows row .. row + 63 (n * H + h0) of out_ptr. bf16 goes through `stage` (staging_buffer)
    and leaves in 16-byte row-contiguous stores: straight from the MMA layout they were 4-byte stores,
    ~8% of the kernel's time in a prefill profile."""
    o = acc * gl.convert_layout(inv, gl.SliceLayout(1, PV), assert_trivial=True)[:, None]
    if partial:
        rows = part_row + gl.arange(0, 64, layout=gl.SliceLayout(1, PV))
        cols = c0 + gl.arange(0, 256, layout=gl.SliceLayout(0, PV))
        gl.store(part_ptr + rows.to(gl.int64)[:, None] * 512 + cols[None, :], o)
    else:
        stage.store(o.to(gl.bfloat16))
        barrier()  # (the storing warps' barrier) the whole [64, 256] is staged
        h = row + gl.arange(0, 64, layout=gl.SliceLayout(1, LATENT))
        col = c0 + gl.arange(0, 256, layout=gl.SliceLayout(0, LATENT))
        gl.store(out_ptr + h.to(gl.int64)[:, None] * 512 + col[None, :], stage.load(LATENT))


@gluon.jit
def store_lse(m_i, l_i, part_lse_ptr, lse_ptr, part_row, row, partial, ROWS: gl.constexpr):
    """Each head's log-sum-exp: base 2 beside the partials for a merge, natural log otherwise."""
    has = l_i > 0
    lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    h = gl.arange(0, 64, layout=ROWS)
    if partial:
        gl.store(part_lse_ptr + part_row + h, lse)
    else:
        gl.store(lse_ptr + row + h, lse * 0.6931471805599453)


@gluon.jit
def staging_buffer(q_lat, k_lat, n_tiles, c0: gl.constexpr, BALANCED: gl.constexpr):
    """Where a run's bf16 columns c0 .. c0 + 255 wait for their 16-byte stores: in a balanced grid Q's
    buffer (the run's QKs are done with it, and the gatherer may be filling both key buffers with
    the next run's tiles; the scorer's next Q waits for q_free); else the key buffer that last held
    tile n_tiles - 2, whose products are done."""
    if BALANCED:
        return q_lat.slice(c0, 256, dim=1)
    else:
        return k_lat.index(n_tiles % 2).slice(c0, 256, dim=1)
