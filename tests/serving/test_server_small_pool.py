"""A KV pool too small for the offered load: every request still completes, with the right text."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from dsa_backend import LLM, SamplingParams
from dsa_client.grpc_stream import generate

from .servers import BATCH_INVARIANT, ENGINE, engine_kwargs

# 8 pages of 16 tokens: each request below needs up to 3 pages, and 12 of them come at once.
# Two postprocessing instances: the streamed text must not depend on which one decodes a delta.
# On a GPU it serves batch-invariant kernels: its reference runs the prompts in another batch (servers.py).
SERVER_SETTINGS = {"page_size": "16", "num_kv_pages": "8", "max_model_len": "128",
                   "postprocessing_instance_count": "2", **BATCH_INVARIANT}


def test_overloaded_pool_queues_or_retracts_but_loses_nothing(served, checkpoint, metric):
    prompts = [f"Item {i}: the pool is small, so wait your turn please" for i in range(12)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        served_out = list(pool.map(lambda p: generate(
            served.grpc_url, p, 24, temperature=0.0, exclude_input_in_output=True, timeout_s=300), prompts))
    # The reference: the offline LLM with a roomy pool (greedy output is batch-invariant).
    llm = LLM(checkpoint("glm_moe_dsa"), **engine_kwargs({**ENGINE, **BATCH_INVARIANT, "dtype": served.settings["dtype"]}))
    alone = [out.text for out in llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0))]
    assert [c.error for c in served_out] == [None] * len(prompts)
    assert [c.text for c in served_out] == alone
    assert all(c.num_output_tokens == 24 and c.finish_reason == "length" for c in served_out)
    assert metric("dsa_requests_total", finish_reason="length") == len(prompts)
    assert metric("dsa_retractions_total") is not None     # how many depends on the scheduler


def test_an_urgent_request_goes_ahead_of_running_ones_and_ends_before_them(served, metric):
    # Two long requests of priority 5 fill the pool (7 pages each at the end, of 8) and retract each
    # other; one of priority -1 sent then goes ahead of them (it waits ahead of a retracted one, or
    # retracts one itself) and ends first. Without priorities it ended after one of them.
    deep_in, ended = threading.Event(), []
    responses = [0]

    def heard(_delta):
        responses[0] += 1
        if responses[0] >= 40:
            deep_in.set()

    def send(name, prompt, max_tokens, priority, on_delta=None):
        c = generate(served.grpc_url, prompt, max_tokens, temperature=0.0, priority=priority, on_delta=on_delta,
                     timeout_s=300)
        ended.append((name, c))

    retractions = metric("dsa_retractions_total") or 0
    background = [threading.Thread(target=send, args=(f"low{i}", f"Background job {i}: a long report", 100, 5,
                                                      heard if i == 0 else None)) for i in range(2)]
    for t in background:
        t.start()
    assert deep_in.wait(120)
    send("urgent", "Urgent: answer now", 8, -1)
    for t in background:
        t.join(300)
    assert [name for name, _ in ended][0] == "urgent"
    assert all(c.error is None and c.finish_reason == "length" for _, c in ended)
    assert metric("dsa_retractions_total") > retractions
