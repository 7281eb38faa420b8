"""Radix-select top-k equals the reference bit for bit, with both transforms and ragged edges."""

import pytest
import torch

from dsa_kernels import reference, topk

K = 16


def _logits(n, width):
    return torch.randn(n, width)


@pytest.mark.parametrize("lengths", [[0, 1, K, K + 1, 2 * K + 3, 100], [K - 1, 57, 64, 99, 3, 100]])
def test_positions_match_reference_at_ragged_edges(lengths):
    logits = _logits(len(lengths), 100)
    lens = torch.tensor(lengths).int()
    out = topk.topk_transform(logits, lens, K, block=32)
    assert torch.equal(out, reference.topk_positions_ref(logits, lens, K))


def test_ties_and_signed_zeros_resolve_to_the_lowest_positions():
    logits = torch.randint(0, 3, (2, 90)).float()
    logits[1, ::2] = -0.0
    lens = torch.tensor([90, 90]).int()
    out = topk.topk_transform(logits, lens, K, block=32)
    assert torch.equal(out, reference.topk_positions_ref(logits, lens, K))


def test_k_larger_than_context_returns_every_position_then_minus_one():
    logits = _logits(1, 8)
    out = topk.topk_transform(logits, torch.tensor([5]).int(), K, block=32)
    assert out[0].tolist() == [0, 1, 2, 3, 4] + [-1] * (K - 5)


def test_paged_transform_maps_positions_to_slots_through_the_block_table():
    page, next_n = 8, 2
    lengths = torch.tensor([70, 69, 13, 12, 0, 0]).int()  # not multiples of the page size
    logits = _logits(6, 72)
    table = torch.randperm(40)[:30].view(3, 10).int()
    out = topk.topk_transform(logits, lengths, K, topk.TRANSFORM_PAGED, block_table=table, page_size=page,
                              next_n=next_n, block=32)
    pos = reference.topk_positions_ref(logits, lengths, K)
    assert torch.equal(out, reference.paged_transform_ref(pos, table, page, next_n))


def test_ragged_transform_adds_each_tokens_offset():
    logits = _logits(5, 120)
    starts = torch.tensor([0, 0, 40, 40, 40]).int()
    lengths = torch.tensor([1, 40, 1, K, 80]).int()
    offsets = starts + 1000
    out = topk.topk_transform(logits, lengths, K, topk.TRANSFORM_RAGGED, row_starts=starts, offsets=offsets,
                              block=32)
    pos = reference.topk_positions_ref(logits, lengths, K, starts)
    assert torch.equal(out, reference.ragged_transform_ref(pos, offsets))


def test_reference_ragged_transform_without_offsets_raises():
    with pytest.raises(RuntimeError, match="offsets"):
        reference.ragged_transform_ref(torch.zeros(1, K, dtype=torch.int32), None)
