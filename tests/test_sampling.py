"""Specification of dsa_backend.sampling: one behaviour per test."""

from __future__ import annotations


import pytest
import torch

from dsa_backend.sampling import (
    SamplingBatch, SamplingRow, make_generator, process_logits, sample, truncate_logits)
from dsa_backend.sampling_params import SamplingParams

EOS = 7
VOCAB = 10


def row(prompt=(), output=(), generator=None, **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(prompt), list(output), generator)


def build(*rows: SamplingRow, vocab: int = VOCAB, device: str = "cpu") -> SamplingBatch:
    return SamplingBatch.build(rows, vocab_size=vocab, eos_token_ids={EOS}, device=device)


def support(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).nonzero().squeeze(1).tolist())


def logits_of(probs: list[float]) -> torch.Tensor:
    """A [1, len(probs)] logits row whose softmax is `probs`."""
    return torch.tensor([probs]).log()


# Greedy


def test_greedy_picks_the_largest_logit_of_each_row():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    out = sample(logits, build(*[row(temperature=0)] * 4, vocab=50))
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))
    assert out.token_ids.dtype == torch.int64


def test_greedy_ties_go_to_the_lowest_token_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 3.0]])
    assert sample(logits, build(row(temperature=0), vocab=5)).token_ids.tolist() == [1]


def test_greedy_row_gives_the_same_token_and_logprob_alone_and_in_a_batch_of_32():
    gen = torch.Generator().manual_seed(1)
    vocab = 1000
    target = torch.randn(1, vocab, generator=gen).round(decimals=1)  # rounding makes near-ties
    target_row = row(prompt=[5, 6], output=[7], temperature=0, repetition_penalty=1.3,
                     logprobs=True)
    alone = sample(target, build(target_row, vocab=vocab))

    others = [row(output=[i], temperature=0.1 * (i % 5), top_k=i, top_p=0.9, min_p=0.01 * i,
                  frequency_penalty=0.5, bad_words_ids=[[i]], generator=make_generator(i, "cpu"))
              for i in range(31)]
    logits = torch.randn(32, vocab, generator=gen)
    logits[17] = target[0]
    batched = sample(logits, build(*others[:17], target_row, *others[17:], vocab=vocab))

    assert batched.token_ids[17] == alone.token_ids[0]
    assert torch.equal(batched.logprobs.chosen[17], alone.logprobs.chosen[0])


def test_greedy_rows_draw_no_random_numbers():
    engine = torch.Generator().manual_seed(0)
    own = make_generator(3, "cpu")
    engine_state, own_state = engine.get_state(), own.get_state()
    batch = build(row(temperature=0), row(temperature=0, seed=3, generator=own))
    sample(torch.randn(2, VOCAB), batch, generator=engine)
    assert torch.equal(engine.get_state(), engine_state)
    assert torch.equal(own.get_state(), own_state)


# Temperature and truncation


def test_sampled_frequencies_match_softmax_of_logits_over_temperature():
    n, temperature = 40_000, 2.0
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    batch = build(*[row(temperature=temperature)] * n, vocab=4)
    tokens = sample(logits.expand(n, 4), batch, torch.Generator().manual_seed(0)).token_ids
    observed = torch.bincount(tokens, minlength=4) / n
    expected = (logits[0] / temperature).softmax(dim=-1)
    # Within 4 standard errors per token: a fair sampler fails this less than once in 10**4 runs.
    tolerance = 4 * (expected * (1 - expected) / n).sqrt()
    assert ((observed - expected).abs() <= tolerance).all(), (observed, expected)


def test_a_vanishing_temperature_samples_the_argmax_without_overflow():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]] * 8)
    batch = build(*[row(temperature=1e-40)] * 8, vocab=4)
    assert sample(logits, batch, torch.Generator().manual_seed(0)).token_ids.tolist() == [1] * 8


def test_top_k_keeps_the_k_largest_logits_and_breaks_ties_by_lowest_id():
    logits = torch.tensor([[1.0, 5.0, 3.0, 5.0, 3.0, 0.0]])
    kept = truncate_logits(logits, build(row(top_k=3), vocab=6))
    assert support(kept[0]) == {1, 2, 3}
    assert torch.equal(kept[0, [1, 2, 3]], logits[0, [1, 2, 3]])


def test_top_p_keeps_the_smallest_prefix_whose_probability_reaches_top_p():
    logits = logits_of([0.125, 0.5, 0.125, 0.25])
    expected = {0.4: {1}, 0.7: {1, 3}, 0.8: {1, 3, 0}, 1.0: {0, 1, 2, 3}}
    for top_p, kept in expected.items():
        assert support(truncate_logits(logits, build(row(top_p=top_p), vocab=4))[0]) == kept


