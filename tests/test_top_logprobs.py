"""SamplingParams.top_logprobs: the most likely tokens at each output position, the same through
plain steps, overlap scheduling and speculative decoding (chains and trees)."""

from __future__ import annotations

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend import LLM, SamplingParams

PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)


def generate(path, **engine_args):
    return LLM(path, device="cpu", dtype="float32", page_size=16, **engine_args).generate(
        random_prompts([20, 40], seed=41), PARAMS)


def test_greedy_tokens_are_the_first_of_their_top_logprobs(checkpoint):
    for out in generate(checkpoint("glm_moe_dsa")):
        assert len(out.top_logprobs) == len(out.token_ids) == 6
        for token, logprob, top in zip(out.token_ids, out.logprobs, out.top_logprobs):
            assert len(top) == 3 and top[0][0] == token and top[0][1] == pytest.approx(logprob, abs=1e-6)
            assert top[0][1] >= top[1][1] >= top[2][1]


@pytest.mark.parametrize("engine_args", [dict(overlap_schedule=False),
                                         dict(speculative_algorithm="mtp", speculative_num_steps=2),
                                         dict(speculative_algorithm="eagle", speculative_num_steps=2,
                                              speculative_eagle_topk=2, speculative_num_draft_tokens=4)],
                         ids=["no-overlap", "mtp-chain", "eagle-tree"])
def test_every_step_path_gives_the_same_top_logprobs(checkpoint, engine_args):
    path = checkpoint("deepseek_v32")
    expected, got = generate(path), generate(path, **engine_args)
    for a, b in zip(got, expected):
        assert a.token_ids == b.token_ids
        assert [[t for t, _ in top] for top in a.top_logprobs] == [[t for t, _ in top] for top in b.top_logprobs]
        torch.testing.assert_close(torch.tensor([[v for _, v in top] for top in a.top_logprobs]),
                                   torch.tensor([[v for _, v in top] for top in b.top_logprobs]), rtol=0, atol=1e-4)


def test_top_logprobs_without_logprobs_and_none_unless_asked(checkpoint):
    llm = LLM(checkpoint("glm_moe_dsa"), device="cpu", dtype="float32", page_size=16)
    prompt = random_prompts([12], seed=42)[0]
    top_only, plain = llm.generate([prompt, prompt], [SamplingParams(max_tokens=2, top_logprobs=1),
                                                       SamplingParams(max_tokens=2)])
    assert top_only.logprobs is None and [len(t) for t in top_only.top_logprobs] == [1, 1]
    assert plain.top_logprobs is None


def test_top_logprobs_out_of_range_are_refused():
    with pytest.raises(ValueError, match="top_logprobs"):
        SamplingParams(top_logprobs=21)
