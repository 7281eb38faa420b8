"""Compile the Gluon kernels for Hopper (sm_90) with the installed Triton and print, one JSON line
each, what tests/kernels/test_gluon_compile.py checks. A script of its own: the kernel tests run
under TRITON_INTERPRET=1, which turns Triton's own library functions into interpreter objects that
a compilation cannot use, so this runs in a process without it."""

import concurrent.futures
import contextlib
import io
import json
import os
import re

# compile afresh and have Triton print ptxas's report, so its performance warnings can be read
os.environ["TRITON_ALWAYS_COMPILE"] = "1"
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

from dsa_kernels import indexer_gluon, sparse_mla_gluon

HOPPER = GPUTarget("cuda", 90, 64)


def build(fn, types: dict, constants: dict, aligned: set, num_warps: int):
    """fn for sm_90, arguments typed by `types` (int32 otherwise), those in `aligned` 16-divisible
    as the launcher specializes them; ptxas's "Potential Performance Loss" lines (a wgmma chain
    serialized, setmaxnreg ignored); and the bytes it spilled."""
    sig = {name: "constexpr" if p.is_constexpr else types.get(name, "i32") for name, p in zip(fn.arg_names, fn.params)}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in aligned}
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        kernel = triton.compile(GluonASTSource(fn, sig, dict(constants, num_warps=num_warps), attrs), target=HOPPER,
                                options=dict(num_warps=num_warps))
    lines = report.getvalue().splitlines()
    spilled = [int(m.group(1)) for m in map(re.compile(r"(\d+) bytes spill stores").search, lines) if m]
    return kernel, [line for line in lines if "Potential Performance Loss" in line], max(spilled, default=0)


def _build_sparse_mla(fp8: bool, partial: bool, constants: dict):
    """The sparse MLA kernel at 128 heads, typed as sparse_mla_gluon.launch calls it."""
    types = dict(q_ptr="*bf16", kv_ptr="*fp8e4nv" if fp8 else "*bf16", kv_f32_ptr="*fp32" if fp8 else "*bf16",
                 kv_bf16_ptr="*bf16", idx_ptr="*i32", out_ptr="*fp32" if partial else "*bf16", lse_ptr="*fp32",
                 scale_log2="fp32", count_ptr="*i32", merged_ptr="*bf16", merged_lse_ptr="*fp32")
    aligned = {"q_ptr", "stride_qn", "stride_qh", "kv_ptr", "kv_f32_ptr", "kv_bf16_ptr", "stride_kv", "idx_ptr",
               "stride_idx", "out_ptr", "lse_ptr", "merged_ptr", "merged_lse_ptr"}
    return build(sparse_mla_gluon._sparse_mla_kernel, types, dict(constants, H=128, FP8=fp8, PARTIAL=partial),
                 aligned, sparse_mla_gluon.NUM_WARPS)


def sparse_mla(fp8: bool, partial: bool, merge: int = 0, balanced: bool = False) -> dict:
    k, warnings, spilled = _build_sparse_mla(fp8, partial, dict(MERGE=merge, BALANCED=balanced))
    ptx = k.asm["ptx"]
    return dict(kernel="sparse_mla", fp8=fp8, partial=partial, merge=merge, balanced=balanced, shared=k.metadata.shared,
                cp_async="cp.async." in ptx, setmaxnreg="setmaxnreg" in ptx, spilled=spilled,
                meets="atom.global.gpu.acq_rel.add" in ptx and "ld.global.gpu.acquire" in ptx, ptxas_warnings=warnings)


