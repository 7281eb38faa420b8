"""The penalties' counts kept on the device across steps (dsa_backend.token_counts): always equal to
counting the request's lists afresh, whatever slots were reused, and the engine's tokens equal."""

from __future__ import annotations

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend.engine import Engine, EngineArgs
from dsa_backend.sampling import SamplingBatch, SamplingRow
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.token_counts import TokenCounts
from test_overlap import run_all, summary

VOCAB = 12


def counted(tokens: list[int]) -> list[float]:
    return torch.bincount(torch.tensor(tokens, dtype=torch.int64), minlength=VOCAB).float().tolist()


def seen(tokens: list[int]) -> list[bool]:
    return [c > 0 for c in counted(tokens)]


def check(got, prompts, outputs):
    assert got.in_prompt.tolist() == [seen(p) for p in prompts]
    assert got.output_counts.tolist() == [counted(o) for o in outputs]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_counts_kept_across_steps_equal_counts_of_the_whole_lists(device):
    gen = torch.Generator().manual_seed(0)
    counts = TokenCounts(4, VOCAB, device)
    prompts = {k: torch.randint(0, VOCAB, (n,), generator=gen).tolist() for k, n in zip("abc", (5, 1, 9))}
    outputs = {k: [] for k in "abc"}
    for step in range(12):
        keys = ["a", "b", "c"] if step % 3 else ["c", "a"]  # b sits some steps out
        for k in keys:
            outputs[k] += torch.randint(0, VOCAB, (1 + step % 2,), generator=gen).tolist()
        got = counts.rows(keys + [None], [prompts[k] for k in keys] + [[3, 4]],
                          [outputs[k] for k in keys] + [[3]])
        check(got, [prompts[k] for k in keys] + [[]], [outputs[k] for k in keys] + [[]])


def test_a_request_that_lost_its_slot_is_rebuilt_from_its_lists():
    counts = TokenCounts(2, VOCAB, "cpu")
    prompts = {"a": [1, 1, 2], "b": [3], "c": [4, 5]}
    outputs = {"a": [6], "b": [7], "c": [8]}
    for keys in (["a", "b"], ["c"], ["c", "b"], ["a"]):  # c takes a's slot, then a takes c's
        for k in keys:
            outputs[k].append(len(outputs[k]) % VOCAB)
        check(counts.rows(keys, [prompts[k] for k in keys], [outputs[k] for k in keys]),
              [prompts[k] for k in keys], [outputs[k] for k in keys])


def test_a_rows_tokens_past_its_requests_shared_output_count_for_that_row_alone():
    counts = TokenCounts(2, VOCAB, "cpu")
    prompt = [0]
    tree_rows = [[1, 2], [1, 2, 3], [1, 2, 4, 4]]  # a tree's root and two nodes' paths
    check(counts.rows(["a"] * 3, [prompt] * 3, tree_rows), [prompt] * 3, tree_rows)
    # the second node's path was accepted: 3 counts nowhere, 4 twice
    check(counts.rows(["a"], [prompt], [[1, 2, 4, 4]]), [prompt], [[1, 2, 4, 4]])


def test_unread_tokens_count_as_the_pending_tokens_they_name():
    counts = TokenCounts(2, VOCAB, "cpu")
    pending = torch.tensor([9, 7])
    got = counts.rows(["a", "b"], [[0], [0]], [[5, -2], [-1, -1]], pending)
    check(got, [[0], [0]], [[5, 7], [9, 9]])
    # read back since: the next step sees them as tokens and one new placeholder
    got = counts.rows(["a"], [[0]], [[5, 7, -1]], torch.tensor([5]))
    check(got, [[0]], [[5, 7, 5]])


def test_an_output_shorter_than_its_slot_counted_rebuilds_the_slot():
    counts = TokenCounts(1, VOCAB, "cpu")
    counts.rows(["a"], [[1]], [[2, 3, 4]])
    check(counts.rows(["a"], [[5]], [[6]]), [[5]], [[6]])


def test_more_requests_with_penalties_than_slots_in_one_step_is_an_error():
    counts = TokenCounts(2, VOCAB, "cpu")
    with pytest.raises(RuntimeError, match="3 requests with penalties in one step.*2"):
        counts.rows(["a", "b", "c"], [[1]] * 3, [[]] * 3)


def test_rows_with_penalties_need_keys_when_counts_are_kept():
    row = SamplingRow(SamplingParams(repetition_penalty=1.2), [1], [2])
    with pytest.raises(ValueError, match="need a key"):
        SamplingBatch.build([row], VOCAB, {0}, "cpu", counts=TokenCounts(2, VOCAB, "cpu"))


@pytest.fixture(scope="module")
def path(checkpoint):
    return checkpoint("deepseek_v32")


def penalized_requests() -> dict:
    # A tiny random model hardly repeats a token: penalties below 1 and below 0 make it, so that
    # wrong counts show in the tokens.
    prompts = random_prompts([9, 40, 17, 25, 6], seed=53)
    params = [SamplingParams(max_tokens=9, temperature=0, repetition_penalty=0.3, ignore_eos=True, logprobs=True),
              SamplingParams(max_tokens=6, temperature=0, frequency_penalty=-2.0, presence_penalty=-2.0, ignore_eos=True),
              SamplingParams(max_tokens=11, temperature=0.7, seed=3, repetition_penalty=0.2, frequency_penalty=-1.0,
                             ignore_eos=True, logprobs=True),
              SamplingParams(max_tokens=7, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0, repetition_penalty=1.5, presence_penalty=-2.0, ignore_eos=True)]
    return {f"r{i}": (p, sp) for i, (p, sp) in enumerate(zip(prompts, params))}


@pytest.mark.parametrize("spec", [dict(overlap_schedule=True), dict(overlap_schedule=False),
                                  dict(speculative_algorithm="eagle", speculative_num_steps=2,
                                       speculative_eagle_topk=2)], ids=["overlap", "sync", "tree"])
def test_engine_with_counts_kept_gives_the_tokens_of_counts_rebuilt_every_step(path, spec):
    # Two running requests, so the two slots are reused as requests end and others start.
    def engine(kept: bool) -> Engine:
        e = Engine(EngineArgs(model=str(path), device="cpu", dtype="float32", page_size=16,
                              max_running_requests=2, max_num_batched_tokens=32, **spec))
        if not kept:
            e.token_counts = None  # SamplingBatch.build counts every row's lists afresh
        return e

    want = summary(run_all(engine(False), penalized_requests()))
    assert summary(run_all(engine(True), penalized_requests())) == want
    plain = {rid: (p, SamplingParams(max_tokens=sp.max_tokens, temperature=sp.temperature, seed=sp.seed,
                                     ignore_eos=True)) for rid, (p, sp) in penalized_requests().items()}
    unpenalized = summary(run_all(engine(True), plain))
    assert sum(want[rid] != unpenalized[rid] for rid in want) >= 3  # the penalties did change tokens