def test_top_p_measures_the_distribution_left_by_top_k():
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    # After top_k=2 the probabilities are 4/7 and 3/7, so 4/7 alone reaches top_p=0.5.
    kept = truncate_logits(logits, build(row(top_k=2, top_p=0.5), vocab=4))
    assert support(kept[0]) == {0}


def test_min_p_keeps_tokens_with_probability_at_least_min_p_times_the_largest():
    logits = logits_of([0.3, 0.5, 0.15, 0.05])
    kept = truncate_logits(logits, build(row(min_p=0.25), vocab=4))
    assert support(kept[0]) == {0, 1, 2}


def test_filters_see_temperature_scaled_probabilities():
    # At temperature 0.5 the probabilities go as p**2: 0.25, 0.09, 0.0225, 0.0025, so min_p=0.25
    # keeps tokens 0 and 1 only (at temperature 1 it would keep token 2 too).
    n = 2000
    logits = logits_of([0.5, 0.3, 0.15, 0.05]).expand(n, 4)
    batch = build(*[row(temperature=0.5, min_p=0.25)] * n, vocab=4)
    tokens = sample(logits, batch, torch.Generator().manual_seed(0)).token_ids
    assert set(tokens.tolist()) == {0, 1}


# Penalties


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    batch = build(row(prompt=[0], output=[1], repetition_penalty=2.0), vocab=5)
    assert process_logits(logits, batch).tolist() == [[1.0, -4.0, 2.0, -2.0, 1.0]]


def test_frequency_penalty_subtracts_once_per_occurrence_in_the_output():
    batch = build(row(prompt=[2, 2], output=[0, 0, 1], frequency_penalty=0.5), vocab=5)
    assert process_logits(torch.zeros(1, 5), batch).tolist() == [[-1.0, -0.5, 0.0, 0.0, 0.0]]


def test_presence_penalty_subtracts_once_per_distinct_output_token():
    batch = build(row(prompt=[3], output=[0, 0, 1], presence_penalty=0.5), vocab=5)
    assert process_logits(torch.zeros(1, 5), batch).tolist() == [[-0.5, -0.5, 0.0, 0.0, 0.0]]


def test_repetition_penalty_applies_before_frequency_and_presence():
    logits = torch.tensor([[2.0, -2.0, 0.0]])
    batch = build(row(output=[0, 0, 1], repetition_penalty=2.0, frequency_penalty=0.25,
                      presence_penalty=0.5), vocab=3)
    # token 0: 2 / 2 - 2 * 0.25 - 0.5; token 1: -2 * 2 - 0.25 - 0.5
    assert process_logits(logits, batch).tolist() == [[0.0, -4.75, 0.0]]


def test_penalties_leave_rows_without_penalties_untouched():
    logits = torch.randn(2, VOCAB)
    batch = build(row(output=[1, 2], frequency_penalty=1.0), row(prompt=[1], output=[1, 2]))
    assert torch.equal(process_logits(logits, batch)[1], logits[1])


# Bans


def test_min_tokens_bans_eos_and_stop_token_ids_until_reached():
    params = dict(min_tokens=3, stop_token_ids=[5])
    early = process_logits(torch.zeros(1, VOCAB), build(row(output=[1, 2], **params)))
    assert support(early[0]) == set(range(VOCAB)) - {5, EOS}
    reached = process_logits(torch.zeros(1, VOCAB), build(row(output=[1, 2, 3], **params)))
    assert support(reached[0]) == set(range(VOCAB))


def test_min_tokens_leaves_eos_allowed_when_eos_is_ignored():
    batch = build(row(output=[], min_tokens=2, stop_token_ids=[5], ignore_eos=True))
    assert support(process_logits(torch.zeros(1, VOCAB), batch)[0]) == set(range(VOCAB)) - {5}


def test_greedy_skips_a_banned_eos_for_the_next_best_token():
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 4] = 9.0, 8.0
    out = sample(logits, build(row(temperature=0, min_tokens=1)))
    assert out.token_ids.tolist() == [4]


def test_single_token_bad_word_is_always_banned():
    batch = build(row(prompt=[1], output=[2, 3], bad_words_ids=[[3]]))
    assert support(process_logits(torch.zeros(1, VOCAB), batch)[0]) == set(range(VOCAB)) - {3}


@pytest.mark.parametrize("prompt, output, banned", [
    ([0], [1, 2], True),   # the context ends with the prefix 1, 2
    ([1], [2], True),      # the prefix may span prompt and output
    ([], [1, 2, 0], False),
    ([0], [2], False),
    ([], [2], False),      # context shorter than the prefix
])
def test_multi_token_bad_word_bans_its_last_token_only_after_its_prefix(prompt, output, banned):
    batch = build(row(prompt=prompt, output=output, bad_words_ids=[[1, 2, 4]]))
    allowed = support(process_logits(torch.zeros(1, VOCAB), batch)[0])
    assert allowed == set(range(VOCAB)) - ({4} if banned else set())


