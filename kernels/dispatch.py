"""Public entry points: DeepGEMM / FlashMLA where they import and support the GPU, our Triton
kernels otherwise on a GPU, the PyTorch references on the CPU.

`backend` picks one explicitly ("reference", "triton", "deepgemm", "flashmla"); "auto" (the default)
follows the order above, with two exceptions: the call shapes where our Gluon kernels measured
faster than the library (the paged indexer but for next_n 2 on large grids, sparse MLA decode on
small grids and 64-head grids that fill their waves: _ours_instead_of_deepgemm,
_ours_instead_of_flashmla), and batch-invariant mode (kernels/batch_invariant.py), where every entry
keeps to ours. "ours" is "auto" without the libraries. A library that is absent, fails to load, or
refuses a shape is never an error under "auto": the call falls through to ours, "triton" (Gluon on
Hopper; logged once per reason). Our kernels over e4m3 data need compute capability 8.9 (Triton
compiles e4m3 from Ada on): on an older GPU (A100, A10) "auto" and "ours" run those calls on the
references, on the GPU, with one warning.
"""

from __future__ import annotations

import functools
import logging

import torch

from . import deepgemm_rows
from . import reference as ref
from .device import capability, num_sms
from .host_math import next_power_of_2

log = logging.getLogger(__name__)
TOPK_METHODS = ("paged", "ragged")
MODULES = {"deepgemm": "deep_gemm", "flashmla": "flash_mla"}  # backend name -> import name
FP8_CAPABILITY = (8, 9)  # Triton refuses e4m3 (fp8e4nv) below it


@functools.cache
def _library(name: str):
    """The imported module, or None if it is missing or fails to load (e.g. no matching CUDA)."""
    try:
        return __import__(name)
    except Exception as exc:  # noqa: BLE001 - a broken optional extension must not break serving
        log.info("%s unavailable: %s", name, exc)
        return None


def _unless_batch_invariant(choice: str, backend: str) -> str:
    """A call's choice, kept to our kernels under batch-invariant mode when "auto" picked a library:
    FlashMLA's decode schedule follows the batch, "auto" picks our paged indexer or DeepGEMM's by
    the call's shape, and a decode token in a mixed (extend) batch takes the prefill entries
    (ragged logits, sparse MLA prefill) where alone it takes the decode ones, so every entry must
    round alike in any batch."""
    if choice not in MODULES or backend != "auto":
        return choice
    from .batch_invariant import enabled  # imports Triton: only asked on CUDA

    return "triton" if enabled() else choice


def _hopper_or_newer(t: torch.Tensor) -> bool:
    return t.is_cuda and capability(t.device)[0] in (9, 10)


def available_backends(device: torch.device | str = "cuda") -> dict[str, bool]:
    """Which backends this process can use on `device` (for logs and benchmarks)."""
    cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    sm = torch.cuda.get_device_capability(device)[0] if cuda else 0
    return {
        "reference": True,
        "triton": cuda and _library("triton") is not None,
        **{name: cuda and sm in (9, 10) and _library(module) is not None for name, module in MODULES.items()},
        "gluon_paged_indexer": cuda and _gluon_paged_indexer(device),
        "gluon_sparse_mla": cuda and _gluon_sparse_mla(device),
    }


def _gluon_paged_indexer(device) -> bool:
    from .indexer_logits import gluon_paged_runs  # imports Triton: only asked on CUDA

    return gluon_paged_runs(torch.device(device))


def _gluon_sparse_mla(device) -> bool:
    from .sparse_mla import gluon_runs_on  # imports Triton: only asked on CUDA

    return gluon_runs_on(torch.device(device))


def _choose(t: torch.Tensor, backend: str, library: str | None, fp8: bool = False) -> str:
    """The backend of a call on t; fp8: whether our kernel for it reads or writes e4m3."""
    if backend not in ("auto", "ours"):
        return backend
    if not t.is_cuda:
        return "reference"
    if backend == "auto" and library and _hopper_or_newer(t) and _library(MODULES[library]):
        return library
    if fp8 and capability(t.device) < FP8_CAPABILITY:
        _warn_once(f"GPU of compute capability {capability(t.device)}: our e4m3 kernels need "
                   f"{FP8_CAPABILITY} (Triton's fp8e4nv), so the FP8 cache stores, indexer logits and "
                   f"FP8-pool sparse MLA run on the PyTorch references")
        return "reference"
    return "triton"


