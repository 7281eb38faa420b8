"""MTP speculative decoding behind Triton: greedy text as without it, and the acceptance counts.

One server with speculative_algorithm=mtp, 2 steps (chain), and one with tree drafting (eagle,
3 steps, topk 2, 5 verified tokens); the offline LLM reference runs without speculation. The tiny
checkpoint's MTP layer is random, so drafts are mostly rejected: what is checked is that they are
drafted, counted consistently, and never change the text.
"""

from __future__ import annotations

import queue
import uuid

import pytest
import tritonclient.grpc as grpcclient

from dsa_backend import SamplingParams
from dsa_client.grpc_stream import build_inputs

from .servers import BATCH_INVARIANT, start_server

# Verify (3 tokens a row) vs plain decode compares different batches: batch-invariant kernels on a GPU (servers.py).
SERVER_SETTINGS = {"speculative_algorithm": "mtp", "speculative_num_steps": "2", **BATCH_INVARIANT}
TREE_SETTINGS = {"speculative_algorithm": "eagle", "speculative_num_steps": "3", "speculative_eagle_topk": "2",
                 "speculative_num_draft_tokens": "5", **BATCH_INVARIANT}
MAX_TOKENS = 24
PROMPTS = {
    "english": "The quick brown fox jumps over the lazy dog.",
    "chinese": "深度求索的稀疏注意力：你好，世界！",
    "emoji": "Party time 🎉🎊👩‍👩‍👧 let's go",
    # longer than index_topk (32) of the tiny preset, so the indexer really selects
    "long english": "In the beginning the sparse attention indexer looks at every token, but once the "
                    "context grows past its top-k it has to choose which of the earlier tokens matter, "
                    "and the draft tokens must be judged against exactly that choice.",
    "long chinese": "从前有一座山，山里有一座庙，庙里有一个老和尚在给小和尚讲故事。讲的是什么故事呢？"
                    "从前有一座山，山里有一座庙，庙里有一个老和尚在给小和尚讲故事。🎉",
}
SPEC_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


def responses(url: str, prompt: str, stream: bool) -> list[dict]:
    """Every response of one greedy request, as {output name: first value}."""
    client = grpcclient.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    out = []
    try:
        client.async_stream_infer("dsa", build_inputs(prompt, MAX_TOKENS, stream=stream, temperature=0.0,
                                                      exclude_input_in_output=True),
                                  request_id=uuid.uuid4().hex[:16])
        while True:
            result, error = got.get(timeout=300)
            assert error is None, error
            r = {name: result.as_numpy(name).reshape(-1)
                 for name in ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens", *SPEC_OUTPUTS)}
            out.append({k: (v[0] if k != "text_output" else b"".join(v).decode()) for k, v in r.items()})
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


@pytest.fixture(scope="module")
def reference(offline_llm):
    outs = offline_llm.generate(list(PROMPTS.values()), SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
    return dict(zip(PROMPTS, outs))


@pytest.fixture(scope="module")
def served_outputs(served):
    return {(name, stream): responses(served.grpc_url, PROMPTS[name], stream)
            for name in PROMPTS for stream in (True, False)}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_greedy_text_equals_the_offline_llm_without_speculation(served_outputs, reference, stream):
    for name in PROMPTS:
        rs = served_outputs[name, stream]
        assert "".join(r["text_output"] for r in rs) == reference[name].text, name
        assert rs[-1]["num_output_tokens"] == len(reference[name].token_ids), name
        assert rs[-1]["finish_reason"].decode() == reference[name].finish_reason, name
        assert stream or len(rs) == 1
    assert max(served_outputs["long english", stream][0]["num_input_tokens"],
               served_outputs["long chinese", stream][0]["num_input_tokens"]) > 32


def test_every_response_carries_consistent_cumulative_acceptance(served_outputs):
    for key, rs in served_outputs.items():
        drafted = [int(r["total_draft_tokens"]) for r in rs]
        accepted = [int(r["total_accepted_draft_tokens"]) for r in rs]
        assert drafted == sorted(drafted) and accepted == sorted(accepted), key      # cumulative
        for r, d, a in zip(rs, drafted, accepted):
            assert 0 <= a <= d, key
            assert float(r["acceptance_rate"]) == pytest.approx(a / d if d else 0.0), key
        assert drafted[-1] > 0, key
        # at most num_steps = 2 drafts per step, and never more accepted tokens than generated
        assert accepted[-1] < rs[-1]["num_output_tokens"], key


def test_speculation_metrics_add_up_to_the_responses(served, served_outputs, metric):
    finals = [rs[-1] for rs in served_outputs.values()]
    drafted = sum(int(r["total_draft_tokens"]) for r in finals)
    accepted = sum(int(r["total_accepted_draft_tokens"]) for r in finals)
    assert metric("dsa_spec_draft_tokens_total") == drafted > 0
    assert metric("dsa_spec_accepted_tokens_total") == accepted
    steps = metric("dsa_spec_accept_length_count")          # verify steps, <= 2 drafts each
    assert drafted / 2 <= steps <= drafted
    assert metric("dsa_spec_accept_length_sum") == accepted + steps


@pytest.fixture
def served_tree(request, checkpoint, tmp_path_factory):
    """The tree-drafting server, for the one test below (stopped after it)."""
    return start_server(request, checkpoint, tmp_path_factory, TREE_SETTINGS)


def test_tree_drafting_greedy_text_equals_the_offline_llm_without_speculation(served_tree, reference):
    for name in PROMPTS:
        rs = responses(served_tree.grpc_url, PROMPTS[name], stream=True)
        assert "".join(r["text_output"] for r in rs) == reference[name].text, name
        assert rs[-1]["finish_reason"].decode() == reference[name].finish_reason, name
        drafted, accepted = int(rs[-1]["total_draft_tokens"]), int(rs[-1]["total_accepted_draft_tokens"])
        # 4 drafts (a tree of 5 verified tokens) per verify step; every step emits one target token
        assert drafted > 0 and drafted % 4 == 0 and 0 <= accepted < rs[-1]["num_output_tokens"], name
