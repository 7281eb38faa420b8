"""Batch-invariant GEMMs and reductions: each output row is computed the same way whatever the
number of rows, so a request's logits do not depend on the batch it runs in.

cuBLAS and torch's reduction kernels pick tiles, split-K and cross-block splits by problem size,
which changes the float summation order of a row when the batch grows. Here every GEMM uses one
fixed tile configuration and walks K in the same order (no split-K), and every reduction runs one
program per output with a fixed block, so a row's arithmetic is the same at M = 1 and M = 4096.

`enable_batch_invariant_mode(device)` routes aten's CUDA mm / addmm / bmm / _grouped_mm / sum /
mean to these kernels for the whole process (a Triton python-backend instance is a process of its
own). It is the engine's `batch_invariant` switch; it costs speed (no cuBLAS, no split-K at small
M, a host read per grouped GEMM).
"""

from __future__ import annotations

import functools
import logging
import math
import warnings

import torch
import triton
import triton.language as tl

from .host_math import cdiv
from .triton_dot import INTERPRET, dot

log = logging.getLogger(__name__)

_GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# One tile shape for every GEMM: the point is that it never changes with M.
_BLOCK_M, _BLOCK_N, _BLOCK_K = 64, 64, 32
_REDUCE_BLOCK = 512


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K,
                 sab, sam, sak, sbb, sbk, sbn, sxb, sxm, sxn, scb, scm, scn,
                 HAS_BIAS: tl.constexpr, EXACT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    batch, pid_m, pid_n = tl.program_id(2), tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + batch * sab + rm[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + batch * sbb + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
        acc += dot(a, b, EXACT)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + batch * sxb + rm[:, None] * sxm + rn[None, :] * sxn, mask=inside,
                       other=0.0).to(tl.float32)
    tl.store(c_ptr + batch * scb + rm[:, None] * scm + rn[None, :] * scn,
             acc.to(c_ptr.dtype.element_ty), mask=inside)


def bmm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N] (+ bias broadcastable to [B, M, N]) -> [B, M, N] in a's dtype."""
    if a.dtype not in _GEMM_DTYPES or b.dtype != a.dtype:
        raise TypeError(f"batch-invariant GEMM takes float16/bfloat16/float32 operands of one dtype, "
                        f"got {a.dtype} and {b.dtype}")
    batch, m, k = a.shape
    n = b.shape[2]
    c = torch.empty(batch, m, n, dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if k == 0:
        return c.zero_() if bias is None else c.copy_(bias.expand_as(c))
    x = c if bias is None else bias.expand(batch, m, n)
    grid = (cdiv(m, _BLOCK_M), cdiv(n, _BLOCK_N), batch)
    _gemm_kernel[grid](a, b, x, c, m, n, k, *a.stride(), *b.stride(), *x.stride(), *c.stride(),
                       HAS_BIAS=bias is not None, EXACT=INTERPRET or a.dtype == torch.float32,
                       BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K)
    return c


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] (+ bias broadcastable to [M, N]) -> [M, N]."""
    bias3 = None if bias is None else bias.expand(a.shape[0], b.shape[1])[None]
    return bmm(a[None], b[None], bias3)[0]


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, bias=None,
               out_dtype=None) -> torch.Tensor:
    """torch._grouped_mm of a [M, K], whose rows come group after group (offs: each group's end),
    with b [G, K, N]: mm a group at a time, so a row's bits do not depend on how many rows share
    its group. The ends are read back to the host, which this mode's speed allows."""
    if a.dim() != 2 or b.dim() != 3 or offs is None or bias is not None or out_dtype not in (None, a.dtype):
        # the routed experts' form is the only one the engine calls
        raise ValueError(f"batch-invariant grouped_mm takes a 2-D a grouped by offs and a 3-D b, with no bias or "
                         f"other out_dtype; got a {a.dim()}-D, b {b.dim()}-D, offs given: {offs is not None}, "
                         f"bias given: {bias is not None}, out_dtype {out_dtype}")
    out = a.new_zeros(a.shape[0], b.shape[2])  # rows past the last group stay zero
    start = 0
    for group, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = mm(a[start:end], b[group])
        start = end
    return out


@triton.jit
def _row_reduce_kernel(x_ptr, out_ptr, R, stride_row, inv_count, MEAN: tl.constexpr, BLOCK: tl.constexpr,
                       ACC: tl.constexpr):
    # One program per output; lanes accumulate strided columns, then one fixed-shape tree sum.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, R, BLOCK):
        acc += tl.load(x_ptr + row * stride_row + start + cols, mask=start + cols < R, other=0).to(ACC)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total * inv_count
    tl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty))