_REFUSED: set = set()


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _try_library(backend: str, key: tuple, fn):
    """Run a library call. Named explicitly, its errors propagate; under "auto" a refusal (shape,
    arch) returns None once and for all, and the caller falls back to ours (Gluon on Hopper, else
    Triton)."""
    if backend != "auto":
        return fn()
    if key in _REFUSED:
        return None
    try:
        return fn()
    except (RuntimeError, AssertionError, ValueError, TypeError) as exc:
        _REFUSED.add(key)
        log.warning("%s refused %s, using our kernel: %s", key[0], key[1:], exc)
        return None


# ---------------------------------------------------------------- where ours beats the library
# Measured against the libraries in the same calls, CUDA graphs (docs/PERFORMANCE.md, "Ours where
# it is faster than the library"). Each rule reads only the call's shape.

# next_n 2 over at least 128 rows of 32K keys: DeepGEMM is ahead on the H200 (and level on the
# H100). Everywhere else ours is as fast or faster (1.3-2.7x at batch 1), and DeepGEMM refuses
# next_n 4 on SM90.
DEEPGEMM_NEXT_N_2_KEYS = 128 * 32768


def _ours_instead_of_deepgemm(q_fp8, max_context_len: int, next_n: int, page_size: int) -> bool:
    """Whether "auto" takes our paged indexer (the Gluon kernel) over DeepGEMM's for this call."""
    if not q_fp8.is_cuda:
        return False
    from .indexer_logits import gluon_paged_runs  # imports Triton: only asked on CUDA

    deepgemm_ahead = next_n == 2 and q_fp8.shape[0] // 2 * max_context_len >= DEEPGEMM_NEXT_N_2_KEYS
    return not deepgemm_ahead and gluon_paged_runs(q_fp8.device, page_size)


def _ours_instead_of_flashmla(q, kv_pool, topk: int) -> bool:
    """Whether "auto" takes our sparse MLA decode (the Gluon kernel) over FlashMLA's. From the H100
    sweep of every row count (FP8 pool, top-k 2048; docs/PERFORMANCE.md, "Ours against FlashMLA at
    every row count"):
    - up to six (row, 64-head block) units, 1-3 rows of 128 heads and 1-6 of 64: 1.01-1.33x;
    - at 64 heads, where our grid keeps its waves full (_fills_its_waves): 16 and 21-66 rows
      (split in one wave) 0.98-1.29x, 89-132 and 220-264 (unsplit, the last wave at least two
      thirds full) 0.98-1.16x.
    Elsewhere FlashMLA, whose schedule is balanced over the SMs, is ahead or level: from 4 rows of
    128 heads (ours 0.71-1.06x, mostly 0.8-0.93x), and at 64 heads where our last wave leaves SMs
    idle or a balanced grid runs (0.90-1.08x)."""
    if not q.is_cuda:
        return False
    from .batch_invariant import enabled  # these import Triton: only asked on CUDA
    from .sparse_mla import gluon_runs

    if enabled():  # ours all the same (_unless_batch_invariant), and mla_config's grid follows the mode
        return False
    rows, blocks, sms = q.shape[0], q.shape[1] // 64, num_sms(q.device)
    return (rows * blocks <= 6 or blocks == 1 and _fills_its_waves(rows, topk, sms)) and gluon_runs(q, kv_pool)


@functools.cache  # an eager engine asks every layer
def _fills_its_waves(rows: int, topk: int, sms: int) -> bool:
    """Whether our 64-head grid for `rows` keeps its SMs busy: split in one wave over at least 5/8 of
    them (from an eighth of a wave of rows: 11-12 rows in eight splits lost, 0.94-0.95x), or unsplit
    in at most two waves, the last at least two thirds full."""
    from .sparse_mla import mla_config

    cfg = mla_config(rows, 64, topk, sms)
    if cfg["BALANCED"]:
        return False
    programs = rows * cfg["SPLIT"]
    if cfg["SPLIT"] > 1:
        return programs <= sms and rows >= sms // 8 and 8 * programs >= 5 * sms
    return rows <= 2 * sms and 3 * ((rows - 1) % sms + 1) >= 2 * sms


# ---------------------------------------------------------------- cache stores


def store_index_keys(pool, keys, slots, page_size: int, *, rotate: bool = False, backend: str = "auto") -> None:
    """Quantize keys [T, 128] to e4m3 + per-token fp32 scale into pool [pages, page_size*132] uint8."""
    if _choose(keys, backend, None, fp8=True) == "reference":
        return ref.store_index_keys_ref(pool, keys, slots, page_size, rotate)
    from .cache_store import store_index_keys as triton_store

    triton_store(pool, keys, slots, page_size, rotate)


