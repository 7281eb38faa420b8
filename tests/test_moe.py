"""The routed experts as two grouped GEMMs against a loop over the experts, and with no host sync."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dsa_backend.config import ModelConfig
from dsa_backend.models.moe import Experts
from dsa_backend.tools.make_checkpoint import make_config


def experts(device="cpu", dtype=torch.float32) -> Experts:
    c = ModelConfig.from_dict(make_config("deepseek_v32", "tiny"))
    module = Experts(c)
    g = torch.Generator().manual_seed(0)
    for p in module.parameters():
        p.data = (torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5).to(device, dtype)
    return module


def loop_over_experts(m: Experts, x, ids, weights) -> torch.Tensor:
    """Each token's k experts one at a time, in float64."""
    x, w13, w2 = x.double(), m.w13.double(), m.w2.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t].tolist(), weights[t].double()):
            gate, up = (w13[e] @ x[t]).chunk(2)
            out[t] += w * (w2[e] @ (F.silu(gate) * up))
    return out


def routing(tokens: int, num_experts: int, k: int, device="cpu"):
    g = torch.Generator().manual_seed(tokens)
    # experts 0 and 3 are never chosen: their runs are empty
    pool = torch.tensor([e for e in range(num_experts) if e not in (0, 3)])
    ids = torch.stack([pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(tokens)])
    return ids.to(device), torch.rand(tokens, k, generator=g).to(device) * 2.5


@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_grouped_experts_equal_a_loop_over_the_experts(tokens):
    m = experts()
    ids, weights = routing(tokens, m.w13.shape[0], 4)
    x = torch.randn(tokens, m.w13.shape[-1], generator=torch.Generator().manual_seed(1))
    out = m(x, ids, weights)
    assert out.dtype == x.dtype
    torch.testing.assert_close(out.double(), loop_over_experts(m, x, ids, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 32, 2048])
def test_grouped_experts_read_nothing_back_to_the_host_on_the_gpu(tokens):
    m = experts("cuda", torch.bfloat16)
    ids, weights = routing(tokens, m.w13.shape[0], 4, "cuda")
    x = torch.randn(tokens, m.w13.shape[-1], device="cuda").bfloat16()
    m(x, ids, weights)  # first call: lazy initialisation (cuBLAS handles) may synchronize
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = m(x, ids, weights)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = loop_over_experts(m, x, ids, weights)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
