"""Greedy output does not depend on the batch: alone or among 31 others, the same tokens; and
computed whole or after a prefix found in the prefix cache, the same tokens.

On the CPU (float32) the engine's kernels already are; on a GPU in bfloat16 it takes
batch_invariant=True (dsa_kernels.batch_invariant), which patches aten's CUDA GEMMs and
reductions for the whole process, so the GPU tests here enable it deliberately.
"""

import pytest
import torch

from dsa_backend import LLM, SamplingParams

PROMPT_LENGTHS = [3, 17, 40, 64, 95, 130] * 5 + [1, 250]  # 32 prompts, several past index_topk (32)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(100, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _alone_and_batched(model, **engine_args) -> tuple[list[list[int]], list[list[int]]]:
    # A small step budget chunks the long prompts among the others but not alone. Prompts computed
    # whole: the batched run would otherwise leave their pages cached for the runs alone.
    llm = LLM(model, page_size=16, num_kv_pages=1024, max_num_batched_tokens=256, enable_prefix_caching=False,
              **engine_args)
    prompts = _prompts(llm.engine.config.vocab_size)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    batched = [out.token_ids for out in llm.generate(prompts, params)]
    alone = [llm.generate(p, params)[0].token_ids for p in prompts]
    return alone, batched


def test_greedy_tokens_alone_equal_tokens_among_31_others_on_the_cpu(checkpoint):
    # GLM's is covered through the server (tests/serving/test_server_batching.py).
    alone, batched = _alone_and_batched(checkpoint("deepseek_v32"), device="cpu")
    assert batched == alone


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_greedy_tokens_alone_equal_tokens_among_31_others_in_bfloat16_on_the_gpu(checkpoint, arch):
    alone, batched = _alone_and_batched(checkpoint(arch), device="cuda", dtype="bfloat16", batch_invariant=True)
    assert batched == alone


def _whole_and_after_cached_prefixes(model, **engine_args) -> tuple[list[list[int]], list[list[int]], int]:
    llm = LLM(model, page_size=16, num_kv_pages=1024, **engine_args)
    prompts = _prompts(llm.engine.config.vocab_size)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    whole = [out.token_ids for out in llm.generate(prompts, params)]   # one step: nothing cached yet
    again = llm.generate(prompts, params)
    # each output's own count, and the engine's total
    assert sum(out.num_cached_tokens for out in again) == llm.engine.stats()["prefix_cache_hit_tokens"]
    return whole, [out.token_ids for out in again], llm.engine.stats()["prefix_cache_hit_tokens"]


def _whole_pages_before_the_last_token(page_size: int = 16) -> int:
    return sum((n - 1) // page_size * page_size for n in PROMPT_LENGTHS)


def test_greedy_tokens_after_cached_prefixes_equal_the_whole_prefills_on_the_cpu(checkpoint):
    whole, again, hits = _whole_and_after_cached_prefixes(checkpoint("deepseek_v32"), device="cpu")
    assert again == whole and hits == _whole_pages_before_the_last_token()


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_greedy_tokens_after_cached_prefixes_equal_the_whole_prefills_in_bfloat16_on_the_gpu(checkpoint, arch):
    whole, again, hits = _whole_and_after_cached_prefixes(checkpoint(arch), device="cuda", dtype="bfloat16",
                                                         batch_invariant=True, kv_cache_dtype="fp8")
    assert again == whole and hits == _whole_pages_before_the_last_token()


@pytest.mark.gpu
def test_patched_cuda_gemm_gives_a_row_the_same_bits_in_any_batch():
    from dsa_kernels.batch_invariant import enable_batch_invariant_mode

    enable_batch_invariant_mode(torch.device("cuda"))
    w = torch.randn(4096, 1536, device="cuda", dtype=torch.bfloat16)
    rows = torch.randn(1024, 1536, device="cuda", dtype=torch.bfloat16)
    full = torch.nn.functional.linear(rows, w)
    torch.testing.assert_close(full.float(), rows.float() @ w.float().T, rtol=2e-2, atol=5e-1)
    for m in (1, 3, 64, 500):
        assert torch.equal(torch.nn.functional.linear(rows[-m:], w), full[-m:])
        assert torch.equal(rows[-m:].float().pow(2).mean(-1), rows.float().pow(2).mean(-1)[-m:])


@pytest.mark.gpu
def test_tree_speculation_through_the_fp8_kernels_equals_plain_greedy_on_the_gpu(checkpoint):
    # Tree verify ranks each node's visible keys from the paged kernel's logits
    # (KernelDsaBackend._tree_topk); with batch-invariant GEMMs it must pick what plain decode picks.
    args = dict(device="cuda", dtype="bfloat16", batch_invariant=True, kv_cache_dtype="fp8", num_kv_pages=256)
    model = checkpoint("deepseek_v32")
    plain = LLM(model, **args)
    prompts = _prompts(plain.engine.config.vocab_size)[::4]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    want = [out.token_ids for out in plain.generate(prompts, params)]
    del plain
    tree = LLM(model, speculative_algorithm="eagle", speculative_num_steps=3, speculative_eagle_topk=2, **args)
    assert [out.token_ids for out in tree.generate(prompts, params)] == want
