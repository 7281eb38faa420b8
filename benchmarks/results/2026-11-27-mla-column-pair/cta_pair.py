"""A row's two 64-head CTAs as a thread-block cluster of two (EXPERIMENT): the few cluster operations
the sparse MLA kernel needs, in inline PTX (Triton 3.6's Gluon has none), and the launch of a kernel
compiled for one CTA as clusters of two. Shared memory is addressed as `global_smem` plus the offsets
Triton gives the kernel's allocations; the mbarriers' offsets are read from a first build's PTX."""

from __future__ import annotations

import re

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LANES = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # one element a thread of a 4-warp partition


@gluon.jit
def _ptx(asm: gl.constexpr, a, b, c):
    """`asm` once in every thread of the partition: $1 its lane in the warpgroup, $2..$4 = a, b, c."""
    lane = gl.arange(0, 128, layout=LANES)
    zero = gl.zeros_like(lane)
    gl.inline_asm_elementwise(asm, "=r,r,r,r,r", [lane, zero + a, zero + b, zero + c], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def cluster_sync():
    """Every thread of both CTAs meets here (the first time, after the barrier inits)."""
    _ptx("fence.mbarrier_init.release.cluster;\n\tbarrier.cluster.arrive.aligned;\n\t"
         "barrier.cluster.wait.aligned;\n\tmov.u32 $0, 0;", 0, 0, 0)


@gluon.jit
def arrive_remote(bar_offset, peer):
    """One arrival, by the partition's first thread, on the peer CTA's mbarrier at `bar_offset` (relaxed:
    it says that this CTA's MMAs, already waited for, are done reading)."""
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
    """The partition's first thread copies 32 KB of its shared memory from `offset` to the same place
    in the peer CTA, completing on the peer's mbarrier at `bar_offset`, which expects them. What it
    copies must be fenced for the async proxy."""
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


_INIT = re.compile(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[(%r\d+)(?:\+(\d+))?\]")


def mbarrier_offsets(ptx: str) -> list[int]:
    """The global_smem offset of every mbarrier the kernel initializes, in the order of its inits."""
    bases = set(re.findall(r"mov\.(?:b32|u32)\s+(%r\d+),\s*global_smem;", ptx))
    adds = {dst: (src, int(imm)) for dst, src, imm in re.findall(r"add\.(?:s32|u32)\s+(%r\d+),\s*(%r\d+),\s*(\d+);", ptx)}
    offsets = []
    for reg, extra in _INIT.findall(ptx):
        if reg in bases:
            offsets.append(int(extra or 0))
        elif reg in adds and adds[reg][0] in bases:
            offsets.append(adds[reg][1] + int(extra or 0))
        else:
            raise RuntimeError(f"cannot place the mbarrier at [{reg}] in global_smem")
    return offsets


def launch_pairs(kernel_fn, programs: int, args: list, constexprs: dict):
    """`programs` programs of the Gluon kernel (compiled for one CTA), programs 2 i and 2 i + 1 one
    cluster. Returns the compiled kernel."""
    kernel = kernel_fn.run(*args, grid=(programs,), warmup=True, **constexprs)
    kernel._init_handles()
    num_warps, _, shared = kernel.packed_metadata
    values = list(args) + [constexprs[name] for name in kernel_fn.arg_names[len(args):]]
    kernel.run(programs // 2, 1, 1, torch.cuda.current_stream().cuda_stream, kernel.function, (num_warps, 2, shared),
               None, None, None, *values)
    return kernel


@gluon.jit
def push8(offset, bar_offset, peer):
    """As push, 8 KB."""
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
\tmov.u32 $0, 0;
}""", offset, bar_offset, peer)
