"""Top-k equals the reference bit for bit: rows cut into blocks, sampled thresholds, the whole-row fallback,
both transforms and ragged edges."""

import pytest
import torch

from dsa_kernels import reference, topk

K = 16
# Tiny tiles so the interpreter runs several programs per row and rows longer than the sample.
SMALL = topk.TopkConfig(block=32, sample=64, cap=64, select_block=64)


def _logits(n, width):
    return torch.randn(n, width)


def _check(logits, lengths, config=SMALL, starts=None):
    lens = torch.tensor(lengths).int()
    out = topk.topk_transform(logits, lens, K, row_starts=starts, config=config)
    assert torch.equal(out, reference.topk_positions_ref(logits, lens, K, starts))


@pytest.mark.parametrize("lengths", [[0, 1, K, K + 1, 2 * K + 3, 100], [K - 1, 57, 64, 99, 3, 100]])
def test_positions_match_reference_at_ragged_edges(lengths):
    _check(_logits(len(lengths), 100), lengths)


def test_rows_of_very_different_lengths_split_unevenly_across_block_programs():
    # 300 keys: blocks of 32 leave a partial last block; 77 and 129 end inside one.
    _check(_logits(6, 300), [300, 0, 77, 129, K + 1, 5])


@pytest.mark.parametrize("config", [SMALL, topk.TopkConfig(block=32, sample=64, cap=256, select_block=32)],
                         ids=["candidates-in-one-select-block", "candidates-over-several-select-blocks"])
def test_rows_longer_than_the_sample_select_from_sampled_candidates(config):
    _check(_logits(3, 400), [400, 257, 65], config)


def test_ties_and_signed_zeros_resolve_to_the_lowest_positions():
    logits = torch.randn(3, 200).to(torch.bfloat16).float()  # bf16 rounding: many ties among distinct rows
    logits[1] = torch.randint(0, 3, (200,)).float()
    logits[2, ::2] = -0.0
    _check(logits, [200, 200, 150])


@pytest.mark.parametrize("width", [60, 400], ids=["whole-row", "sampled-candidates"])
def test_infinities_and_extreme_floats_rank_in_float_order(width):
    # keys spanning nearly all 32 bits: the select's relative keys need every digit step
    logits = _logits(2, width)
    logits[0, ::7] = float("-inf")
    logits[0, 3], logits[0, 5], logits[0, 8] = float("inf"), 3e38, -3e38
    logits[1, ::3] = -3e38
    logits[1, 1::5] = 1e-38
    _check(logits, [width, width - 3])


def test_massive_ties_overflow_the_candidate_list_and_search_the_whole_row():
    logits = torch.zeros(2, 200)  # every key is a candidate: more than cap
    logits[1, 150:] = 1.0
    _check(logits, [200, 200])


@pytest.mark.parametrize("width, sample", [(512, 32), (64, 16)],
                         ids=["row-over-several-select-blocks", "row-in-one-select-block"])