def _accumulator(dtype: torch.dtype):
    if dtype == torch.float64:
        return tl.float64
    if dtype.is_floating_point:
        return tl.float32
    if dtype.is_complex:
        raise TypeError(f"batch-invariant reductions do not take complex tensors ({dtype})")
    return tl.int64  # bool and integers: exact, so any order gives the same sum


def reduce_sum(x: torch.Tensor, dims=None, keepdim: bool = False, dtype: torch.dtype | None = None,
               mean: bool = False) -> torch.Tensor:
    """torch.sum / torch.mean over dims (None or []: all) with a row order independent of the batch."""
    dims = sorted({d % max(x.dim(), 1) for d in dims}) if dims else list(range(x.dim()))
    if dtype is None:
        dtype = x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.int64
    kept = [d for d in range(x.dim()) if d not in dims]
    out_shape = [1 if d in dims else x.shape[d] for d in range(x.dim())]
    reduced = math.prod(x.shape[d] for d in dims)
    rows = x.permute(*kept, *dims).reshape(math.prod(x.shape[d] for d in kept), reduced).contiguous()
    out = torch.empty(rows.shape[0], dtype=dtype, device=x.device)
    if rows.shape[0]:
        inv_count = 1.0 / reduced if reduced else math.nan  # the mean of nothing is nan, as in torch
        _row_reduce_kernel[(rows.shape[0],)](rows, out, reduced, rows.stride(0), inv_count, MEAN=mean,
                                             BLOCK=_REDUCE_BLOCK, ACC=_accumulator(x.dtype))
    out = out.view(out_shape)
    return out if keepdim else out.view([x.shape[d] for d in kept])


# ---------------------------------------------------------------- aten overrides (CUDA)


def _addmm(bias, a, b, *, beta=1, alpha=1):
    if beta == 1 and alpha == 1:
        return mm(a, b, bias)
    return mm(a, b) * alpha + bias * beta


def _sum_dim(x, dim, keepdim=False, *, dtype=None):
    return reduce_sum(x, dim, keepdim, dtype)


def _sum_out(x, dim, keepdim=False, *, dtype=None, out):
    # logsumexp reaches the reduction through this variant.
    result = reduce_sum(x, dim, keepdim, dtype)
    out.resize_(result.shape)
    return out.copy_(result)


def _mean_dim(x, dim, keepdim=False, *, dtype=None):
    return reduce_sum(x, dim, keepdim, dtype, mean=True)


_OVERRIDES = {"mm": mm, "addmm": _addmm, "bmm": bmm, "_grouped_mm": grouped_mm, "sum.dim_IntList": _sum_dim,
              "sum.IntList_out": _sum_out, "mean.dim": _mean_dim}


@functools.cache
def _register_cuda_overrides() -> torch.library.Library:
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # replacing the CUDA kernels is the point; torch warns that it happens
        warnings.filterwarnings("ignore", message="Warning only once for all operators")
        for op, fn in _OVERRIDES.items():
            library.impl(op, fn, "CUDA")
    return library  # kept alive by the cache: dropping the Library would undo the overrides


_ENABLED = False  # set by enable_batch_invariant_mode on CUDA, for the whole process


def enable_batch_invariant_mode(device: torch.device) -> None:
    """Route this process's CUDA GEMMs and sum/mean reductions through the kernels above, and have
    the dispatch keep sparse MLA on kernels whose rows do not depend on the batch (`enabled`).

    On the CPU nothing changes: torch's CPU GEMMs and reductions already gave batch-invariant
    greedy output in the project's tests (float32)."""
    global _ENABLED
    if torch.device(device).type != "cuda":
        log.info("batch_invariant: %s kernels are left as they are", device)
        return
    _register_cuda_overrides()
    _ENABLED = True
    log.info("batch_invariant: CUDA mm/addmm/bmm/_grouped_mm/sum/mean use fixed-order Triton kernels; sparse MLA "
             "takes our kernel at a split set by top-k alone")


def disable_batch_invariant_mode() -> None:
    """Give aten its own CUDA kernels back: the mode is for a whole serving process, but a test
    process that enabled it goes on to capture CUDA graphs, which its grouped GEMM cannot."""
    global _ENABLED
    if _register_cuda_overrides.cache_info().currsize:
        _register_cuda_overrides()._destroy()  # the dispatcher falls back to the kernels it replaced
        _register_cuda_overrides.cache_clear()
    _ENABLED = False


def enabled() -> bool:
    """Whether this process is in batch-invariant mode. Sparse MLA splits top-k by the grid's size,
    and a row merged from two splits rounds differently from one merged from 32, so under this mode
    kernels/sparse_mla.py splits by top-k alone and the dispatch leaves FlashMLA aside (its
    decode schedule follows the batch too)."""
    return _ENABLED
