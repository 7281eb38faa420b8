"""Concurrent requests batched together get the text each gets alone (no cross-talk in the batch),
and a request served from the prefix cache gets the text it gets computed whole."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from dsa_client.grpc_stream import generate

from .servers import BATCH_INVARIANT

# Solo vs 32 at once, and a prompt computed whole vs after its cached pages, compare different
# batches: batch-invariant kernels on a GPU (servers.py).
SERVER_SETTINGS = dict(BATCH_INVARIANT)


def greedy(url, prompt, max_tokens, **kw):
    c = generate(url, prompt, max_tokens, temperature=0.0, exclude_input_in_output=True, timeout_s=120, **kw)
    assert c.error is None, c.error
    assert c.final
    return c


def test_32_concurrent_streams_each_equal_their_solo_output(served):
    prompts = [f"Request number {i}: tell me about item {i * 7}" for i in range(32)]
    solo = [greedy(served.grpc_url, p, 8).text for p in prompts]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: greedy(served.grpc_url, p, 8, stream=True), prompts))
    assert [c.text for c in together] == solo
    assert all(c.num_output_tokens == 8 for c in together)


def test_a_repeated_prompt_is_served_from_the_prefix_cache(served, metric):
    prompt = "A system prompt long enough to fill whole pages of sixteen tokens, then a question: " * 2
    first = greedy(served.grpc_url, prompt, 12)
    hits = metric("dsa_prefix_cache_hit_tokens_total")   # refreshed before the final response
    second = greedy(served.grpc_url, prompt, 12, stream=True)
    assert second.text == first.text
    # the whole pages (16 tokens) of all but the prompt's last token, computed by the first request
    cached = (first.num_input_tokens - 1) // 16 * 16
    assert cached >= 32 and (first.num_cached_tokens, second.num_cached_tokens) == (0, cached)
    assert metric("dsa_prefix_cache_hit_tokens_total") - hits == cached
    assert metric("dsa_kv_pages_cached", pool="mla") >= cached // 16