def store_mla_kv(pool, latent, rope, slots, *, backend: str = "auto") -> None:
    """Write latent [T, 512] + rope [T, 64] into a bf16 [S, 576] or FP8 uint8 [S, 656] MLA pool."""
    if _choose(latent, backend, None, fp8=pool.dtype == torch.uint8) == "reference":
        return ref.store_mla_ref(pool, latent, rope, slots)
    from .cache_store import store_mla

    store_mla(pool, latent, rope, slots)


# ---------------------------------------------------------------- indexer logits


def paged_indexer_logits(
    q_fp8, weights, index_pool, block_table, context_lens, *, page_size: int, max_context_len: int,
    next_n: int = 1, clean_logits: bool = True, backend: str = "auto",
) -> torch.Tensor:
    """Decode/verify/draft-extend logits [N, max_context_len] fp32 (convention: kernels/reference.py).

    q_fp8 [N, H, 128] e4m3 with N = batch * next_n; weights [N, H] fp32; context_lens [N] or
    [N, 1] int32 (one row per query token); block_table [batch, max_pages] int32.
    """
    if context_lens is None or block_table is None:
        raise RuntimeError("paged indexer logits need block_table and per-token context_lens; got None")
    library = None if _ours_instead_of_deepgemm(q_fp8, max_context_len, next_n, page_size) else "deepgemm"
    choice = _unless_batch_invariant(_choose(q_fp8, backend, library, fp8=True), backend)
    if choice == "reference":
        return ref.paged_indexer_logits_ref(
            q_fp8, weights, index_pool, block_table, context_lens, page_size, max_context_len, next_n)
    if choice == "deepgemm":
        out = _try_library(backend, ("deepgemm", "paged", next_n, page_size, q_fp8.shape[1]), lambda: _deepgemm_paged(
            q_fp8, weights, index_pool, block_table, context_lens, page_size, max_context_len, next_n, clean_logits))
        if out is not None:
            return out
    from .indexer_logits import paged_indexer_logits as triton_paged

    return triton_paged(q_fp8, weights, index_pool, block_table, context_lens, page_size, max_context_len,
                        next_n, clean_logits)


def _deepgemm_paged(q_fp8, weights, index_pool, block_table, context_lens, page_size, max_len, next_n, clean):
    dg = _library("deep_gemm")
    n, heads, dim = q_fp8.shape
    batch = n // next_n
    lens = context_lens.reshape(batch, next_n).to(torch.int32)  # DeepGEMM 0.1.4 on SM90: [batch, next_n]
    sched = dg.get_paged_mqa_logits_metadata(lens, page_size, dg.get_num_sms())
    kv = index_pool.view(index_pool.shape[0], page_size, 1, dim + 4)
    table = block_table[::next_n] if block_table.shape[0] == n and next_n > 1 else block_table
    # 0.1.4 refuses clean_logits with 2-D lengths (the SM90 layout), so mask here instead
    out = dg.fp8_paged_mqa_logits(q_fp8.view(batch, next_n, heads, dim), kv, weights, lens, table, sched,
                                  max_len, False)[:, :max_len]
    if clean:
        from .indexer_logits import fill_past_lengths

        fill_past_lengths(out, lens)
    return out


def ragged_indexer_logits(
    q_fp8, weights, k_fp8, k_scale, k_start, k_end, *, clean_logits: bool = True, backend: str = "auto",
) -> torch.Tensor:
    """Prefill logits [Nq, Nk] fp32; query i sees keys [k_start[i], k_end[i]) of k_fp8 [Nk, 128]."""
    if k_start is None or k_end is None:
        raise RuntimeError("ragged indexer logits need per-token key offsets k_start/k_end; got None")
    choice = _unless_batch_invariant(_choose(q_fp8, backend, "deepgemm", fp8=True), backend)
    if choice == "reference":
        return ref.ragged_indexer_logits_ref(q_fp8, weights, k_fp8, k_scale, k_start, k_end)
    if choice == "deepgemm":
        dg = _library("deep_gemm")
        out = _try_library(backend, ("deepgemm", "ragged", q_fp8.shape[1]), lambda: dg.fp8_mqa_logits(
            q_fp8, (k_fp8, k_scale.float()), weights, k_start.int(), k_end.int(), clean_logits))
        if out is not None:
            return out
    from .indexer_logits import ragged_indexer_logits as triton_ragged

    return triton_ragged(q_fp8, weights, k_fp8, k_scale, k_start, k_end, clean_logits)


