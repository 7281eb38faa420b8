"""ForwardBatch.build: tokens flattened request after request, slots through each request's pages."""

import pytest
import torch

from dsa_backend.batch import ForwardBatch, ForwardMode, TreeLayout


def test_tokens_get_their_positions_slots_lengths_and_logit_rows():
    # request 0: 2 new tokens after 3 cached, on pages [7, 2] of 4 slots; request 1: 1 token after 5, pages [9, 4]
    batch = ForwardBatch.build(ForwardMode.EXTEND, [[11, 12], [13]], [3, 5], [[7, 2], [9, 4]], 4,
                               all_logits=[True, False])
    assert batch.input_ids.tolist() == [11, 12, 13]
    assert batch.positions.tolist() == [3, 4, 5]
    assert batch.out_cache_loc.tolist() == [7 * 4 + 3, 2 * 4 + 0, 4 * 4 + 1]
    assert batch.seq_lens.tolist() == batch.seq_lens_cpu == [5, 6]
    assert batch.extend_lens.tolist() == batch.extend_lens_cpu == [2, 1]
    assert batch.block_table.tolist() == [[7, 2], [9, 4]] and batch.block_table.dtype == torch.int32
    assert batch.logits_rows.tolist() == [0, 1, 2] and batch.tree is None


def test_shorter_page_lists_are_padded_and_only_last_tokens_give_logits_by_default():
    batch = ForwardBatch.build(ForwardMode.EXTEND, [[1, 2, 3], [4]], [0, 0], [[5], [6, 8]], 4)
    assert batch.block_table.tolist() == [[5, 0], [6, 8]]
    assert batch.logits_rows.tolist() == [2, 3]


@pytest.mark.parametrize("requests", [1, 3, 5])
def test_every_field_starts_on_a_16_byte_boundary(requests):
    # Triton specializes pointers on 16-byte alignment: a field's offset in its packed copy must
    # not follow the batch size, or a kernel compiles again for odd batch sizes (transfer.py)
    batch = ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[1, 2, 3]] * requests, [5] * requests,
                               [[7, 2, 9]] * requests, 4, all_logits=True)
    fields = {name: getattr(batch, name) for name in ("input_ids", "positions", "out_cache_loc", "logits_rows",
                                                       "seq_lens", "extend_lens", "block_table")}
    assert {name: t.data_ptr() % 16 for name, t in fields.items()} == dict.fromkeys(fields, 0)
    assert batch.block_table.tolist() == [[7, 2, 9]] * requests and batch.extend_lens.tolist() == [3] * requests
    assert batch.logits_rows.tolist() == list(range(3 * requests))


def test_a_draft_tree_puts_each_node_in_its_own_slot_at_its_depths_position():
    # root, two children of the root, a grandchild under node 2
    tree = TreeLayout(((0,), (0, 1), (0, 2), (0, 2, 3)))
    batch = ForwardBatch.build(ForwardMode.TARGET_VERIFY, [[1, 2, 3, 4]], [10], [[0, 1, 2, 3]], 4, all_logits=True,
                               trees=[tree])
    assert batch.positions.tolist() == [10, 11, 11, 12]          # RoPE position: prefix + depth
    assert batch.out_cache_loc.tolist() == [10, 11, 12, 13]      # KV slot: prefix + node id
    assert batch.seq_lens_cpu == [14]
    assert batch.tree.base.tolist() == [10] * 4
    assert batch.tree.ancestors.tolist() == [[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 2, 3]]


def test_a_request_without_enough_pages_or_tokens_is_refused_by_name():
    with pytest.raises(ValueError, match="request 1 needs 9 KV slots but has 2 pages of 4"):
        ForwardBatch.build(ForwardMode.EXTEND, [[1], [2]], [0, 8], [[0], [1, 2]], 4)
    with pytest.raises(ValueError, match="at least one new token"):
        ForwardBatch.build(ForwardMode.EXTEND, [[1], []], [0, 0], [[0], [1]], 4)
