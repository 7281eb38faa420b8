"""Concurrent requests batched together get the text each gets alone (no cross-talk in the batch)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from dsa_client.grpc_stream import generate

from .servers import BATCH_INVARIANT

# Solo vs 32 at once compares different batches: batch-invariant kernels on a GPU (servers.py).
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