# ---------------------------------------------------------------- top-k


def topk_transform(
    logits, lengths, k: int, method: str, *, row_starts=None, block_table=None, page_size: int | None = None,
    next_n: int = 1, offsets=None, backend: str = "auto", max_length: int | None = None,
) -> torch.Tensor:
    """Top-k of each row's range, transformed: [N, k] int32, -1 padded.

    method "paged": pool slot ids through block_table [N // next_n, max_pages] (decode-like modes);
    method "ragged": position + offsets[i] (prefill; offsets are required). Row i ranks
    logits[i, row_starts[i] : row_starts[i] + lengths[i]] (row_starts defaults to 0).
    max_length: a bound on the lengths that the caller knows on the host (a prefill piece's
    longest request), which sizes the kernel's launch where the logits are much wider.
    CUDA graphs: run one call on the capture stream before capturing (a warm-up), or the captured
    top-k takes the slower three launches (kernels/topk_cooperative.py, barrier counters).
    """
    if method not in TOPK_METHODS:
        raise ValueError(f"top-k transform method must be one of {TOPK_METHODS}, got {method!r}")
    if method == "ragged" and offsets is None:
        raise RuntimeError("ragged top-k transform needs per-token offsets (topk_indices_offset) but got "
                           "None; decode-like modes must use the paged transform")
    if method == "paged" and (block_table is None or page_size is None):
        raise RuntimeError("paged top-k transform needs block_table and page_size; got None")
    if lengths is None:
        raise RuntimeError("top-k needs per-row lengths; got None")
    lengths = lengths.reshape(-1)
    if lengths.numel() != logits.shape[0]:
        raise ValueError(f"lengths has {lengths.numel()} entries for {logits.shape[0]} logit rows")
    if _choose(logits, backend, None) == "reference":
        pos = ref.topk_positions_ref(logits, lengths, k, row_starts)
        if method == "paged":
            return ref.paged_transform_ref(pos, block_table, page_size, next_n)
        return ref.ragged_transform_ref(pos, offsets)
    from . import topk as tk

    if method == "paged":
        return tk.topk_transform(logits, lengths.int(), k, tk.TRANSFORM_PAGED, row_starts=_int(row_starts),
                                 block_table=block_table, page_size=page_size, next_n=next_n, max_length=max_length)
    return tk.topk_transform(logits, lengths.int(), k, tk.TRANSFORM_RAGGED, row_starts=_int(row_starts),
                             offsets=_int(offsets.reshape(-1)), max_length=max_length)


def _int(t):
    return None if t is None else t.to(torch.int32).contiguous()


# ---------------------------------------------------------------- sparse MLA

_FLASH_MLA_META: dict = {}  # per shape, FlashMLA's schedule (made by its first call of that shape)


def sparse_mla_decode(q, kv_pool, indices, sm_scale: float, *, backend: str = "auto"):
    """q [N, H, 576] bf16 over pool rows indices [N, topk] (slot ids, -1 = skip).

    kv_pool: bf16 [S, 576] or FP8 uint8 [S, 656]. Returns (out [N, H, 512] bf16, lse [N, H] fp32).
    FlashMLA's sparse decode reads only the FP8 layout; a bf16 pool goes to Triton.
    """
    fp8 = kv_pool.dtype == torch.uint8
    library = "flashmla" if fp8 and not _ours_instead_of_flashmla(q, kv_pool, indices.shape[1]) else None
    choice = _unless_batch_invariant(_choose(q, backend, library, fp8=fp8), backend)
    if choice == "reference":
        out, lse = ref.sparse_mla_ref(q, kv_pool, indices, sm_scale)
        return out.to(torch.bfloat16), lse
    if choice == "flashmla" and _flashmla_schedule_ready(q, kv_pool, indices, backend):
        res = _try_library(backend, ("flashmla", "decode", q.shape[1], indices.shape[1]),
                           lambda: _flashmla_decode(q, kv_pool, indices, sm_scale))
        if res is not None:
            return res
    from .sparse_mla import sparse_mla

    return sparse_mla(q, kv_pool, indices, sm_scale)


def _flashmla_block(kv_pool) -> int:
    return 64 if kv_pool.shape[0] % 64 == 0 else 1  # slot ids are flat, any block size that divides works


def _flashmla_key(q, kv_pool, indices) -> tuple:
    return (q.shape[0], q.shape[1], indices.shape[1], _flashmla_block(kv_pool), q.device)


