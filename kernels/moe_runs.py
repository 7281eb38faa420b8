"""The routed experts' pairs put in runs, one an expert, in one launch (reference.expert_runs_ref),
and their outputs summed back by token in another (reference.sum_pairs_ref).

PyTorch's stable sort of a decode step's (token, expert) pairs is a radix sort of several
launches, then a search for the runs' ends. Here a pair's place is counted directly: the pairs of
lower experts, plus the same expert's pairs before it. Each program takes a block of pairs (and of
experts, for the ends) and walks every pair's expert once, so the work grows with the square of
the pairs. On an H200 (docs/PERFORMANCE.md, "The experts' runs in one kernel") it took 5.5 µs
against the sort's 34 at 256 pairs, 19 against 36 at 1024 and 72 against 42 at 4096: past
MAX_PAIRS (batches above 128 tokens at k = 8, prefill) the sort runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cache_store import _to_bf16
from .host_math import cdiv

BLOCK = 64
MAX_PAIRS = 1024


@triton.jit
def _expert_runs_kernel(experts_ptr, order_ptr, ends_ptr, num_pairs, num_experts, BLOCK: tl.constexpr):
    mine = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # my pairs' experts (past the end: an expert above all, placed nowhere), and my experts' ids
    expert = tl.load(experts_ptr + mine, mask=mine < num_pairs, other=num_experts).to(tl.int32)
    place = tl.zeros([BLOCK], dtype=tl.int32)
    end = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        other = start + tl.arange(0, BLOCK)
        other_expert = tl.load(experts_ptr + other, mask=other < num_pairs, other=num_experts).to(tl.int32)
        before = (other_expert[None, :] < expert[:, None]) | (
            (other_expert[None, :] == expert[:, None]) & (other[None, :] < mine[:, None]))
        place += tl.sum(before.to(tl.int32), axis=1)
        end += tl.sum((other_expert[None, :] <= mine[:, None]).to(tl.int32), axis=1)
    tl.store(order_ptr + place, mine.to(tl.int64), mask=mine < num_pairs)
    tl.store(ends_ptr + mine, end, mask=mine < num_experts)


def expert_runs(expert_of_pair: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`expert_runs_ref` for expert ids [P] (int32 or int64, each in [0, num_experts))."""
    pairs = expert_of_pair.shape[0]
    order = torch.empty(pairs, dtype=torch.int64, device=expert_of_pair.device)
    ends = torch.empty(num_experts, dtype=torch.int32, device=expert_of_pair.device)
    _expert_runs_kernel[(cdiv(max(pairs, num_experts), BLOCK),)](expert_of_pair, order, ends, pairs, num_experts,
                                                                  BLOCK=BLOCK, num_warps=4)
    return order, ends


@triton.jit
def _sum_pairs_kernel(y_ptr, row_ptr, out_ptr, H, stride_y, stride_out, K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for slot in tl.static_range(K):
        row = tl.load(row_ptr + token * K + slot).to(tl.int64)
        acc += tl.load(y_ptr + row * stride_y + cols, mask=cols < H, other=0.0).to(tl.float32)
    if out_ptr.dtype.element_ty == tl.bfloat16:
        acc = _to_bf16(acc)  # ties to even on the interpreter too
    tl.store(out_ptr + token * stride_out + cols, acc, mask=cols < H)


def sum_pairs(y: torch.Tensor, row_of_pair: torch.Tensor, k: int) -> torch.Tensor:
    """`sum_pairs_ref`: each token's k rows of y (pair t * k + s at row row_of_pair[t * k + s])
    summed in float32, in slot order, one read of each row: the gather, the sum and the cast
    torch would take as three passes."""
    tokens, width = row_of_pair.shape[0] // k, y.shape[1]
    out = torch.empty(tokens, width, dtype=y.dtype, device=y.device)
    if tokens:
        _sum_pairs_kernel[(tokens, cdiv(width, 1024))](y, row_of_pair, out, width, y.stride(0), out.stride(0),
                                                       K=k, BLOCK=1024, num_warps=4)
    return out
