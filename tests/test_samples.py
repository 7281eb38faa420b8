"""n samples of one prompt (SamplingParams.n): each a request of its own, the prompt computed once."""

from __future__ import annotations

import pytest

from checkpoints import random_prompts
from dsa_backend.llm import LLM
from dsa_backend.sampling_params import MAX_SAMPLES, SamplingParams


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(checkpoint("deepseek_v32"), device="cpu", dtype="float32", page_size=16)


def test_sample_i_of_a_seeded_request_is_the_single_request_seeded_seed_plus_i(llm):
    prompt = random_prompts([40], seed=41)[0]
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=7, ignore_eos=True)
    outs = llm.generate([prompt, prompt[:20]], SamplingParams(**{**params.__dict__, "n": 4}))
    assert [(o.index, o.prompt_token_ids == prompt) for o in outs[:4]] == [(i, True) for i in range(4)]
    assert [o.index for o in outs[4:]] == [0, 1, 2, 3]
    for i in range(4):
        alone = llm.generate(prompt, SamplingParams(**{**params.__dict__, "seed": 7 + i}))[0]
        assert outs[i].token_ids == alone.token_ids
    assert len({tuple(o.token_ids) for o in outs[:4]}) > 1


def test_the_samples_compute_the_prompt_once_and_find_it_in_the_cache(llm):
    prompt = random_prompts([100], seed=42)[0]                  # six whole pages of 16 before the last token
    before = llm.engine.stats()["prefix_cache_hit_tokens"]
    outs = llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0.8, n=3, ignore_eos=True))
    assert [o.num_cached_tokens for o in outs] == [0, 96, 96]
    assert llm.engine.stats()["prefix_cache_hit_tokens"] - before == 2 * 96
    stats = llm.engine.stats()
    assert stats["kv_pages_free"] == stats["kv_pages_total"] and not llm.engine.has_work()


def test_greedy_samples_are_the_greedy_output(llm):
    prompt = random_prompts([30], seed=43)[0]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    want = llm.generate(prompt, greedy)[0].token_ids
    outs = llm.generate(prompt, SamplingParams(**{**greedy.__dict__, "n": 3}))
    assert [o.token_ids for o in outs] == [want] * 3


@pytest.mark.parametrize("n", [0, MAX_SAMPLES + 1, 2.0])
def test_a_bad_n_is_refused_naming_it(n):
    with pytest.raises(ValueError, match=r"n \(num_return_sequences\) must be an integer"):
        SamplingParams(n=n)


def test_the_engine_refuses_n_above_one_and_says_how_to_submit_it(llm):
    with pytest.raises(ValueError, match="samples"):
        llm.engine.add_request("x", [1, 2, 3], SamplingParams(n=2))


@pytest.mark.gpu
def test_samples_on_the_gpu_share_the_prompt_under_graphs_and_overlap(checkpoint):
    """bf16 with CUDA graphs and overlap scheduling: n seeded samples of a long prompt, beside
    another request; every sample runs to max_tokens, the later ones start on the first's pages."""
    llm = LLM(checkpoint("deepseek_v32"), device="cuda", num_kv_pages=128)
    prompt, other = random_prompts([700, 300], seed=44)
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
    outs = llm.generate([prompt, other], [SamplingParams(**{**params.__dict__, "n": 4}), params])
    assert [(o.index, len(o.token_ids), o.finish_reason) for o in outs] == (
        [(i, 24, "length") for i in range(4)] + [(0, 24, "length")])
    assert [o.num_cached_tokens for o in outs[:4]] == [0, 640, 640, 640]
    assert len({tuple(o.token_ids) for o in outs[:4]}) > 1
    stats = llm.engine.stats()
    assert stats["kv_pages_free"] == stats["kv_pages_total"] and not llm.engine.has_work()
