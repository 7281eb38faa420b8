"""SamplingParams.prompt_logprobs: each prompt token's logprob, against transformers' own models,
through chunked prefill, the prefix cache, retraction and n samples."""

from __future__ import annotations

import functools

import pytest
import torch

from checkpoints import random_prompts
from dsa_backend import LLM, SamplingParams
from dsa_backend.cache import PageAllocator
from dsa_backend.scheduler import Scheduler
from dsa_backend.sequence import Sequence

LENGTHS = (1, 20, 70)     # 70 is longer than the tiny preset's index_topk of 32: sparse attention
SCORE = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=True)
ATOL = 2e-4               # float32; logits agree with transformers to 1e-4 (tests/test_models.py)


def engine(path, **kw) -> LLM:
    return LLM(path, device="cpu", dtype="float32", page_size=16, **kw)


@functools.cache
def transformers_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def transformers_prompt_logprobs(path, prompt: list[int]) -> list[float | None]:
    logprobs = transformers_model(path)(torch.tensor([prompt])).logits[0].float().log_softmax(dim=-1)
    return [None] + logprobs[:-1].gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1).tolist()


def assert_close(got: list[float | None], expected: list[float | None]) -> None:
    assert len(got) == len(expected) and got[0] is None and expected[0] is None
    torch.testing.assert_close(torch.tensor(got[1:]), torch.tensor(expected[1:]), rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("chunk", [16, 2048], ids=["chunked", "whole"])
def test_prompt_logprobs_are_transformers_log_softmax_at_the_position_before(checkpoint, name, chunk):
    path = checkpoint(name)
    prompts = random_prompts(LENGTHS, seed=31)
    outputs = engine(path, max_num_batched_tokens=chunk).generate(prompts, SCORE)
    for prompt, out in zip(prompts, outputs):
        assert_close(out.prompt_logprobs, transformers_prompt_logprobs(path, prompt))


def test_only_requests_that_ask_get_prompt_logprobs(checkpoint):
    prompt = random_prompts([20], seed=32)[0]
    (out,) = engine(checkpoint("glm_moe_dsa")).generate([prompt], SamplingParams(max_tokens=2, logprobs=True))
    assert out.prompt_logprobs is None and len(out.logprobs) == 2


def test_a_cached_prompt_is_computed_again_for_its_logprobs_and_cached_after(checkpoint):
    llm = engine(checkpoint("glm_moe_dsa"))
    prompt = random_prompts([70], seed=33)[0]
    plain = SamplingParams(max_tokens=1, temperature=0)
    assert llm.generate([prompt], plain)[0].num_cached_tokens == 0
    scored = llm.generate([prompt], SCORE)[0]
    assert scored.num_cached_tokens == 0            # the cache skips the positions they come from
    assert_close(scored.prompt_logprobs, engine(checkpoint("glm_moe_dsa")).generate([prompt], SCORE)[0].prompt_logprobs)
    assert llm.generate([prompt], plain)[0].num_cached_tokens == 64


def test_a_retracted_request_takes_each_prompt_logprob_once(checkpoint):
    path = checkpoint("glm_moe_dsa")
    prompts = random_prompts([30, 40, 35, 45, 38, 33], seed=34)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, prompt_logprobs=True)
    roomy = engine(path).generate(prompts, params)
    small = engine(path, num_kv_pages=6, max_num_batched_tokens=16)      # 96 slots for ~6 x 60 tokens
    squeezed = small.generate(prompts, params)
    assert small.engine.scheduler.num_retractions > 0
    for a, b in zip(squeezed, roomy):
        assert a.token_ids == b.token_ids
        assert_close(a.prompt_logprobs, b.prompt_logprobs)


def test_n_samples_compute_the_prompt_logprobs_once_on_the_first(checkpoint):
    prompt = random_prompts([70], seed=35)[0]
    outs = engine(checkpoint("glm_moe_dsa")).generate(
        [prompt], SamplingParams(max_tokens=4, temperature=1.0, seed=7, n=3, prompt_logprobs=True))
    assert [o.index for o in outs] == [0, 1, 2]
    assert len(outs[0].prompt_logprobs) == 70 and outs[1].prompt_logprobs is None is outs[2].prompt_logprobs
    assert outs[0].num_cached_tokens == 0 and outs[1].num_cached_tokens == outs[2].num_cached_tokens == 64


def test_the_prefix_cache_stands_in_only_for_positions_whose_logprobs_are_taken():
    s = Scheduler(PageAllocator(32), page_size=4, max_running=8, max_batched_tokens=64, prefix_caching=True)
    first = Sequence("r0", list(range(20)), SamplingParams(max_tokens=4), arrival=0)
    s.add(first)
    (chunk,) = s.schedule()
    first.num_computed += chunk.num_tokens
    s.finish(first, "stop")                             # its five pages stay cached
    scored = Sequence("r1", list(range(20)), SamplingParams(max_tokens=4, prompt_logprobs=True), arrival=1)
    scored.num_prompt_logprobs = 9                       # as if retracted after taking tokens 1 .. 9
    s.add(scored)
    (chunk,) = s.schedule()
    assert (chunk.start, chunk.num_tokens) == (8, 12)    # two whole pages hold positions 0 .. 7


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa"])
def test_prompt_logprobs_on_the_gpu_agree_with_transformers_whole_and_chunked(checkpoint, name):
    # float32 on the GPU (graphs, overlap, copies behind the steps), prompts of at most index_topk
    # tokens: every key is selected however the FP8 indexer keys score them, as in transformers
    path = checkpoint(name)
    prompts = random_prompts((1, 20, 32), seed=36)
    for chunk in (16, 2048):
        with LLM(path, device="cuda", dtype="float32", page_size=16, num_kv_pages=64,
                 max_num_batched_tokens=chunk) as llm:
            outputs = llm.generate(prompts, SCORE)
        for prompt, out in zip(prompts, outputs):
            expected = transformers_prompt_logprobs(path, prompt)
            assert len(out.prompt_logprobs) == len(prompt)
            torch.testing.assert_close(torch.tensor(out.prompt_logprobs[1:]), torch.tensor(expected[1:]),
                                       rtol=0, atol=1e-3)