# Output tokens not read back yet (overlap scheduling): -1 - i names pending[i]


def test_unread_output_tokens_are_penalized_and_counted_as_the_tokens_they_name():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5))
    params = [dict(repetition_penalty=1.5, frequency_penalty=0.7, presence_penalty=0.3),
              dict(min_tokens=3, stop_token_ids=[4]), dict(frequency_penalty=1.0)]
    known = [row((1, 2), (3, 5, 5), **params[0]), row((1,), (2, 6), **params[1]), row((8,), (9,), **params[2])]
    pending = torch.tensor([0, 5, 6])  # the last step's tokens; rows name entries 1 and 2
    unread = [row((1, 2), (3, 5, -2), **params[0]), row((1,), (2, -3), **params[1]), row((8,), (9,), **params[2])]
    want = process_logits(logits, build(*known))
    got = process_logits(logits, SamplingBatch.build(unread, VOCAB, {EOS}, "cpu", pending=pending))
    assert torch.equal(got, want)
    assert got[1, 4] == -float("inf")  # two outputs with the unread one, below min_tokens 3


def test_a_bad_word_is_never_matched_against_output_tokens_not_read_back():
    with pytest.raises(RuntimeError, match="not read back"):
        SamplingBatch.build([row((1,), (2, -1), bad_words_ids=[[2, 3, 4]])], VOCAB, {EOS}, "cpu",
                            pending=torch.tensor([3]))


def test_logit_bias_is_added_before_the_repetition_penalty_and_only_to_its_rows():
    logits = torch.tensor([[2.0, -2.0, 0.0], [2.0, -2.0, 0.0]])
    batch = build(row(output=[0], repetition_penalty=2.0, logit_bias={"0": 2.0, 2: -1.5}), row(), vocab=3)
    # token 0: (2 + 2) / 2 (seen); token 2: 0 - 1.5
    assert process_logits(logits, batch).tolist() == [[2.0, -2.0, -1.5], [2.0, -2.0, 0.0]]


def test_a_logit_bias_of_100_makes_greedy_pick_its_token():
    logits = torch.tensor([[5.0, 0.0, -3.0, 1.0]])
    assert sample(logits, build(row(temperature=0, logit_bias={2: 100}), vocab=4)).token_ids.tolist() == [2]


@pytest.mark.parametrize("bias, message", [({"x": 1}, "map token ids"), ({1: 101}, r"\[-100, 100\]"),
                                           ([(1, 1), (1, 2)], "twice")])
def test_bad_logit_bias_is_refused_naming_it(bias, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(logit_bias=bias)


def test_logit_bias_outside_the_vocabulary_is_rejected():
    with pytest.raises(ValueError, match="logit_bias"):
        build(row(logit_bias={VOCAB: 1.0}))


def test_bad_word_outside_the_vocabulary_is_rejected():
    with pytest.raises(ValueError, match="bad_words_ids"):
        build(row(bad_words_ids=[[1, VOCAB]]))


# Seeds


def seeded_run(seed: int, steps: list[torch.Tensor], position: int, others: list[dict],
               engine_seed: int = 0) -> list[int]:
    """Sample `steps` logits rows for one seeded request placed at `position` among `others`."""
    target = make_generator(seed, "cpu")
    engine = torch.Generator().manual_seed(engine_seed)
    other_gens = [make_generator(o.get("seed"), "cpu") for o in others]
    tokens = []
    for step_logits in steps:
        rows = [row(generator=g, **o) for o, g in zip(others, other_gens)]
        rows.insert(position, row(temperature=0.9, top_k=40, top_p=0.95, seed=seed,
                                  generator=target))
        logits = torch.randn(len(rows), step_logits.shape[0])
        logits[position] = step_logits
        out = sample(logits, build(*rows, vocab=step_logits.shape[0]), engine)
        tokens.append(out.token_ids[position].item())
    return tokens


def test_seeded_request_repeats_its_tokens_whatever_the_batch_order_and_other_seeds():
    steps = list(torch.randn(8, 100, generator=torch.Generator().manual_seed(2)))
    alone = seeded_run(1234, steps, 0, [])
    mixed = [dict(seed=5), dict(temperature=0), dict(temperature=1.5), dict(seed=6, top_p=0.5)]
    assert seeded_run(1234, steps, 2, mixed) == alone
    assert seeded_run(1234, steps, 4, mixed[::-1], engine_seed=9) == alone
    assert seeded_run(1234, steps, 1, [dict(seed=s) for s in range(31)]) == alone


def test_different_seeds_give_different_tokens():
    steps = list(torch.randn(8, 100, generator=torch.Generator().manual_seed(2)))
    assert seeded_run(1, steps, 0, []) != seeded_run(2, steps, 0, [])


def test_unseeded_rows_follow_the_engine_generator():
    logits = torch.randn(4, VOCAB)
    batch = build(*[row(temperature=1.0)] * 4)
    first = sample(logits, batch, torch.Generator().manual_seed(3)).token_ids
    again = sample(logits, batch, torch.Generator().manual_seed(3)).token_ids
    assert torch.equal(first, again)


# Logprobs and the interface


def test_logprobs_are_log_softmax_of_the_penalized_logits_at_the_chosen_token():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4))
    batch = build(row(prompt=[3], temperature=0, repetition_penalty=2.0, logprobs=True),
                  row(prompt=[3], temperature=0.7, repetition_penalty=2.0, logprobs=True))
    out = sample(logits, batch, torch.Generator().manual_seed(0))
    penalized = logits.clone()
    penalized[:, 3] = torch.where(logits[:, 3] > 0, logits[:, 3] / 2, logits[:, 3] * 2)
    expected = penalized.log_softmax(dim=-1).gather(1, out.token_ids.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out.logprobs.chosen, expected)
    assert out.logprobs.chosen.dtype == torch.float32 and out.logprobs.top_values is None


