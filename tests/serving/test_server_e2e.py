"""End to end through a real tritonserver: the `dsa` ensemble over gRPC, on the tiny checkpoint."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from dsa_backend import SamplingParams
from dsa_client.grpc_stream import build_inputs, generate, generate_samples

from .servers import served_device

PROMPTS = {
    "english": "The quick brown fox jumps over the lazy dog.",
    "chinese": "深度求索的稀疏注意力：你好，世界！",
    "emoji": "Party time 🎉🎊👩‍👩‍👧 let's go",
}


def greedy(url, prompt, max_tokens=16, **kw):
    c = generate(url, prompt, max_tokens, temperature=0.0, exclude_input_in_output=True, timeout_s=120, **kw)
    assert c.error is None, c.error
    assert c.final
    return c


def test_engine_runs_where_the_offline_llm_runs(served, offline_llm):
    # fill_template's auto: KIND_GPU, the instance's GPU and bfloat16 where there is a GPU; else
    # KIND_CPU, the CPU and float32. The offline LLM that checks the text must match it.
    found = re.findall(r"dsa_llm: engine ready on device (\S+), dtype (\w+) \(instance kind (\w+)\)",
                       served.log_file.read_text(errors="replace"))
    assert found, served.log_errors()
    device, dtype, kind = found[-1]
    assert (device, dtype) == (str(offline_llm.engine.device), str(offline_llm.engine.dtype).removeprefix("torch."))
    if torch.cuda.is_available():   # one instance: of a GPU, or with several GPUs of the model's placing
        assert (kind, device) == ("GPU" if torch.cuda.device_count() == 1 else "MODEL", "cuda:0")
        assert served.settings["dtype"] != "auto" or dtype == "bfloat16"
    else:
        assert (kind, device) == ("CPU", "cpu")
        assert served.settings["dtype"] != "auto" or dtype == "float32"


@pytest.mark.parametrize("name", PROMPTS)
def test_stream_equals_non_stream_equals_offline_llm(served, offline_llm, name):
    streamed = greedy(served.grpc_url, PROMPTS[name], stream=True)
    whole = greedy(served.grpc_url, PROMPTS[name], stream=False)
    [offline] = offline_llm.generate(PROMPTS[name], SamplingParams(max_tokens=16, temperature=0))
    assert len(streamed.deltas) > 1 and len(whole.deltas) == 1
    assert streamed.text == whole.text == offline.text
    assert streamed.num_output_tokens == whole.num_output_tokens == 16
    assert streamed.finish_reason == whole.finish_reason == "length"


def test_penalties_reach_the_engine_and_give_the_offline_llms_text(served, offline_llm):
    # Below 1 and below 0 the penalties make the tiny random model repeat what it has seen, so
    # they show in the text (counts kept across steps, dsa_backend/token_counts.py).
    params = dict(repetition_penalty=0.3, frequency_penalty=-1.0)
    penalized = greedy(served.grpc_url, PROMPTS["english"], stream=True, **params)
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(max_tokens=16, temperature=0, **params))
    assert penalized.text == offline.text
    assert penalized.text != greedy(served.grpc_url, PROMPTS["english"], stream=True).text


def test_non_streamed_text_includes_the_prompt_unless_excluded(served):
    prompt = PROMPTS["english"]
    c = generate(served.grpc_url, prompt, 4, stream=False, temperature=0.0, timeout_s=120)
    assert c.text == prompt + greedy(served.grpc_url, prompt, 4).text


def test_stop_word_ends_the_text_before_it(served):
    full = greedy(served.grpc_url, PROMPTS["english"], 16).text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    c = greedy(served.grpc_url, PROMPTS["english"], 16, stop_words=[stop])
    assert c.text == full[:full.index(stop)]
    assert c.finish_reason == "stop"


def test_log_probs_are_returned_when_asked(served):
    c = greedy(served.grpc_url, PROMPTS["english"], 6, return_log_probs=True, stream=False)
    assert len(c.output_log_probs) == 6 and all(lp <= 0 for lp in c.output_log_probs)
    assert c.cum_log_prob == pytest.approx(sum(c.output_log_probs), rel=1e-4)


@pytest.mark.parametrize("stream", [True, False])
def test_prompt_log_probs_are_the_offline_llms_on_the_first_response(served, offline_llm, stream):
    prompt = PROMPTS["chinese"]
    c = greedy(served.grpc_url, prompt, 3, return_prompt_log_probs=True, stream=stream)
    [offline] = offline_llm.generate(prompt, SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=True))
    assert len(c.prompt_log_probs) == c.num_input_tokens - 1 == len(offline.prompt_logprobs) - 1
    assert c.prompt_log_probs == pytest.approx(offline.prompt_logprobs[1:], abs=1e-3)
    assert c.num_cached_tokens == 0        # computed, not read from the cache the other tests filled
    vllm = greedy(served.grpc_url, prompt, 3, sampling_parameters=json.dumps({"prompt_logprobs": 0}))
    assert vllm.prompt_log_probs == pytest.approx(c.prompt_log_probs, abs=1e-3)
    assert greedy(served.grpc_url, prompt, 3).prompt_log_probs == []


def test_a_vllm_logit_bias_steers_the_text_as_the_offline_llms(served, offline_llm):
    bias = {"1002": 8.0, "3003": -100}
    c = greedy(served.grpc_url, PROMPTS["english"], 8, sampling_parameters=json.dumps({"logit_bias": bias}))
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(max_tokens=8, temperature=0, logit_bias=bias))
    assert c.text == offline.text and c.text != greedy(served.grpc_url, PROMPTS["english"], 8).text


@pytest.mark.parametrize("stream", [True, False])
def test_top_log_probs_are_the_offline_llms_with_each_tokens_text(served, offline_llm, tokenizer, stream):
    c = greedy(served.grpc_url, PROMPTS["english"], 5, num_top_log_probs=3, stream=stream)
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(max_tokens=5, temperature=0, top_logprobs=3))
    assert c.top_token_ids == [t for top in offline.top_logprobs for t, _ in top]
    assert c.top_log_probs == pytest.approx([v for top in offline.top_logprobs for _, v in top], abs=1e-3)
    assert c.top_tokens == [tokenizer.decode([t], skip_special_tokens=False) for t in c.top_token_ids]
    assert c.output_log_probs == []                       # not asked for
    vllm = greedy(served.grpc_url, PROMPTS["english"], 5, sampling_parameters=json.dumps({"logprobs": 3}))
    assert vllm.top_token_ids == c.top_token_ids and len(vllm.output_log_probs) == 5


def test_chat_messages_use_the_chat_template(served):
    messages = json.dumps([{"role": "user", "content": "Hi"}])
    c = greedy(served.grpc_url, "", 4, messages=messages)
    # <bos> <User> Hi <Assistant>
    assert c.num_input_tokens == 4
    # text_input may be left out when messages is given
    inputs = build_inputs("", 4, messages=messages, temperature=0.0, exclude_input_in_output=True)[1:]
    [without_text] = generate_samples(served.grpc_url, "", None, inputs=inputs)
    assert without_text.error is None and without_text.text == c.text


def test_max_tokens_in_vllm_sampling_parameters_is_enough(served, offline_llm):
    c = generate(served.grpc_url, PROMPTS["english"], None, timeout_s=60, exclude_input_in_output=True,
                 sampling_parameters=json.dumps({"max_tokens": 5, "temperature": 0}))
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(max_tokens=5, temperature=0))
    assert c.error is None and (c.text, c.num_output_tokens) == (offline.text, 5)


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "ok"],
          "properties": {"answer": {"enum": ["yes", "no"]}, "ok": {"type": "boolean"}}}


def test_a_json_schema_guide_streams_json_of_that_schema_as_the_offline_llm_does(served, offline_llm):
    guide = {"json": SCHEMA, "disable_any_whitespace": True}   # a random model spins in free whitespace
    c = greedy(served.grpc_url, PROMPTS["english"], 32, stream=True,
               sampling_parameters=json.dumps({"guided_decoding": guide}))
    value = json.loads(c.text)
    assert set(value) == {"answer", "ok"} and value["answer"] in ("yes", "no") and isinstance(value["ok"], bool)
    assert c.finish_reason == "stop" and len(c.deltas) > 1
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(
        max_tokens=32, temperature=0, guided_decoding=guide))
    assert c.text == offline.text


def test_tensorrtllm_guide_tensors_give_text_that_matches_the_regex(served, offline_llm):
    regex = r"[a-z]{3,8}@[a-z]{2,6}\.(com|org)"
    c = greedy(served.grpc_url, PROMPTS["emoji"], 24, guided_decoding_guide_type="regex", guided_decoding_guide=regex)
    assert re.fullmatch(regex, c.text) and c.finish_reason == "stop"
    [offline] = offline_llm.generate(PROMPTS["emoji"], SamplingParams(
        max_tokens=24, temperature=0, guided_decoding={"regex": regex}))
    assert c.text == offline.text


def test_the_stream_cli_sends_a_guide_read_from_a_file(served, tmp_path, capsys):
    from dsa_client import stream

    (tmp_path / "guide.txt").write_text("(north|south) [0-9]{2}", encoding="utf-8")
    assert stream.main(["--url", served.grpc_url, "--max-tokens", "12", "--guide-type", "regex",
                        "--guide", f"@{tmp_path / 'guide.txt'}", "Go"]) == 0
    text = capsys.readouterr().out.strip()
    assert re.fullmatch("(north|south) [0-9]{2}", text), text


def test_the_stream_cli_prints_each_of_n_samples(served, offline_llm, capsys):
    from dsa_client import stream

    assert stream.main(["--url", served.grpc_url, "--max-tokens", "6", "--temperature", "1", "--seed", "3",
                        "-n", "2", "Go"]) == 0
    offline = offline_llm.generate("Go", SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=2))
    assert capsys.readouterr().out == "".join(f"--- sample {i} ---\n{o.text}\n" for i, o in enumerate(offline))


def test_the_stream_cli_scores_the_prompt(served, offline_llm, capsys):
    from dsa_client import stream

    assert stream.main(["--url", served.grpc_url, "--max-tokens", "1", "--score", "--priority", "-2",
                        PROMPTS["english"]]) == 0
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(max_tokens=1, prompt_logprobs=True))
    total = sum(offline.prompt_logprobs[1:])
    found = re.search(r"prompt log prob (\S+) over (\d+) tokens, perplexity ([\d.]+)", capsys.readouterr().err)
    assert found and int(found[2]) == len(offline.prompt_logprobs) - 1
    assert float(found[1]) == pytest.approx(total, abs=1e-2)
    assert float(found[3]) == pytest.approx(np.exp(-total / int(found[2])), rel=1e-3)


def test_vllm_guided_decoding_in_sampling_parameters_picks_one_of_the_choices(served):
    choices = ["alpha", "beta", "gamma delta"]
    params = json.dumps({"temperature": 1.0, "seed": 3, "guided_decoding": {"choice": choices}})
    c = generate(served.grpc_url, PROMPTS["chinese"], 16, sampling_parameters=params, exclude_input_in_output=True,
                 timeout_s=120)
    assert c.error is None and c.text in choices and c.finish_reason == "stop"


def test_n_samples_stream_interleaved_each_as_the_offline_llm_samples_it(served, offline_llm):
    prompt = "Sample me three times: " + "one two three four five six seven eight nine ten " * 4
    samples = generate_samples(served.grpc_url, prompt, 12, temperature=1.0, seed=5, num_return_sequences=3,
                               exclude_input_in_output=True, timeout_s=120)
    offline = offline_llm.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=5, n=3))
    assert [c.error for c in samples] == [None] * 3 and all(c.final for c in samples)
    assert [c.text for c in samples] == [o.text for o in offline]
    assert len({c.text for c in samples}) > 1
    assert all(len(c.deltas) > 1 and c.finish_reason == "length" and c.num_output_tokens == 12 for c in samples)
    # one sample computed the prompt; the others found its whole pages in the cache
    pages = samples[0].num_input_tokens - 1 - (samples[0].num_input_tokens - 1) % 16
    assert pages >= 16 and [c.num_cached_tokens for c in samples[1:]] == [pages, pages]


def test_vllm_n_in_sampling_parameters_gives_one_whole_response_a_sample(served, offline_llm):
    params = json.dumps({"n": 2, "temperature": 0.9, "seed": 11})
    samples = generate_samples(served.grpc_url, PROMPTS["chinese"], 8, stream=False, sampling_parameters=params,
                               exclude_input_in_output=True, timeout_s=120)
    offline = offline_llm.generate(PROMPTS["chinese"], SamplingParams(max_tokens=8, temperature=0.9, seed=11, n=2))
    assert [(len(c.deltas), c.text) for c in samples] == [(1, o.text) for o in offline]


def settle(read, want, timeout_s=30.0):
    """What read() returns once it equals want, or its last value after timeout_s. dsa_llm sets
    its gauges one by one (pages first), and a scrape once read running == 0 next to a page
    count one refresh old (the CI machine, 2026-11-23), so each condition is waited for."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while value != want and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