def sparse_mla_pair(balanced: bool = False) -> dict:
    """The FP8 CTA-pair build at 128 heads, of the split grid or the balanced, as
    sparse_mla_gluon._launch_pairs makes it: a first build for its mbarrier offsets, a second with them."""
    pair = dict(MERGE=0, PAIR=True, READY_AT=0, FREE_PEER_AT=0, BALANCED=balanced)
    probe, _, _ = _build_sparse_mla(True, balanced, pair)
    at = sparse_mla_gluon._barrier_offsets(probe.asm["ptx"])
    k, warnings, spilled = _build_sparse_mla(True, balanced, dict(pair, READY_AT=at[0], FREE_PEER_AT=at[1]))
    ptx = k.asm["ptx"]
    return dict(kernel="sparse_mla_pair", balanced=balanced, shared=k.metadata.shared, offsets=at,
                offsets_kept=sparse_mla_gluon._barrier_offsets(ptx) == at, setmaxnreg="setmaxnreg" in ptx,
                cluster_ops=all(op in ptx for op in ("barrier.cluster.arrive.aligned", "mapa.shared::cluster",
                                                     "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx",
                                                     "mbarrier.arrive.relaxed.cluster.shared::cluster")),
                spilled=spilled, ptxas_warnings=warnings)


def paged_indexer(next_n: int, overlap: bool, unrolled: bool = False, tokens_a_program: int = 0) -> dict:
    key_tiles = TensorDescriptor.from_tensor(torch.empty(4, 64, 128, dtype=torch.float8_e4m3fn), [1, 64, 128],
                                             indexer_gluon.KEY_TILE_LAYOUT)
    scale_tiles = TensorDescriptor.from_tensor(torch.empty(4, 64), [1, 64], indexer_gluon.SCALE_TILE_LAYOUT)
    types = dict(q_ptr="*fp8e4nv", w_ptr="*fp32", keys=mangle_type(key_tiles), scales=mangle_type(scale_tiles),
                 bt_ptr="*i32", lens_ptr="*i32", out_ptr="*fp32")
    aligned = {"q_ptr", "w_ptr", "bt_ptr", "stride_bt", "lens_ptr", "out_ptr", "stride_out"}
    k, warnings, _ = build(indexer_gluon._paged_logits_kernel, types,
                        dict(H=64, PAGE=64, BLOCK=64, KEYS_PER_PROG=1024, STAGES=2 if unrolled else 4,
                             NEXT_N=tokens_a_program or next_n, TOKENS_PER_REQ=next_n, CLEAN=True, EVICT="evict_last",
                             OVERLAP=overlap, UNROLLED=unrolled), aligned, 4)
    ptx = k.asm["ptx"]
    return dict(kernel="paged_indexer", next_n=next_n, overlap=overlap, unrolled=unrolled,
                tokens_a_program=tokens_a_program, shared=k.metadata.shared,
                tma="cp.async.bulk.tensor" in ptx,
                logits_evict_last="st.global.L1::evict_last.L2::cache_hint" in ptx, ptxas_warnings=warnings)


BUILDS = (
    [(sparse_mla, dict(fp8=fp8, partial=partial)) for fp8 in (True, False) for partial in (False, True)]
    + [(sparse_mla, dict(fp8=fp8, partial=True, merge=merge)) for fp8, merge in ((True, 2), (True, 4), (False, 2))]
    + [(sparse_mla, dict(fp8=fp8, partial=True, balanced=True)) for fp8 in (True, False)]
    + [(sparse_mla_pair, dict(balanced=balanced)) for balanced in (False, True)]
    + [(paged_indexer, dict(next_n=next_n, overlap=True)) for next_n in (1, 2, 4)]
    + [(paged_indexer, dict(next_n=2, overlap=False)), (paged_indexer, dict(next_n=2, overlap=False, unrolled=True)),
       (paged_indexer, dict(next_n=3, overlap=True, tokens_a_program=1)),
       (paged_indexer, dict(next_n=5, overlap=False, unrolled=True, tokens_a_program=2))])


def _run(build_and_kwargs) -> str:
    fn, kwargs = build_and_kwargs
    return json.dumps(fn(**kwargs))


if __name__ == "__main__":
    # each build is a second or several of one core's compiling: spread them over the cores, in order
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count()) as pool:
        for line in pool.map(_run, BUILDS):
            print(line, flush=True)