def _flashmla_schedule_ready(q, kv_pool, indices, backend: str) -> bool:
    """FlashMLA makes a shape's split schedule on its first call and reuses those tensors after.
    Made inside a CUDA-graph capture, the schedule is computed only when that graph replays, while
    graphs captured later with the same shape reuse it and may replay first, over memory nothing
    wrote. So a capture that meets a shape FlashMLA has not run eagerly takes our kernel (auto), or
    fails (backend="flashmla"): warm each shape up before capturing, as an engine does."""
    if _flashmla_key(q, kv_pool, indices) in _FLASH_MLA_META or not torch.cuda.is_current_stream_capturing():
        return True
    if backend != "auto":
        raise RuntimeError("FlashMLA sparse decode met a shape inside a CUDA-graph capture before any eager call: "
                           "its schedule would be made inside this graph only; run the shape once before capturing")
    _warn_once("sparse MLA decode captured in a CUDA graph before an eager call of its shape: that graph takes "
               "the Triton kernel; warm each shape up before capturing for FlashMLA")
    return False


def _flashmla_decode(q, kv_pool, indices, sm_scale):
    fm = _library("flash_mla")
    n, heads, _ = q.shape
    block = _flashmla_block(kv_pool)
    key = _flashmla_key(q, kv_pool, indices)
    if key not in _FLASH_MLA_META:
        _FLASH_MLA_META[key] = fm.get_mla_metadata()[0]
    out, lse = fm.flash_mla_with_kvcache(
        q.view(n, 1, heads, -1), kv_pool.view(-1, block, 1, kv_pool.shape[-1]), None, None, 512,
        _FLASH_MLA_META[key], softmax_scale=sm_scale, is_fp8_kvcache=True,
        indices=indices.view(n, 1, -1).int(), use_legacy=True)
    return out.view(n, heads, -1), lse.view(n, heads)


def sparse_mla_prefill(q, kv, indices, sm_scale: float, *, backend: str = "auto"):
    """q [Nq, H, 576] bf16 over rows indices [Nq, topk] of kv [Nk, 576] bf16 (-1 = skip).

    Returns (out [Nq, H, 512] bf16, lse [Nq, H] fp32, natural log).
    """
    choice = _unless_batch_invariant(_choose(q, backend, _flashmla_prefill_library(indices.shape[1])), backend)
    if choice == "reference":
        out, lse = ref.sparse_mla_ref(q, kv, indices, sm_scale)
        return out.to(torch.bfloat16), lse
    if choice == "flashmla":
        fm = _library("flash_mla")
        res = _try_library(backend, ("flashmla", "prefill", q.shape[1], indices.shape[1]), lambda: fm.flash_mla_sparse_fwd(
            q, kv.view(kv.shape[0], 1, -1), indices.view(q.shape[0], 1, -1).int(), sm_scale, 512, use_legacy=True))
        if res is not None:
            return res[0], res[2]
    from .sparse_mla import sparse_mla

    return sparse_mla(q, kv, indices, sm_scale)


# FlashMLA's SM90 sparse prefill takes the top-k in blocks of twice its 64 (it asserts as much)
FLASHMLA_PREFILL_TOPK_MULTIPLE = 128


def _flashmla_prefill_library(topk: int) -> str | None:
    return "flashmla" if topk % FLASHMLA_PREFILL_TOPK_MULTIPLE == 0 else None


def sparse_mla_prefill_on_flashmla(q, topk: int) -> bool:
    """Whether "auto" runs sparse_mla_prefill of q [N, H, 576] at this top-k on FlashMLA's kernel
    (installed, Hopper or newer, the top-k a multiple of 128, not refused, not under batch-invariant
    mode): where an FP8 pool's prefill gathers its rows into bf16 for it (dsa_backend/attention.py)."""
    library = _flashmla_prefill_library(topk)
    if _unless_batch_invariant(_choose(q, "auto", library), "auto") != "flashmla":
        return False
    return ("flashmla", "prefill", q.shape[1], topk) not in _REFUSED


def gather_kv_rows(kv_pool, slots, *, backend: str = "auto"):
    """Rows slots [n] (int32) of an MLA pool, bf16 [S, 576] or FP8 uint8 [S, 656] -> bf16 [n, 576],
    FP8 rows dequantized (each e4m3 value times its tile's scale in float32, then rounded to bf16):
    the contiguous KV that sparse_mla_prefill reads. One kernel on a GPU."""
    if _choose(kv_pool, backend, None, fp8=kv_pool.dtype == torch.uint8) == "reference":
        return ref.dequantize_mla_rows(kv_pool, slots).to(torch.bfloat16)
    from .sparse_mla import gather_kv_rows as triton_gather

    return triton_gather(kv_pool, slots)


