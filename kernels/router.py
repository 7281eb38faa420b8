"""DeepSeek's MoE router past its GEMM in one launch: sigmoid, the bias, the group-limited top-k,
the weights' gather and renormalization (kernels/reference.py, `route_ref`).

In PyTorch ops that is ~17 kernels a MoE layer (two top-ks, a scatter, a mask, a gather, their
casts and arithmetic), each costing its launch at decode sizes: over DeepSeek-V3.2's 58 MoE
layers, about a thousand launches a decode step. One program a token holds its E scores as
[groups, experts a group] and picks by repeated maxima, the lower index first on ties. The
experts come out best first; the reference's order is unspecified.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .host_math import next_power_of_2


@triton.jit(do_not_specialize=["scaling"])
def _route_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, stride_t, scaling, N_GROUP: tl.constexpr,
                  GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
                  RENORMALIZE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, N_GROUP)[:, None]
    e = g * GROUP + tl.arange(0, GROUP)[None, :]  # [N_GROUP, GROUP] expert ids
    scores = tl.sigmoid(tl.load(logits_ptr + t * stride_t + e))
    choice = scores + tl.load(bias_ptr + e)
    if TOPK_GROUP < N_GROUP:
        # a group's score: its best two biased scores (the best twice where it appears twice)
        best = tl.max(choice, axis=1)
        first = tl.min(tl.where(choice == best[:, None], e, N_GROUP * GROUP), axis=1)
        second = tl.max(tl.where(e == first[:, None], float("-inf"), choice), axis=1)
        group_score = best + second
        kept = tl.zeros([N_GROUP], dtype=tl.int1)
        groups = tl.arange(0, N_GROUP)
        for _ in tl.static_range(TOPK_GROUP):
            left = tl.where(kept, float("-inf"), group_score)
            top = tl.min(tl.where((left == tl.max(left, axis=0)) & ~kept, groups, N_GROUP), axis=0)
            kept = kept | (groups == top)
        choice = tl.where(kept[:, None], choice, float("-inf"))
    slots = tl.arange(0, K_BLOCK)
    ids = tl.zeros([K_BLOCK], dtype=tl.int64)
    weights = tl.zeros([K_BLOCK], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        top = tl.min(tl.min(tl.where(choice == tl.max(tl.max(choice, axis=1), axis=0), e, N_GROUP * GROUP),
                            axis=1), axis=0)
        picked = e == top
        ids = tl.where(slots == k, top.to(tl.int64), ids)
        weights = tl.where(slots == k, tl.sum(tl.sum(tl.where(picked, scores, 0.0), axis=1), axis=0), weights)
        choice = tl.where(picked, float("-inf"), choice)
    if RENORMALIZE:
        weights = weights / (tl.sum(weights, axis=0) + 1e-20)
    out = slots < TOP_K
    tl.store(weights_ptr + t * TOP_K + slots, weights * scaling, mask=out)
    tl.store(ids_ptr + t * TOP_K + slots, ids, mask=out)


def route(logits: torch.Tensor, bias: torch.Tensor, n_group: int, topk_group: int, top_k: int,
          renormalize: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_ref` for float32 logits [T, E] (rows may be strided) and bias [E], E and E / n_group
    powers of two."""
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        _route_kernel[(tokens,)](logits, bias, weights, ids, logits.stride(0), scaling, N_GROUP=n_group,
                                 GROUP=experts // n_group, TOPK_GROUP=topk_group, TOP_K=top_k,
                                 K_BLOCK=next_power_of_2(top_k), RENORMALIZE=renormalize,
                                 num_warps=4 if experts >= 128 else 1)
    return weights, ids
