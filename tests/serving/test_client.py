"""dsa_client's pure parts: workload, statistics, perf_analyzer inputs, input tensors."""

from __future__ import annotations

import json

import pytest

from dsa_client.grpc_stream import Completion, build_inputs, requested_outputs
from dsa_client.perf_inputs import write_perf_analyzer_data
from dsa_client.stats import inter_token_latencies, summarize
from dsa_client.workload import make_requests


def test_fixed_lengths_are_exact_and_sampled_ones_vary_reproducibly():
    fixed = make_requests(5, 20, 7)
    assert all(len(r.prompt.split()) == 20 and r.max_tokens == 7 for r in fixed)
    sampled = make_requests(50, 20, 7, input_std=5, output_std=2, seed=3)
    assert len({len(r.prompt.split()) for r in sampled}) > 3
    assert sampled == make_requests(50, 20, 7, input_std=5, output_std=2, seed=3)
    assert min(r.max_tokens for r in sampled) >= 1


def test_a_shared_prefix_starts_every_prompt_before_its_own_words():
    requests = make_requests(4, 10, 3, seed=5, shared_prefix_len=30)
    prefixes = {" ".join(r.prompt.split()[:30]) for r in requests}
    assert len(prefixes) == 1 and all(len(r.prompt.split()) == 40 for r in requests)
    assert len({r.prompt for r in requests}) == 4


def test_summary_percentiles_and_throughput():
    c = Completion(deltas=["", "a", "b", "c"], times=[0.1, 0.2, 0.3, 0.5], num_input_tokens=4,
                   num_output_tokens=3, final=True)
    assert inter_token_latencies(c) == pytest.approx([0.1, 0.2])
    s = summarize([c, Completion(error="boom", final=True)], wall_s=2.0)
    assert s["errors"] == 1 and s["requests"] == 2
    assert s["output_tokens_per_s"] == pytest.approx(1.5)
    assert s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["e2e_s"]["p99"] == pytest.approx(0.5)
    assert s["acceptance_rate"] is None and s["draft_tokens"] == 0    # the server did not draft


def test_summary_pools_draft_acceptance_over_requests():
    a = Completion(num_output_tokens=10, draft_tokens=8, accepted_draft_tokens=6, final=True)
    b = Completion(num_output_tokens=10, draft_tokens=12, accepted_draft_tokens=2, final=True)
    s = summarize([a, b], wall_s=1.0)
    assert (s["draft_tokens"], s["accepted_draft_tokens"]) == (20, 8)
    assert s["acceptance_rate"] == pytest.approx(0.4)


def test_perf_analyzer_input_data_uses_the_ensemble_tensor_names(tmp_path):
    path = write_perf_analyzer_data(tmp_path / "inputs.json", make_requests(2, 8, 16))
    data = json.loads(path.read_text())["data"]
    assert len(data) == 2
    assert set(data[0]) == {"text_input", "max_tokens", "min_tokens", "temperature", "stream",
                            "exclude_input_in_output"}
    assert data[0]["max_tokens"] == [16] and isinstance(data[0]["text_input"][0], str)


def test_input_tensors_have_batch_dimension_and_triton_dtypes():
    inputs = {t.name(): t for t in build_inputs("hi", 8, temperature=0.5, seed=3, stop_words=["a", "b"],
                                                stream=True, top_k=None)}
    assert set(inputs) == {"text_input", "max_tokens", "temperature", "seed", "stop_words", "stream"}
    assert inputs["max_tokens"].datatype() == "INT32" and inputs["max_tokens"].shape() == [1, 1]
    assert inputs["seed"].datatype() == "UINT64" and inputs["stream"].datatype() == "BOOL"
    assert inputs["stop_words"].shape() == [1, 2]


def test_conversations_add_a_follow_up_of_input_len_words_a_later_turn():
    requests = make_requests(3, 12, 5, seed=2, turns=4, shared_prefix_len=6)
    assert all(len(r.follow_ups) == 3 and all(len(f.split()) == 12 for f in r.follow_ups) for r in requests)
    assert all(len(r.prompt.split()) == 18 for r in requests)
    assert requests == make_requests(3, 12, 5, seed=2, turns=4, shared_prefix_len=6)
    assert make_requests(2, 12, 5)[0].follow_ups == ()
    with pytest.raises(ValueError, match="turns"):
        make_requests(2, 12, 5, turns=0)


def test_summary_reports_the_prompt_tokens_the_prefix_cache_served():
    a = Completion(num_input_tokens=100, num_cached_tokens=64, final=True)
    b = Completion(num_input_tokens=60, num_cached_tokens=0, final=True)
    s = summarize([a, b, Completion(error="boom", final=True)], wall_s=1.0)
    assert (s["cached_input_tokens"], s["prefix_cache_hit_rate"]) == (64, pytest.approx(0.4))
    assert summarize([], wall_s=1.0)["prefix_cache_hit_rate"] is None


@pytest.mark.parametrize("asks", [{}, {"return_log_probs": True}, {"num_top_log_probs": 2},
                                  {"return_prompt_log_probs": True}, {"sampling_parameters": '{"logprobs": 1}'}])
def test_a_request_asks_for_the_log_prob_outputs_only_when_it_asks_for_log_probs(asks):
    names = [o.name() for o in requested_outputs({"temperature": 0.0, **asks})]
    assert {"text_output", "finish_reason", "num_output_tokens", "sequence_index"} <= set(names)
    log_prob_outputs = {"output_log_probs", "prompt_log_probs", "top_token_ids", "top_log_probs", "top_tokens"}
    assert (log_prob_outputs <= set(names)) == bool(asks) and (log_prob_outputs & set(names) == set()) != bool(asks)
