"""dsa_kernels.route: the router's kernel against route_ref (TRITON_INTERPRET=1 on the CPU)."""

from __future__ import annotations

import pytest
import torch

from dsa_kernels import reference as ref
from dsa_kernels.router import route

# (experts, groups, groups kept, k): DeepSeek-V3.2's, GLM-5's (one group), a small grouped one
SHAPES = [(256, 8, 4, 8), (256, 1, 1, 8), (16, 4, 2, 3)]


def by_expert(weights: torch.Tensor, ids: torch.Tensor) -> list[dict[int, float]]:
    return [dict(zip(i.tolist(), w.tolist())) for w, i in zip(weights, ids)]


@pytest.mark.parametrize("experts, n_group, topk_group, top_k", SHAPES)
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("device, tokens", [("cpu", 6), pytest.param("cuda", 300, marks=pytest.mark.gpu)])
def test_route_picks_the_references_experts_with_its_weights(experts, n_group, topk_group, top_k, renormalize,
                                                              device, tokens):
    gen = torch.Generator().manual_seed(experts + top_k)
    logits = (torch.randn(tokens, experts, generator=gen) * 3).to(device)
    bias = (torch.randn(experts, generator=gen) * 0.5).to(device)
    weights, ids = route(logits, bias, n_group, topk_group, top_k, renormalize, 2.5)
    want_weights, want_ids = ref.route_ref(logits, bias, n_group, topk_group, top_k, renormalize, 2.5)
    got, want = by_expert(weights, ids), by_expert(want_weights, want_ids)
    assert [set(g) for g in got] == [set(w) for w in want]
    for g, w in zip(got, want):
        assert [g[e] for e in w] == pytest.approx([w[e] for e in w], rel=1e-6)
    # best first: the biased scores of the chosen experts fall along each row
    biased = (logits.sigmoid() + bias).gather(1, ids)
    assert torch.all(biased[:, :-1] >= biased[:, 1:])


def test_the_bias_chooses_experts_but_does_not_weigh_them():
    logits = torch.zeros(1, 16)
    bias = torch.zeros(16)
    bias[[3, 9]] = 10.0  # only the bias singles 3 and 9 out
    weights, ids = route(logits, bias, 1, 1, 2, False, 1.0)
    assert sorted(ids[0].tolist()) == [3, 9] and weights[0].tolist() == [0.5, 0.5]


def test_groups_outside_the_kept_ones_are_never_chosen():
    # group 0 holds the single best expert, but groups 1 and 2 have the better top-two sums
    logits = torch.full((1, 16), -5.0)
    logits[0, 0] = 5.0
    logits[0, 4:6] = 3.0
    logits[0, 8:10] = 2.5
    weights, ids = route(logits, torch.zeros(16), 4, 2, 4, True, 1.0)
    assert sorted(ids[0].tolist()) == [4, 5, 8, 9]


def test_ties_go_to_the_lower_expert():
    weights, ids = route(torch.zeros(2, 16), torch.zeros(16), 4, 2, 3, True, 1.0)
    assert ids.tolist() == [[0, 1, 2]] * 2


def test_no_tokens_give_empty_outputs():
    weights, ids = route(torch.zeros(0, 256), torch.zeros(256), 8, 4, 8, True, 1.0)
    assert weights.shape == (0, 8) and ids.shape == (0, 8)


def test_dispatch_runs_the_reference_on_the_cpu_and_where_the_shapes_do_not_fit(monkeypatch):
    import dsa_kernels
    from dsa_kernels import router

    called = []
    monkeypatch.setattr(router, "route", lambda *a: called.append(a) or ref.route_ref(*a))
    logits, bias = torch.randn(3, 16), torch.zeros(16)
    dsa_kernels.route(logits, bias, 4, 2, 3, True, 1.0)
    assert not called  # auto on the CPU
    dsa_kernels.route(logits, bias, 4, 2, 3, True, 1.0, backend="triton")
    assert len(called) == 1
    dsa_kernels.route(torch.randn(3, 12), torch.zeros(12), 4, 2, 3, True, 1.0, backend="triton")  # 12 experts
    dsa_kernels.route(logits.double(), bias, 4, 2, 3, True, 1.0, backend="triton")
    assert len(called) == 1