@pytest.mark.parametrize("n", [1, 3])
def test_cancel_mid_stream_stops_generation_and_frees_pages(served, metric, n):
    def in_flight():
        return metric("dsa_requests_running") + metric("dsa_requests_waiting")

    def pages_free():
        return metric("dsa_kv_pages_free", pool="mla"), metric("dsa_kv_pages_free", pool="indexer")

    assert settle(in_flight, 0) == 0
    idle = pages_free()
    generated_before = metric("dsa_generation_tokens_total")
    aborted_before = metric("dsa_requests_total", finish_reason="abort") or 0
    samples = generate_samples(served.grpc_url, PROMPTS["english"], 400, temperature=0.0, cancel_after=3,
                               num_return_sequences=n, timeout_s=120)
    assert sum(len(c.times) for c in samples) == 3 and not any(c.final for c in samples)
    assert settle(in_flight, 0) == 0
    assert settle(pages_free, idle, timeout_s=10) == idle
    # Tokens made before the abort may still be in the sender's queue; then the count stops.
    settled, deadline = None, time.monotonic() + 10
    while settled != metric("dsa_generation_tokens_total") and time.monotonic() < deadline:
        settled = metric("dsa_generation_tokens_total")
        time.sleep(0.5)
    assert settled == metric("dsa_generation_tokens_total")
    assert settled - generated_before < 100 * n                  # far from the 400 a sample asked for
    # counted with the final response, which can come after the gauges show the request gone
    assert settle(lambda: (metric("dsa_requests_total", finish_reason="abort") or 0) - aborted_before, n) == n


