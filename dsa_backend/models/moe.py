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
        tokens, k = ids.shape
        # the pairs in expert order, and each expert's run end (an expert no token chose: empty)
        order, ends = dsa_kernels.expert_runs(ids.flatten(), self.w13.shape[0])
        gate, up = _grouped(x, order // k, self.w13, self.w13_scale_inv, ends).chunk(2, dim=-1)
        # the router's weight scales the activation (it is linear through w2), a 2I-wide row, not an H-wide one
        act = (F.silu(gate) * up * weights.flatten()[order, None]).to(x.dtype)
        y = _grouped(act, None, self.w2, self.w2_scale_inv, ends)
        # back to (token, slot) order, then each token's k outputs summed in float32, in slot order
        per_pair = torch.empty_like(y).index_copy_(0, order, y)
        return per_pair.view(tokens, k, -1).sum(1, dtype=torch.float32).to(x.dtype)


def _grouped(x: torch.Tensor, rows: torch.Tensor | None, w: torch.Tensor, scale: torch.Tensor | None,
             ends: torch.Tensor) -> torch.Tensor:
    """x[rows] (all of x if rows is None) in runs ending at `ends`, each run times its w[e]
    transposed. In e4m3 each token is quantized once, before its k copies are gathered."""
    if scale is None:
        return torch._grouped_mm(x if rows is None else x[rows], w.transpose(1, 2), offs=ends)
    values, scales = dsa_kernels.quantize_act(x)
    if rows is not None:
        values, scales = values[rows], scales[rows]
    return dsa_kernels.fp8_grouped_linear(values, scales, w, scale, ends, x.dtype)


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