def test_top_logprobs_are_each_rows_largest_penalized_logprobs_to_the_batchs_largest_count():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(5))
    batch = build(row(prompt=[3], temperature=0, repetition_penalty=2.0, top_logprobs=3), row(top_logprobs=1))
    out = sample(logits, batch, torch.Generator().manual_seed(0))
    penalized = logits.clone()
    penalized[0, 3] = penalized[0, 3] / 2 if penalized[0, 3] > 0 else penalized[0, 3] * 2
    values, ids = penalized.log_softmax(dim=-1).topk(3, dim=-1)
    torch.testing.assert_close(out.logprobs.top_values, values)
    assert torch.equal(out.logprobs.top_ids, ids)


def test_logprobs_are_none_when_no_row_asks_for_them():
    assert sample(torch.randn(1, VOCAB), build(row())).logprobs is None


def test_sample_leaves_the_callers_logits_unchanged():
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    sample(logits, build(row(output=[1], repetition_penalty=1.5, top_k=3, min_tokens=2),
                         row(temperature=0, bad_words_ids=[[2]])))
    assert torch.equal(logits, before)


def test_logits_that_do_not_match_the_batch_are_rejected():
    with pytest.raises(ValueError, match="logits must be"):
        sample(torch.randn(2, VOCAB), build(row()))


def test_make_generator_returns_none_without_a_seed():
    assert make_generator(None, "cpu") is None
    a, b = make_generator(7, "cpu"), make_generator(7, "cpu")
    assert torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=b))


@pytest.mark.gpu
def test_seeded_and_greedy_rows_are_batch_invariant_on_cuda():
    vocab = 129_280
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(vocab, generator=gen)
    target_row = dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, repetition_penalty=1.1)

    def run(position: int, batch_size: int) -> tuple[int, int]:
        rows = [row(output=[i], temperature=0.1 * (i % 3), generator=make_generator(i, "cuda"),
                    seed=i) for i in range(batch_size - 1)]
        rows.insert(position, row(output=[3], generator=make_generator(42, "cuda"), seed=42,
                                  **target_row))
        rows.insert(position + 1, row(output=[3], temperature=0))
        logits = torch.randn(batch_size + 1, vocab, generator=gen)
        logits[position] = logits[position + 1] = target
        tokens = sample(logits.cuda(), build(*rows, vocab=vocab, device="cuda")).token_ids
        return tokens[position].item(), tokens[position + 1].item()

    alone = run(0, 1)
    assert all(run(p, n) == alone for p, n in [(0, 8), (5, 32), (100, 256)])


# What reads the output so far (the engine copies a verified node's path into it only then)

@pytest.mark.parametrize("params", [dict(), dict(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, seed=1),
                                    dict(stop_token_ids=[3], max_tokens=8)])
def test_params_that_do_not_read_the_output_process_logits_alike_for_any_output(params):
    assert not SamplingParams(**params).reads_output
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
    processed = [process_logits(logits, build(row([1, 2], output, **params))) for output in ([], [3, 4, 5, 3])]
    assert torch.equal(*processed)


@pytest.mark.parametrize("params", [dict(min_tokens=2, stop_token_ids=[3]), dict(bad_words_ids=[[4, 3]]),
                                    dict(repetition_penalty=1.5), dict(frequency_penalty=1.0),
                                    dict(presence_penalty=1.0)])
def test_params_that_read_the_output_say_so(params):
    assert SamplingParams(max_tokens=8, **params).reads_output
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
    processed = [process_logits(logits, build(row([1, 2], output, max_tokens=8, **params)))
                 for output in ([], [5, 4, 3, 4])]
    assert not torch.equal(*processed)
