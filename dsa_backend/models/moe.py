"""DeepSeek MoE: sigmoid router with a score-correction bias, group-limited top-k, shared experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import dsa_kernels

from dsa_backend.config import ModelConfig
from dsa_backend.models.layers import DenseMlp


class Router(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.weight = nn.Parameter(torch.empty(c.n_routed_experts, c.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(c.n_routed_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, k] float32, expert ids [T, k]); dsa_kernels.route says how."""
        c = self.c
        # loaded in float32 (dsa_backend/weights.py), so .float() makes no copy a call
        logits = F.linear(x.float(), self.weight.float())
        return dsa_kernels.route(logits, self.e_score_correction_bias, c.n_group, c.topk_group,
                                 c.num_experts_per_tok, c.norm_topk_prob, c.routed_scaling_factor)


class Experts(nn.Module):
    """Routed experts stacked: w13 [E, 2I, H] (gate then up), w2 [E, H, I]. From an FP8 checkpoint
    kept in e4m3 (dsa_backend/models/fp8_linear.py) each has its scales beside it, w13_scale_inv
    [E, 2I/128 or 2I, H/128] and w2_scale_inv [E, H/128, I/128]; otherwise those are None."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(c.n_routed_experts, 2 * c.moe_intermediate_size, c.hidden_size))
        self.w2 = nn.Parameter(torch.empty(c.n_routed_experts, c.hidden_size, c.moe_intermediate_size))
        self.register_parameter("w13_scale_inv", None)
        self.register_parameter("w2_scale_inv", None)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, H], ids / weights [T, k] -> [T, H]: every (token, expert) pair at once, the pairs
        sorted by expert so that each expert's form one run of rows, two grouped GEMMs over the
        runs. Nothing is read back to the host: a loop over the experts a batch routes to waits on
        the GPU once an expert (docs/PERFORMANCE.md, "Where an engine decode step's time goes")."""
        k = ids.shape[1]
        experts = self.w13.shape[0]
        # the pairs in expert order, and each expert's run end (an expert no token chose: empty)
        order, ends = dsa_kernels.expert_runs(ids.flatten(), experts)
        align = dsa_kernels.expert_alignment(order.numel(), (self.w13, self.w13_scale_inv),
                                             (self.w2, self.w2_scale_inv))
        pair_of_row, row_of_pair, ends = _aligned_runs(order, ends, align, experts)
        gate_up = _gate_up(x, pair_of_row // k, self.w13, self.w13_scale_inv, ends, align)
        # the router's weight scales the activation (it is linear through w2), a 2I-wide row, not an H-wide one
        y = _down(gate_up, weights.flatten()[pair_of_row], self.w2, self.w2_scale_inv, ends, align)
        # each token's k outputs summed in float32, in slot order
        return dsa_kernels.sum_pairs(y, row_of_pair, k)


def _aligned_runs(order: torch.Tensor, ends: torch.Tensor, align: int, experts: int):
    """The experts' runs with each one starting on a multiple of align (DeepGEMM's grouped GEMMs,
    dsa_kernels.expert_alignment): (the pair each GEMM row holds [R], the row of each pair in
    (token, slot) order [P], the runs' ends). The rows are sized for the worst case, every expert
    chosen, so that nothing is read back; rows between runs hold pair 0 and are never read. With
    align 1 the runs are back to back: (order, its inverse, ends)."""
    pairs = order.numel()
    if align == 1:
        return order, torch.empty_like(order).index_copy_(0, order, torch.arange(pairs, device=order.device)), ends
    previous = torch.cat([ends.new_zeros(1), ends[:-1]])
    counts = ends - previous
    padded = (counts + align - 1) // align * align
    starts = padded.cumsum(0) - padded
    position = torch.arange(pairs, dtype=ends.dtype, device=ends.device)
    run = torch.searchsorted(ends, position, right=True)
    row = (starts[run] + position - previous[run]).long()
    rows = -(-(pairs + min(experts, pairs) * (align - 1)) // align) * align
    pair_of_row = torch.zeros(rows, dtype=order.dtype, device=order.device).index_copy_(0, row, order)
    return pair_of_row, torch.empty_like(order).index_copy_(0, order, row), (starts + counts).to(torch.int32)


def _gate_up(x: torch.Tensor, rows: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
             ends: torch.Tensor, align: int) -> torch.Tensor:
    """x[rows] in runs ending at `ends` (each starting on a multiple of align), each run times its
    w[e] transposed. In e4m3 each token is quantized once, before its k copies are gathered."""
    if scale is None:
        return torch._grouped_mm(x[rows], w.transpose(1, 2), offs=ends)
    values, scales = dsa_kernels.quantize_act(x)
    return dsa_kernels.fp8_grouped_linear(values[rows], scales[rows], w, scale, ends, x.dtype, align)


def _down(gate_up: torch.Tensor, pair_weight: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
          ends: torch.Tensor, align: int) -> torch.Tensor:
    """silu(gate) * up, times each row's router weight, through the runs' w[e] transposed; in e4m3
    the activation is quantized in the same pass (dsa_kernels.silu_mul_quantize)."""
    if scale is None:
        gate, up = gate_up.chunk(2, dim=-1)
        act = (F.silu(gate) * up * pair_weight[:, None]).to(gate_up.dtype)
        return torch._grouped_mm(act, w.transpose(1, 2), offs=ends)
    values, scales = dsa_kernels.silu_mul_quantize(gate_up, pair_weight)
    return dsa_kernels.fp8_grouped_linear(values, scales, w, scale, ends, gate_up.dtype, align)


class MoE(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate = Router(c)
        self.experts = Experts(c)
        self.shared_experts = (DenseMlp(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts)
                               if c.n_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, ids, weights)
        return out if self.shared_experts is None else out + self.shared_experts(x)