# ---------------------------------------------------------------- the layers' RMSNorm and RoPE


def _fused_bf16(x: torch.Tensor, backend: str) -> bool:
    """Whether a norm or RoPE call on x takes our kernel, which rounds as bf16 does: bf16 x where
    `_choose` picks a kernel (on a GPU, or named)."""
    return x.dtype == torch.bfloat16 and _choose(x, backend, None) != "reference"


def rms_norm(x, weight, eps: float, *, backend: str = "auto"):
    """weight * (x * rsqrt(mean(x^2) + eps)) over the last dim, in one kernel for bf16 on a GPU."""
    if not _fused_bf16(x, backend) or weight.dtype != torch.bfloat16:
        return ref.rms_norm_ref(x, weight, eps)
    from .norm_rope import rms_norm as triton_rms_norm

    return triton_rms_norm(x, weight, eps)


def rope(x, cos, sin, interleaved: bool, rotary_dim: int | None = None, *, prefix=None, backend: str = "auto"):
    """x [T, D] or [T, H, D] with its first rotary_dim dims rotated (reference.rope_ref), behind
    prefix [T, H, P] in each row when given (the absorbed MLA query: [q_latent | rope(q_rope)]), in
    one kernel for bf16 on a GPU where the rotated half, the rest and the prefix are powers of two."""
    half, rest = (rotary_dim or x.shape[-1]) // 2, x.shape[-1] - (rotary_dim or x.shape[-1])
    shapes_fit = (x.dim() in (2, 3) and x.stride(-1) == 1 and half > 0 and next_power_of_2(half) == half
                  and (rest == 0 or next_power_of_2(rest) == rest))
    if prefix is not None:
        p = prefix.shape[-1]
        shapes_fit = (shapes_fit and x.dim() == 3 and prefix.stride(-1) == 1 and prefix.dtype == x.dtype
                      and next_power_of_2(p) == p)
    if not (_fused_bf16(x, backend) and shapes_fit):
        rotated = ref.rope_ref(x, cos, sin, interleaved, rotary_dim)
        return rotated if prefix is None else torch.cat([prefix, rotated], dim=-1)
    from .norm_rope import rope as triton_rope

    return triton_rope(x, cos, sin, interleaved, rotary_dim, prefix)


# ---------------------------------------------------------------- the MoE router


def route(logits, bias, n_group: int, topk_group: int, top_k: int, renormalize: bool, scaling: float, *,
          backend: str = "auto"):
    """DeepSeek's router past its GEMM (reference.route_ref): float32 logits [T, E] -> (weights
    [T, top_k] float32, expert ids [T, top_k] int64), in one kernel on a GPU where E and the
    group size are powers of two."""
    experts = logits.shape[-1]
    group = experts // n_group
    shapes_fit = (logits.dtype == torch.float32 and logits.dim() == 2 and logits.stride(-1) == 1
                  and next_power_of_2(experts) == experts and next_power_of_2(group) == group)
    if not shapes_fit or _choose(logits, backend, None) == "reference":
        return ref.route_ref(logits, bias, n_group, topk_group, top_k, renormalize, scaling)
    from .router import route as triton_route

    return triton_route(logits, bias, n_group, topk_group, top_k, renormalize, scaling)


def expert_runs(expert_of_pair, num_experts: int, *, backend: str = "auto"):
    """(token, expert) pairs' experts [P] -> (order [P] int64: the pairs stably sorted by expert;
    ends [E] int32: each expert's run end), reference.expert_runs_ref; one kernel on a GPU for a
    decode step's pairs (up to moe_runs.MAX_PAIRS), PyTorch's sort past them."""
    from . import moe_runs

    if expert_of_pair.shape[0] > moe_runs.MAX_PAIRS or _choose(expert_of_pair, backend, None) == "reference":
        return ref.expert_runs_ref(expert_of_pair, num_experts)
    return moe_runs.expert_runs(expert_of_pair, num_experts)


def sum_pairs(y, row_of_pair, k: int, *, backend: str = "auto"):
    """The routed experts' outputs y [R, H] back by token: token t's k pair rows
    (row_of_pair[t * k + s]) summed in float32, in y's dtype; reference.sum_pairs_ref, one kernel
    on a GPU."""
    if _choose(y, backend, None) == "reference":
        return ref.sum_pairs_ref(y, row_of_pair, k)
    from .moe_runs import sum_pairs as triton_sum_pairs

    return triton_sum_pairs(y, row_of_pair, k)