def test_a_sample_that_ranks_too_high_falls_back_to_the_whole_row(width, sample):
    # The strided sample (every 16th or 4th key) sees only the raised keys, so its threshold admits
    # fewer than k candidates.
    logits = _logits(2, width)
    logits[:, ::width // sample] += 50.0
    _check(logits, [width, width], topk.TopkConfig(block=32, sample=sample, cap=64, select_block=64))


@pytest.mark.parametrize("pair_cap", [1, 4, 128])
def test_digit_steps_go_on_until_few_enough_keys_share_the_kth_keys_digits(pair_cap):
    logits = torch.randn(4, 400).mul(4).round()  # small integers: many ties at the threshold
    logits[2] = torch.randn(400)
    logits[3] = torch.randn(400).to(torch.bfloat16).float()
    _check(logits, [400, 333, 390, 400], topk.TopkConfig(block=32, sample=64, cap=256, select_block=256,
                                                         pair_cap=pair_cap))


def _reverse_runs(lists, block):
    """Reverse the order of the blocks' runs in each row's candidate list, as GPU atomics may hand
    them out (the interpreter runs block programs in order); returns how many rows had 2+ runs."""
    shuffled = 0
    for row, count in enumerate(lists.count.tolist()):
        listed = lists.cand[row, :count].clone()
        blocks = torch.unique_consecutive(listed // block)
        runs = [listed[listed // block == b] for b in blocks.tolist()][::-1]
        start = 0
        for run in runs:
            lists.first[row, int(run[0]) // block] = start
            lists.cand[row, start:start + len(run)] = run
            start += len(run)
        shuffled += len(runs) > 1
    return shuffled


@pytest.mark.parametrize("select_block", [256, 32], ids=["one-select-block", "several-select-blocks"])
def test_block_runs_listed_in_any_order_write_positions_in_order(select_block):
    logits = torch.randn(3, 400).mul(4).round()  # small integers: many ties at the threshold
    logits[2] = torch.randn(400)
    lens = torch.tensor([400, 333, 390]).int()
    cfg = topk.TopkConfig(block=32, sample=64, cap=256, select_block=select_block)
    lists = topk.candidate_lists(logits, lens, None, K, cfg)
    assert ((lists.count >= K) & (lists.count <= cfg.cap)).all()  # selected from the lists, not whole rows
    assert _reverse_runs(lists, cfg.block) == 3
    out = torch.empty(3, K, dtype=torch.int32)
    topk.select_and_write(logits, lens, None, K, cfg, lists, out, topk.TRANSFORM_NONE, None, 1, 1, None)
    assert torch.equal(out, reference.topk_positions_ref(logits, lens, K))


def test_row_starts_shift_each_rows_range():
    logits = _logits(3, 300)
    _check(logits, [200, 100, 17], starts=torch.tensor([100, 0, 283]).int())


@pytest.mark.parametrize("config", [SMALL, None], ids=["three-launches", "default"])
def test_keys_outside_each_rows_range_are_never_read(config):
    """The engine skips the logits' -inf fill (clean_logits=False) because the top-k reads only
    each row's [start, start + length): +inf and NaN written there change nothing."""
    logits = _logits(3, 300)
    starts, lens = torch.tensor([100, 0, 283]).int(), torch.tensor([150, 100, 17]).int()
    pos = torch.arange(300)
    outside = (pos < starts[:, None]) | (pos >= (starts + lens)[:, None])
    poisoned = logits.masked_fill(outside, float("inf")).masked_fill(outside & (pos % 3 == 0), float("nan"))
    out = topk.topk_transform(poisoned, lens, K, row_starts=starts, config=config)
    assert torch.equal(out, reference.topk_positions_ref(logits, lens, K, starts))


def test_k_larger_than_context_returns_every_position_then_minus_one():
    logits = _logits(1, 8)
    out = topk.topk_transform(logits, torch.tensor([5]).int(), K, config=SMALL)
    assert out[0].tolist() == [0, 1, 2, 3, 4] + [-1] * (K - 5)


def test_paged_transform_maps_positions_to_slots_through_the_block_table():
    page, next_n = 8, 2
    lengths = torch.tensor([70, 69, 13, 12, 0, 0]).int()  # not multiples of the page size
    logits = _logits(6, 72)
    table = torch.randperm(40)[:30].view(3, 10).int()
    out = topk.topk_transform(logits, lengths, K, topk.TRANSFORM_PAGED, block_table=table, page_size=page,
                              next_n=next_n, config=SMALL)
    pos = reference.topk_positions_ref(logits, lengths, K)
    assert torch.equal(out, reference.paged_transform_ref(pos, table, page, next_n))


def test_ragged_transform_adds_each_tokens_offset():
    logits = _logits(5, 120)
    starts = torch.tensor([0, 0, 40, 40, 40]).int()
    lengths = torch.tensor([1, 40, 1, K, 80]).int()
    offsets = starts + 1000
    out = topk.topk_transform(logits, lengths, K, topk.TRANSFORM_RAGGED, row_starts=starts, offsets=offsets,
                              config=SMALL)
    pos = reference.topk_positions_ref(logits, lengths, K, starts)
    assert torch.equal(out, reference.ragged_transform_ref(pos, offsets))


@pytest.mark.parametrize("config", [SMALL, None], ids=["three-launches", "one-launch"])
def test_rows_ranking_one_request_among_many_size_the_launch_by_the_longest(config):
    # a prefill piece: requests' keys side by side in 600 columns, each row ranking its own request's
    logits = _logits(5, 600)
    starts = torch.tensor([0, 0, 150, 300, 450]).int()
    lengths = torch.tensor([150, 70, 150, 1, 129]).int()
    offsets = torch.zeros(5, dtype=torch.int32)
    out = topk.topk_transform(logits, lengths, K, topk.TRANSFORM_RAGGED, row_starts=starts, offsets=offsets,
                              config=config, max_length=150)
    assert torch.equal(out, reference.topk_positions_ref(logits, lengths, K, starts))


def test_reference_ragged_transform_without_offsets_raises():
    with pytest.raises(RuntimeError, match="offsets"):
        reference.ragged_transform_ref(torch.zeros(1, K, dtype=torch.int32), None)


@pytest.mark.parametrize("rows, width, block", [(1, 131072, 1024), (1, 32768, 1024), (32, 131072, 2048),
                                               (128, 32768, 2048), (8, 32768, 1024)])
def test_default_tiling_shrinks_blocks_only_while_the_grid_is_small(rows, width, block):
    cfg = topk.topk_config(rows, width, 2048, num_sms=132)
    assert cfg.block == block and cfg.cap >= 2 * 2048


def test_configs_the_select_cannot_run_are_refused():
    with pytest.raises(ValueError, match="cap"):
        topk.TopkConfig(block=32, sample=64, cap=32, select_block=64)
    with pytest.raises(ValueError, match="pair_cap"):
        topk.TopkConfig(block=32, sample=64, cap=64, select_block=64, pair_cap=96)


def test_sample_size_follows_row_length_and_row_count():
    assert topk.topk_config(32, 131072, 2048, 132).sample == 8192
    assert topk.topk_config(1, 131072, 2048, 132).sample == 4096  # one rare slow row costs less than the sample
    assert topk.topk_config(128, 65536, 2048, 132).sample == 4096
    assert topk.topk_config(128, 32768, 2048, 132).sample == 2048  # a wider margin at 32K still fits the select


@pytest.mark.gpu
def test_realistic_rows_match_the_reference_on_cuda():
    # batch 4 at 128K keys, k 2048: bf16-rounded randn (ties), a massive-tie row (whole-row
    # fallback), a length off every block and page boundary, a row no longer than k.
    k, width = 2048, 131072
    logits = torch.randn(4, width, device="cuda").to(torch.bfloat16).float()
    logits[1] = torch.randint(0, 8, (width,), device="cuda").float()
    lens = torch.tensor([width, width, 100_003, 2000], device="cuda", dtype=torch.int32)
    starts = torch.tensor([0, 0, 31_000, 7], device="cuda", dtype=torch.int32)
    pos = reference.topk_positions_ref(logits, lens, k, starts)
    got = topk.topk_transform(logits, lens, k, row_starts=starts)
    assert torch.equal(got, pos)
    table = torch.randperm(4 * width // 64, device="cuda").view(4, -1).int()
    got = topk.topk_transform(logits, lens, k, topk.TRANSFORM_PAGED, row_starts=starts, block_table=table, page_size=64)
    assert torch.equal(got, reference.paged_transform_ref(pos, table, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width", [(1, 32768), (128, 131072)])
def test_default_tiling_matches_the_reference_on_cuda(rows, width):
    logits = torch.randn(rows, width, device="cuda")
    lens = torch.full((rows,), width, device="cuda", dtype=torch.int32)
    lens[::3] -= torch.arange(0, rows, 3, device="cuda", dtype=torch.int32) * 97
    assert torch.equal(topk.topk_transform(logits, lens, 2048), reference.topk_positions_ref(logits, lens, 2048))