def test_kernel_loads_while_serving_are_reported(served, metric):
    # After the requests above: on the CPU nothing compiles; on a GPU without warm-up the first
    # steps of each shape load their kernels, and each took some time.
    loads, seconds = metric("dsa_kernel_loads_total"), metric("dsa_kernel_load_seconds_total")
    assert loads is not None and seconds is not None
    if served_device(served.settings) == "cpu":
        assert loads == 0 and seconds == 0
    else:
        assert (loads > 0) == (seconds > 0)


def _raw(name, dtype, array):
    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def _text(value: bytes):
    return _raw("text_input", "BYTES", np.array([[value]], dtype=object))


def _max_tokens(value=4, dtype="INT32", np_dtype=np.int32, shape=(1, 1)):
    return _raw("max_tokens", dtype, np.full(shape, value, dtype=np_dtype))


BAD_INPUTS = {
    "empty text": ("text_input", dict(prompt="")),
    "missing max_tokens": ("max_tokens", dict(inputs=[_text(b"hi")])),
    # a Triton 2.51 ensemble missing a required input beside others never answered
    "missing max_tokens beside other inputs": ("max_tokens", dict(max_tokens=None, stream=True, temperature=0.5)),
    "missing text_input": ("text_input", dict(inputs=build_inputs("", 4, temperature=0.5)[1:])),
    # none of preprocessing's inputs: the python backend refused it before any model code ran
    "only sampling inputs": ("text_input", dict(inputs=build_inputs("", None, stream=True, temperature=0.5)[1:])),
    "zero max_tokens": ("max_tokens", dict(max_tokens=0)),
    "negative max_tokens": ("max_tokens", dict(max_tokens=-3)),
    "max_tokens beyond the context": ("max_tokens", dict(max_tokens=100_000)),
    "prompt longer than the context": ("context", dict(prompt="the " * 600)),
    "negative temperature": ("temperature", dict(temperature=-0.5)),
    "top_p zero": ("top_p", dict(top_p=0.0)),
    "top_p above one": ("top_p", dict(top_p=1.5)),
    "negative top_k": ("top_k", dict(top_k=-1)),
    "invalid UTF-8": ("text_input", dict(inputs=[_text(b"ok \xff\xfe"), _max_tokens()])),
    "wrong dtype": ("max_tokens", dict(inputs=[_text(b"hi"), _max_tokens(4.0, "FP32", np.float32)])),
    "wrong shape": ("max_tokens", dict(inputs=[_text(b"hi"), _max_tokens(shape=(1, 2))])),
    "malformed sampling_parameters": ("sampling_parameters", dict(sampling_parameters="{temperature: ")),
    "beam_width above one": ("beam_width", dict(beam_width=4)),
    "no samples": ("num_return_sequences", dict(num_return_sequences=0)),
    "best_of": ("best_of", dict(sampling_parameters=json.dumps({"n": 2, "best_of": 3}))),
    "unknown guide type": ("guide type", dict(guided_decoding_guide_type="xml", guided_decoding_guide="<a/>")),
    # found by the engine process's compiler, not by dsa_llm's checks
    "guide that does not compile": ("regex does not compile",
                                    dict(guided_decoding_guide_type="regex", guided_decoding_guide="[a-z")),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_an_error_naming_the_field_and_the_next_request_succeeds(served, case):
    field, kwargs = BAD_INPUTS[case]
    kwargs = {"prompt": "hello", "max_tokens": 4, **kwargs}
    c = generate(served.grpc_url, kwargs.pop("prompt"), kwargs.pop("max_tokens"), timeout_s=60, **kwargs)
    assert c.error is not None and field in c.error, c.error
    assert c.final
    assert greedy(served.grpc_url, "hello", 2).num_output_tokens == 2


def test_inputs_builder_refuses_unknown_names():
    with pytest.raises(ValueError, match="unknown input"):
        build_inputs("x", 1, temprature=0.5)