# ---------------------------------------------------------------- block-scaled FP8 GEMMs


def quantize_act(x, *, backend: str = "auto"):
    """x [M, K] -> (e4m3 [M, K], float32 scales [M, ceil(K/128)]), 1 x 128 groups along K."""
    if _choose(x, backend, None, fp8=True) == "reference":
        return ref.quantize_act_ref(x)
    from .fp8_gemm import quantize_act as triton_quantize

    return triton_quantize(x)


def silu_mul_quantize(h, row_weight=None, *, backend: str = "auto"):
    """h [M, 2I] (gate then up) -> quantize_act(silu(gate) * up, times row_weight [M] float32 if
    given): the MLPs' activation, ready for their FP8 down projection, in one pass on a GPU."""
    if _choose(h, backend, None, fp8=True) == "reference":
        return ref.silu_mul_quantize_ref(h, row_weight)
    from .fp8_gemm import silu_mul_quantize as triton_silu_mul_quantize

    return triton_silu_mul_quantize(h, row_weight)


# From this many rows DeepGEMM's FP8 GEMM is ahead of ours (H100, 2026-11-28: 1.3-2.2x at 256
# rows but at the 128-row indexer wk, ~2x at 4096, where ours is a Triton tl.dot loop); below it
# ours is level or ahead at one row and behind by up to 1.4x at 64 on the wide layers
# (docs/PERFORMANCE.md, "FP8 weights kept in FP8").
DEEPGEMM_FP8_ROWS = 64


def fp8_linear(x, w, w_scale, *, backend: str = "auto"):
    """x [M, K] (bf16 or float32) times w [N, K] e4m3 (w_scale [N/128, K/128], or [N, K/128] per
    row) transposed -> [M, N] in x's dtype: a linear layer of an FP8 checkpoint. x is quantized to
    e4m3 a 1 x 128 group at a time (quantize_act), then fp8_linear_quantized."""
    return fp8_linear_quantized(*quantize_act(x, backend=backend), w, w_scale, x.dtype, backend=backend)


def fp8_linear_quantized(a, a_scale, w, w_scale, out_dtype=torch.bfloat16, *, backend: str = "auto"):
    """a [M, K] e4m3 (a_scale [M, K/128], quantize_act's layout) times w [N, K] e4m3 (w_scale
    [N/128, K/128], or [N, K/128] per row) transposed -> [M, N] in out_dtype."""
    choice = _unless_batch_invariant(_choose(a, backend, _fp8_linear_library(w, w_scale, a.shape[0], out_dtype),
                                             fp8=True), backend)
    if choice == "reference":
        return ref.fp8_linear_ref(a, a_scale, w, w_scale).to(out_dtype)
    if choice == "deepgemm":
        res = _try_library(backend, _fp8_gemm_key(w), lambda: deepgemm_rows.gemm(_library("deep_gemm"), a, a_scale,
                                                                                  w, w_scale))
        if res is not None:
            return res
    from .fp8_gemm import fp8_gemm as triton_gemm

    return triton_gemm(a, a_scale, w, w_scale, out_dtype)


def _fp8_linear_library(w, w_scale, rows: int, dtype: torch.dtype) -> str | None:
    block_scales = w_scale.shape[0] != w.shape[0] or w.shape[0] == 1  # DeepGEMM takes no per-row scales
    return "deepgemm" if block_scales and _deepgemm_fp8_linear(rows, dtype, capability(w.device)) else None


def _deepgemm_fp8_linear(rows: int, dtype: torch.dtype, cc: tuple[int, int]) -> bool:
    """Whether "auto" gives an FP8 linear layer to DeepGEMM: from DEEPGEMM_FP8_ROWS rows of bf16,
    on SM90 only. On SM100 DeepGEMM rounds float32 block scales to powers of two (UE8M0) unless
    told not to, which these checkpoints' scales are not; it is not measured there either."""
    return rows >= DEEPGEMM_FP8_ROWS and dtype == torch.bfloat16 and cc[0] == 9


def _fp8_gemm_key(w: torch.Tensor) -> tuple:
    return ("deepgemm", "fp8_gemm_nt", w.shape[0], w.shape[1])


