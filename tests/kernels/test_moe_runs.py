"""dsa_kernels.expert_runs (the experts' runs counted in one kernel, against PyTorch's stable sort) and
dsa_kernels.sum_pairs (their outputs summed back by token)."""

from __future__ import annotations

import pytest
import torch

from dsa_kernels import moe_runs
from dsa_kernels import reference as ref


@pytest.mark.parametrize("pairs, experts", [(0, 16), (1, 16), (24, 16), (64, 16), (200, 256), (256, 16), (257, 300)])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_runs_equal_the_stable_sorts(pairs, experts, device):
    gen = torch.Generator().manual_seed(pairs + experts)
    # few distinct experts among many pairs: long runs, many equal keys for stability to matter
    expert_of_pair = torch.randint(0, min(experts, 7), (pairs,), generator=gen) * (experts // 7 or 1)
    expert_of_pair = expert_of_pair.clamp_max(experts - 1).to(device)
    order, ends = moe_runs.expert_runs(expert_of_pair, experts)
    want_order, want_ends = ref.expert_runs_ref(expert_of_pair, experts)
    assert torch.equal(order, want_order) and torch.equal(ends, want_ends)


@pytest.mark.gpu
def test_runs_at_a_decode_steps_sizes_on_the_gpu():
    for tokens in (1, 32, 128, 512):
        ids = torch.rand(tokens, 256, device="cuda").topk(8, dim=1)[1]
        order, ends = moe_runs.expert_runs(ids.flatten(), 256)
        want_order, want_ends = ref.expert_runs_ref(ids.flatten(), 256)
        assert torch.equal(order, want_order) and torch.equal(ends, want_ends)


def test_dispatch_sorts_on_the_cpu_and_past_max_pairs(monkeypatch):
    import dsa_kernels

    called = []
    monkeypatch.setattr(moe_runs, "expert_runs", lambda *a: called.append(a) or ref.expert_runs_ref(*a))
    dsa_kernels.expert_runs(torch.zeros(8, dtype=torch.int64), 4)
    assert not called
    dsa_kernels.expert_runs(torch.zeros(8, dtype=torch.int64), 4, backend="triton")
    assert len(called) == 1
    dsa_kernels.expert_runs(torch.zeros(moe_runs.MAX_PAIRS + 1, dtype=torch.int64), 4, backend="triton")
    assert len(called) == 1


@pytest.mark.parametrize("tokens, k, width", [(0, 8, 64), (1, 1, 1100), (5, 8, 300), (33, 4, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pairs_summed_by_token_equal_the_gather_and_sum(tokens, k, width, dtype, device):
    gen = torch.Generator().manual_seed(tokens * k + width)
    # pairs in a larger buffer than they fill, as in runs laid out for DeepGEMM
    y = (torch.randn(3 * tokens * k + 7, width, generator=gen) * 4).to(dtype).to(device)
    row_of_pair = torch.randperm(y.shape[0], generator=gen)[:tokens * k].to(device)
    got = moe_runs.sum_pairs(y, row_of_pair, k)
    want = ref.sum_pairs_ref(y.cpu(), row_of_pair.cpu(), k)
    assert got.dtype == dtype and got.shape == (tokens, width)
    # float32 sums in slot order both ways; torch's bf16 cast rounds ties to even, as ours does
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    if tokens * k > 1:  # the rows matter: other rows, another sum
        assert not torch.equal(want, ref.sum_pairs_ref(y.cpu(), row_of_pair.flip(0).cpu(), k))
