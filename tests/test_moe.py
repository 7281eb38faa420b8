"""The routed experts as two grouped GEMMs against a loop over the experts, and with no host sync."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

import dsa_kernels
from dsa_backend.config import ModelConfig
from dsa_backend.models.moe import Experts, _aligned_runs
from dsa_backend.tools.make_checkpoint import make_config
from dsa_backend.weights import quantize_fp8_block
from dsa_kernels.reference import expert_runs_ref


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


def fp8_experts(module: Experts) -> Experts:
    """The module's weights in e4m3 with block scales, as an FP8 checkpoint keeps them."""
    for name in ("w13", "w2"):
        parts = [quantize_fp8_block(w, (128, 128)) for w in getattr(module, name).data]
        setattr(module, name, torch.nn.Parameter(torch.stack([w for w, _ in parts]), requires_grad=False))
        module.register_parameter(name + "_scale_inv", torch.nn.Parameter(torch.stack([s for _, s in parts]),
                                                                          requires_grad=False))
    return module


def test_aligned_runs_start_each_expert_on_a_multiple_and_map_the_pairs_both_ways():
    expert_of_pair = torch.tensor([2, 0, 2, 2, 5, 0, 2, 5, 5])
    order, ends = expert_runs_ref(expert_of_pair, 6)
    pair_of_row, row_of_pair, aligned_ends = _aligned_runs(order, ends, 4, 6)
    # runs of 2, 0, 4, 0, 0, 3 pairs from rows 0, 4, 4, 8, 8, 8
    assert aligned_ends.tolist() == [2, 4, 8, 8, 8, 11]
    assert torch.equal(pair_of_row[row_of_pair], torch.arange(9))
    assert [expert_of_pair[pair_of_row[r]].item() for r in (0, 1, 4, 5, 6, 7, 8, 9, 10)] == [0, 0, 2, 2, 2, 2, 5, 5, 5]
    assert pair_of_row.numel() >= 11 and pair_of_row.numel() % 4 == 0  # sized for every expert chosen
    back_to_back, inverse, same_ends = _aligned_runs(order, ends, 1, 6)
    assert back_to_back is order and same_ends is ends and torch.equal(order[inverse], torch.arange(9))


@pytest.mark.parametrize("tokens", [5, 64])
def test_fp8_experts_on_aligned_runs_equal_them_back_to_back(tokens, monkeypatch):
    m = fp8_experts(experts())
    ids, weights = routing(tokens, m.w13.shape[0], 4)
    x = torch.randn(tokens, m.w13.shape[-1], generator=torch.Generator().manual_seed(1))
    back_to_back = m(x, ids, weights)
    monkeypatch.setattr(dsa_kernels, "expert_alignment", lambda pairs, *weights: 16)
    torch.testing.assert_close(m(x, ids, weights), back_to_back, rtol=1e-6, atol=1e-6)


def without_syncs(m: Experts, *args) -> torch.Tensor:
    """m(*args) under torch's sync debug mode, which raises on a read back to the host; after a
    first call, whose lazy set-up (cuBLAS handles, DeepGEMM's compiles) may synchronize."""
    m(*args)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return m(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 32, 2048])
def test_grouped_experts_read_nothing_back_to_the_host_on_the_gpu(tokens):
    m = experts("cuda", torch.bfloat16)
    ids, weights = routing(tokens, m.w13.shape[0], 4, "cuda")
    x = torch.randn(tokens, m.w13.shape[-1], device="cuda").bfloat16()
    out = without_syncs(m, x, ids, weights)
    want = loop_over_experts(m, x, ids, weights)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not dsa_kernels.available_backends("cuda")["deepgemm"], reason="DeepGEMM not installed")
def test_fp8_experts_on_deepgemm_match_ours_and_read_nothing_back(monkeypatch):
    # DeepSeek-V3.2's widths, 16 experts: a prefill chunk of 1024 tokens is 8192 pairs, DeepGEMM's
    c = types.SimpleNamespace(n_routed_experts=16, moe_intermediate_size=2048, hidden_size=7168)
    m = Experts(c)
    g = torch.Generator().manual_seed(0)
    for p in m.parameters():
        p.data = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
    m = fp8_experts(m).cuda()
    tokens = dsa_kernels.dispatch.DEEPGEMM_GROUPED_PAIRS // 8
    ids, weights = routing(tokens, 16, 8, "cuda")
    x = torch.randn(tokens, 7168, device="cuda").bfloat16()
    assert dsa_kernels.expert_alignment(tokens * 8, (m.w13, m.w13_scale_inv), (m.w2, m.w2_scale_inv)) == 128
    got = without_syncs(m, x, ids, weights)
    assert ("deepgemm", "m_grouped_fp8_gemm_nt_contiguous") not in dsa_kernels.dispatch._REFUSED
    monkeypatch.setattr(dsa_kernels, "expert_alignment", lambda pairs, *weights: 1)
    ours = m(x, ids, weights)
    assert ((got.float() - ours.float()).norm() / ours.float().norm()) < 1e-2