def calibrate_fp8_linear(w, w_scale, max_rows: int) -> frozenset[int]:
    """Where "auto" gives the FP8 linear layer of weight w to DeepGEMM, the row buckets (of
    deepgemm_rows.BUCKET rows, up to max_rows) it runs faster on two row halves, measured now and
    kept for the calls after (kernels/deepgemm_rows.py); empty wherever DeepGEMM does not take it.
    Compiles DeepGEMM's kernel for each bucket. For a warm-up, on an idle GPU."""
    library = _fp8_linear_library(w, w_scale, max_rows, torch.bfloat16)
    if _unless_batch_invariant(_choose(w, "auto", library, fp8=True), "auto") != "deepgemm":
        return frozenset()
    found = _try_library("auto", _fp8_gemm_key(w), lambda: deepgemm_rows.calibrate(
        _library("deep_gemm"), w, w_scale, max_rows, DEEPGEMM_FP8_ROWS))
    return found or frozenset()


# From this many (token, expert) pairs DeepGEMM takes the routed experts' GEMMs (H200,
# 2026-11-28: its M-grouped GEMM 1.1-1.2x ours at 4096 pairs, 1.5-2.2x from 8192; below, where
# the experts' weights bound the step, ours is level or ahead and needs no padded runs;
# docs/PERFORMANCE.md, "Routed experts on DeepGEMM's grouped GEMM").
DEEPGEMM_GROUPED_PAIRS = 8192
_GROUPED_KEY = ("deepgemm", "m_grouped_fp8_gemm_nt_contiguous")


def expert_alignment(pairs: int, *weights: tuple[torch.Tensor, torch.Tensor | None], backend: str = "auto") -> int:
    """The row multiple each expert's run must start on for the routed experts' grouped GEMMs of
    `pairs` rows over each (w, w_scale) of `weights` (fp8_grouped_linear's `align`): DeepGEMM's
    where "auto" gives it every one of them, else 1 (runs back to back, ours)."""
    if not (backend == "auto" and pairs >= DEEPGEMM_GROUPED_PAIRS and all(_deepgemm_grouped(*w) for w in weights)):
        return 1
    return _deepgemm_alignment()


def _deepgemm_alignment() -> int:
    return _library("deep_gemm").get_mk_alignment_for_contiguous_layout()


def _deepgemm_grouped(w: torch.Tensor, w_scale: torch.Tensor | None) -> bool:
    """Whether DeepGEMM can take grouped GEMMs on w: block scales (it takes no per-row ones), SM90
    (as for the dense layers, _deepgemm_fp8_linear), installed, not refused before, and not under
    batch-invariant mode (its tiles follow the rows)."""
    if w_scale is None or not w.is_cuda or w_scale.shape[-2] == w.shape[-2] or capability(w.device)[0] != 9:
        return False
    if _GROUPED_KEY in _REFUSED or _library("deep_gemm") is None:
        return False
    from .batch_invariant import enabled  # imports Triton: only asked on CUDA

    return not enabled()


def fp8_grouped_linear(a, a_scale, w, w_scale, ends, out_dtype=torch.bfloat16, align: int = 1, *,
                       backend: str = "auto"):
    """Rows of a [R, K] e4m3 in runs by group times w[g] ([G, N, K] e4m3, w_scale [G, N/128 or N,
    K/128]) transposed -> [R, N]: routed experts. Group g's rows end at ends[g] (int32) and start
    at the previous end rounded up to a multiple of align; rows in no run are left undefined.
    DeepGEMM takes runs laid out at its alignment (expert_alignment gives it), ours any."""
    choice = _choose(a, backend, "deepgemm" if align > 1 and out_dtype == torch.bfloat16 else None, fp8=True)
    if choice == "reference":
        return ref.fp8_grouped_linear_ref(a, a_scale, w, w_scale, ends, align).to(out_dtype)
    if choice == "deepgemm" and (backend != "auto" or _deepgemm_grouped(w, w_scale)) and align == _deepgemm_alignment():
        res = _try_library(backend, _GROUPED_KEY, lambda: _deepgemm_grouped_linear(a, a_scale, w, w_scale, ends))
        if res is not None:
            return res
    from .fp8_gemm import fp8_grouped_linear as triton_grouped

    return triton_grouped(a, a_scale, w, w_scale, ends, out_dtype, align)


def _deepgemm_grouped_linear(a, a_scale, w, w_scale, ends):
    """DeepGEMM's M-grouped GEMM over runs in its "psum" layout: ends are the runs' ends, each run
    starting at the previous end rounded up to its alignment; it schedules only the runs' blocks."""
    out = torch.empty(a.shape[0], w.shape[1], dtype=torch.bfloat16, device=a.device)
    _library("deep_gemm").m_grouped_fp8_gemm_nt_contiguous((a, a_scale), (w, w_scale), out, ends,
                                                          use_psum_layout=True)
    return out
