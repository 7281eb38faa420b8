"""dsa_backend.serving.request_params: tensorrtllm/vllm-style inputs -> SamplingParams."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsa_backend.serving.request_params import parse_request


def inputs(**extra):
    base = {"input_ids": np.array([5, 6, 7], dtype=np.int32), "max_tokens": np.array([8], dtype=np.int32)}
    return {**base, **extra}


def test_defaults_are_vllm_defaults_with_the_given_max_tokens():
    r = parse_request(inputs())
    assert r.prompt_token_ids == [5, 6, 7]
    assert r.params.max_tokens == 8 and r.params.temperature == 1.0
    assert not r.stream and not r.exclude_input_in_output


def test_tensorrtllm_tensors_map_to_sampling_params():
    r = parse_request(inputs(
        temperature=np.array([0.0], np.float32), top_k=np.array([5], np.int32), top_p=np.array([0.5], np.float32),
        min_p=np.array([0.1], np.float32), repetition_penalty=np.array([1.2], np.float32),
        presence_penalty=np.array([0.5], np.float32), frequency_penalty=np.array([-0.5], np.float32),
        min_length=np.array([2], np.int32), random_seed=np.array([42], np.uint64),
        end_id=np.array([9], np.int32), stop_words=np.array([b"END", b""], dtype=object),
        bad_words_ids=np.array([[1, 2, 3], [2, 3, -1]], np.int32), return_log_probs=np.array([True]),
        stream=np.array([True]), exclude_input_in_output=np.array([True]), beam_width=np.array([1], np.int32)))
    p = r.params
    assert (p.temperature, p.top_k, p.min_tokens, p.seed) == (0.0, 5, 2, 42)
    assert p.top_p == pytest.approx(0.5) and p.min_p == pytest.approx(0.1)
    assert p.stop == ("END",) and p.stop_token_ids == (9,) and p.bad_words_ids == ((1, 2), (3,))
    assert p.logprobs and r.stream and r.exclude_input_in_output


def test_vllm_sampling_parameters_json_is_accepted_and_tensors_override_it():
    js = json.dumps({"temperature": 0, "max_tokens": 100.0, "stop": "x", "ignore_eos": True, "n": 1})
    r = parse_request(inputs(sampling_parameters=np.array([js.encode()], dtype=object)))
    assert r.params.max_tokens == 8 and r.params.temperature == 0 and r.params.stop == ("x",)
    assert r.params.ignore_eos


@pytest.mark.parametrize("extra, field", [
    ({"max_tokens": np.array([0], np.int32)}, "max_tokens"),
    ({"max_tokens": np.array([1.5], np.float32)}, "max_tokens"),
    ({"max_tokens": np.array([1, 2], np.int32)}, "max_tokens"),
    ({"temperature": np.array([-1.0], np.float32)}, "temperature"),
    ({"top_p": np.array([0.0], np.float32)}, "top_p"),
    ({"top_p": np.array([1.5], np.float32)}, "top_p"),
    ({"top_k": np.array([-1], np.int32)}, "top_k"),
    ({"beam_width": np.array([4], np.int32)}, "beam_width"),
    ({"input_ids": np.array([], np.int32)}, "input_ids"),
    ({"stop_words": np.array([b"\xff"], dtype=object)}, "stop_words"),
    ({"sampling_parameters": np.array([b"{not json"], dtype=object)}, "sampling_parameters"),
    ({"sampling_parameters": np.array([b'{"bogus": 1}'], dtype=object)}, "sampling_parameters"),
    ({"sampling_parameters": np.array([b'{"n": 3, "best_of": 4}'], dtype=object)}, "sampling_parameters.best_of"),
    ({"sampling_parameters": np.array([b'{"n": 0}'], dtype=object)}, "num_return_sequences"),
    ({"num_return_sequences": np.array([300], np.int32)}, "num_return_sequences"),
    ({"sampling_parameters": np.array([b'{"temperature": "hot"}'], dtype=object)}, "sampling_parameters"),
    ({"sampling_parameters": np.array([b'{"prompt_logprobs": 5}'], dtype=object)}, "sampling_parameters.prompt_logprobs"),
    ({"sampling_parameters": np.array([b'{"logprobs": 21}'], dtype=object)}, "sampling_parameters.logprobs"),
    ({"num_top_log_probs": np.array([21], np.int32)}, "top_logprobs"),
])
def test_bad_values_raise_naming_the_field(extra, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_request(inputs(**extra))


def test_n_comes_from_num_return_sequences_or_vllm_json_and_the_tensor_wins():
    assert parse_request(inputs(num_return_sequences=np.array([3], np.int32))).params.n == 3
    js = np.array([b'{"n": 4.0}'], dtype=object)
    assert parse_request(inputs(sampling_parameters=js)).params.n == 4
    assert parse_request(inputs(sampling_parameters=js, num_return_sequences=np.array([2], np.int32))).params.n == 2


@pytest.mark.parametrize("vllm_value, expected", [(0, True), (True, True), (None, False), (False, False)])
def test_vllm_logprobs_counts_of_zero_ask_for_each_tokens_own_log_prob(vllm_value, expected):
    js = np.array([json.dumps({"logprobs": vllm_value, "prompt_logprobs": vllm_value}).encode()], dtype=object)
    params = parse_request(inputs(sampling_parameters=js)).params
    assert params.logprobs is expected and params.prompt_logprobs is expected


def test_a_vllm_logprobs_count_or_num_top_log_probs_asks_for_that_many_most_likely_tokens():
    js = np.array([b'{"logprobs": 5}'], dtype=object)
    params = parse_request(inputs(sampling_parameters=js)).params
    assert params.logprobs and params.top_logprobs == 5
    params = parse_request(inputs(num_top_log_probs=np.array([3], np.int32))).params
    assert not params.logprobs and params.top_logprobs == 3


def test_return_prompt_log_probs_asks_for_the_prompts_log_probs():
    assert not parse_request(inputs()).params.prompt_logprobs
    assert parse_request(inputs(return_prompt_log_probs=np.array([True]))).params.prompt_logprobs


def test_missing_max_tokens_names_the_field():
    with pytest.raises(ValueError, match="max_tokens"):
        parse_request({"input_ids": np.array([1], np.int32)})


def test_tensorrtllm_guide_tensors_and_vllm_guided_decoding_json_become_a_guide():
    from dsa_backend.guided import Guide
    schema = '{"type": "object"}'
    r = parse_request(inputs(guided_decoding_guide_type=np.array([b"json_schema"], dtype=object),
                             guided_decoding_guide=np.array([schema.encode()], dtype=object)))
    assert r.params.guided_decoding == Guide("json_schema", schema)
    r = parse_request(inputs(guided_decoding_guide_type=np.array([b"json"], dtype=object)))
    assert r.params.guided_decoding == Guide("json")
    for key in ("guided_decoding", "structured_outputs"):
        text = json.dumps({key: {"regex": "[0-9]+"}})
        r = parse_request(inputs(sampling_parameters=np.array([text.encode()], dtype=object)))
        assert r.params.guided_decoding == Guide("regex", "[0-9]+")


@pytest.mark.parametrize("extra, message", [
    ({"guided_decoding_guide_type": [b"xml"]}, "guide type must be one of"),
    ({"guided_decoding_guide_type": [b"regex"]}, "needs its regex"),
    ({"guided_decoding_guide": [b"[0-9]+"]}, "needs guided_decoding_guide_type"),
    ({"guided_decoding_guide_type": [b"json_schema"], "guided_decoding_guide": [b"{oops"]}, "not valid JSON"),
])
def test_bad_guides_raise_naming_the_problem(extra, message):
    with pytest.raises(ValueError, match=message):
        parse_request(inputs(**{k: np.array(v, dtype=object) for k, v in extra.items()}))


def test_priority_comes_from_its_tensor_and_defaults_to_zero():
    assert parse_request(inputs()).priority == 0
    assert parse_request(inputs(priority=np.array([-7], np.int32))).priority == -7
    with pytest.raises(ValueError, match="priority"):
        parse_request(inputs(priority=np.array([1.5], np.float32)))
