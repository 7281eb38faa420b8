"""Two CTAs as one thread-block cluster, for kernels/sparse_mla_gluon.py's FP8 pairs: the cluster
operations it needs, in inline PTX (Triton 3.6's Gluon, the GPU machine's, has none of them), and
the launch of a Gluon kernel compiled for one CTA as clusters of two.

Inline PTX sees no shared-memory descriptors, so it addresses shared memory as `global_smem` (the
symbol Triton's kernels put every allocation in) plus an offset: a kernel's mbarrier offsets are
read from the PTX of a first build (mbarrier_offsets) and given to the real build as constexprs.
"""

from __future__ import annotations

import re

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .compile_only import compiling_only

LANES = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # one element a thread of a 4-warp partition


class Unavailable(RuntimeError):
    """This Triton's build or launcher is not what the pair launch expects: the one-CTA kernel serves."""


@gluon.jit
def _ptx(asm: gl.constexpr, a, b, c):
    """`asm` in every thread of the (4-warp) partition: $1 its lane in the warpgroup, $2..$4 = a, b, c."""
    lane = gl.arange(0, 128, layout=LANES)
    zero = gl.zeros_like(lane)
    gl.inline_asm_elementwise(asm, "=r,r,r,r,r", [lane, zero + a, zero + b, zero + c], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def cluster_sync():
    """Every thread of both CTAs meets here; the first time, after the mbarrier inits, which it
    makes visible to the peer. Its operand is a scalar: with a tensor's (as _ptx passes), at the
    scorer's start, ptxas spilled 30 words of the scorer's loop (156 bytes against 40; Triton 3.9's
    ptxas for sm_90)."""
    gl.inline_asm_elementwise("fence.mbarrier_init.release.cluster;\n\tbarrier.cluster.arrive.aligned;\n\t"
                              "barrier.cluster.wait.aligned;\n\tmov.u32 $0, 0;", "=r,r", [gl.program_id(0)],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def arrive_remote(bar_offset, peer):
    """One arrival, by the partition's first thread, on CTA `peer`'s mbarrier at `bar_offset`. Relaxed:
    it orders nothing of this CTA's memory, only says that a buffer already waited for is free."""
    _ptx("""{
\t.reg .pred leader;
\t.reg .b32 addr;
\tsetp.eq.u32 leader, $1, 0;
\tmov.u32 addr, global_smem;
\tadd.u32 addr, addr, $2;
\tmapa.shared::cluster.u32 addr, addr, $3;
\t@leader mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [addr];
\tmov.u32 $0, 0;
}""", bar_offset, peer, 0)


@gluon.jit
def push(offset, bar_offset, peer):
    """The partition's first thread copies 32 KB of this CTA's shared memory from `offset` to the same
    place in CTA `peer`, completing on the peer's mbarrier at `bar_offset`, which must expect the
    bytes. What it copies must be fenced for the async proxy first."""
    _ptx("""{
\t.reg .pred leader;
\t.reg .b32 src, dst, bar;
\tsetp.eq.u32 leader, $1, 0;
\tmov.u32 src, global_smem;
\tadd.u32 bar, src, $3;
\tadd.u32 src, src, $2;
\tmapa.shared::cluster.u32 dst, src, $4;
\tmapa.shared::cluster.u32 bar, bar, $4;
\t@leader cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [src], 8192, [bar];
\t@leader cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst+8192], [src+8192], 8192, [bar];
\t@leader cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst+16384], [src+16384], 8192, [bar];
\t@leader cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst+24576], [src+24576], 8192, [bar];
\tmov.u32 $0, 0;
}""", offset, bar_offset, peer)


PUSH_BYTES = 32768

_INIT = re.compile(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[(%r\d+)(?:\+(\d+))?\]")
_BASE = re.compile(r"mov\.(?:b32|u32)\s+(%r\d+),\s*global_smem;")
_ADD = re.compile(r"add\.(?:s32|u32)\s+(%r\d+),\s*(%r\d+),\s*(\d+);")


def mbarrier_offsets(ptx: str) -> list[int]:
    """The `global_smem` offset of every mbarrier a kernel's PTX initializes, in the order of its inits."""
    bases = set(_BASE.findall(ptx))
    adds = {dst: (src, int(imm)) for dst, src, imm in _ADD.findall(ptx)}
    offsets = []
    for reg, extra in _INIT.findall(ptx):
        if reg in bases:
            offsets.append(int(extra or 0))
        elif reg in adds and adds[reg][0] in bases:
            offsets.append(adds[reg][1] + int(extra or 0))
        else:
            raise Unavailable(f"cannot place the mbarrier at [{reg}] in global_smem")
    return offsets


def build(kernel_fn, programs: int, args: list, constexprs: dict):
    """The kernel compiled (not run) for these arguments, as a launch of `programs` would compile it."""
    return kernel_fn.run(*args, grid=(programs,), warmup=True, **constexprs)


def launch(kernel_fn, programs: int, args: list, constexprs: dict):
    """`programs` programs of the Gluon kernel (compiled for one CTA) on the current stream, programs
    2 i and 2 i + 1 one cluster; returns the compiled kernel. Triton 3.6's launcher takes the
    cluster size from the packed metadata's second field (num_ctas) and multiplies the grid by it."""
    kernel = build(kernel_fn, programs, args, constexprs)
    if compiling_only():
        return kernel
    kernel._init_handles()
    try:
        num_warps, _, shared = kernel.packed_metadata
    except (AttributeError, ValueError) as exc:
        raise Unavailable(f"no (num_warps, num_ctas, shared) metadata on this Triton's kernels: {exc}") from exc
    values = list(args) + [constexprs[name] for name in kernel_fn.arg_names[len(args):]]
    try:
        kernel.run(programs // 2, 1, 1, torch.cuda.current_stream().cuda_stream, kernel.function,
                   (num_warps, 2, shared), None, None, None, *values)
    except TypeError as exc:  # a launcher of another signature
        raise Unavailable(f"this Triton's launcher: {exc}") from exc
    return kernel
