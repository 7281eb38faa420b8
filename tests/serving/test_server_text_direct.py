"""Text straight to dsa_llm: a request that sends text_input (or messages) to dsa_llm, not to the
`dsa` ensemble, gets what the ensemble would have sent, without preprocessing and postprocessing."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
from dataclasses import asdict

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from dsa_backend import SamplingParams
from dsa_client.grpc_stream import build_inputs, generate, generate_samples

from .servers import assert_concurrent_streams_match
from .test_server_e2e import PROMPTS, settle

DIRECT = "dsa_llm"
# Everything a Completion holds but how its text was cut into deltas (each response carries the
# tokens made since the last), the arrival times, and num_cached_tokens (the second of two
# requests of one prompt finds the first's pages in the prefix cache).
_SAME = ("finish_reason", "num_input_tokens", "num_output_tokens", "cum_log_prob",
         "output_log_probs", "prompt_log_probs", "top_token_ids", "top_log_probs", "top_tokens", "error")

REQUESTS = {
    "streamed": dict(prompt=PROMPTS["emoji"], max_tokens=12),
    "whole, with the prompt": dict(prompt=PROMPTS["chinese"], max_tokens=12, stream=False),
    "whole, without the prompt": dict(prompt=PROMPTS["english"], max_tokens=12, stream=False,
                                      exclude_input_in_output=True),
    "chat": dict(prompt="", max_tokens=8, messages=json.dumps([{"role": "user", "content": "Hi there"}])),
    "stop word": dict(prompt=PROMPTS["english"], max_tokens=24, stop_words=["e"]),
    "bad words": dict(prompt=PROMPTS["english"], max_tokens=12, bad_words=["the", " fox"]),
    "log probs": dict(prompt=PROMPTS["english"], max_tokens=6, return_log_probs=True,
                      return_prompt_log_probs=True, num_top_log_probs=3),
    "sampled": dict(prompt=PROMPTS["english"], max_tokens=12, temperature=0.9, seed=7),
    "vLLM's sampling_parameters": dict(prompt=PROMPTS["english"], max_tokens=None,
                                       sampling_parameters=json.dumps({"max_tokens": 6, "temperature": 0, "logprobs": 2})),
    "regex guide": dict(prompt="Email:", max_tokens=12, guided_decoding_guide_type="regex",
                        guided_decoding_guide="[a-z]{3,6}@[a-z]{3}\\.com"),
    "urgent": dict(prompt=PROMPTS["english"], max_tokens=6, priority=-1),
}


def fields(completion) -> dict:
    return {"text": completion.text, **{k: v for k, v in asdict(completion).items() if k in _SAME}}


@pytest.mark.parametrize("case", REQUESTS)
def test_text_to_dsa_llm_gets_the_ensembles_responses(served, case):
    kwargs = {"temperature": 0.0, **REQUESTS[case]}
    prompt, max_tokens = kwargs.pop("prompt"), kwargs.pop("max_tokens")
    through_ensemble = generate(served.grpc_url, prompt, max_tokens, timeout_s=120, **kwargs)
    direct = generate(served.grpc_url, prompt, max_tokens, timeout_s=120, model=DIRECT, **kwargs)
    assert through_ensemble.error is None, through_ensemble.error
    assert direct.final and fields(direct) == fields(through_ensemble)
    assert direct.num_output_tokens > 0 and direct.text


def test_text_to_dsa_llm_streams_the_offline_llms_text(served, offline_llm):
    direct = generate(served.grpc_url, PROMPTS["chinese"], 16, temperature=0.0, exclude_input_in_output=True,
                      timeout_s=120, model=DIRECT)
    [offline] = offline_llm.generate(PROMPTS["chinese"], SamplingParams(max_tokens=16, temperature=0))
    assert len(direct.deltas) > 1 and direct.text == offline.text
    assert (direct.finish_reason, direct.num_output_tokens) == ("length", 16)


def test_text_streams_to_dsa_llm_at_once_are_tokenized_side_by_side_and_each_is_the_offline_llms(served, offline_llm):
    prompts = [f"{PROMPTS['english']} {i} " * (1 + i % 3) for i in range(8)]
    assert_concurrent_streams_match(served, offline_llm, prompts, model=DIRECT)


def test_the_stream_cli_and_loadgen_send_to_dsa_llm(served, offline_llm, capsys, tmp_path):
    from dsa_client import loadgen, stream

    assert stream.main(["--url", served.grpc_url, "--model", DIRECT, "--max-tokens", "6", PROMPTS["english"]]) == 0
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(max_tokens=6, temperature=0))
    assert capsys.readouterr().out == offline.text + "\n"
    requests_before = _postprocessing_requests(served)
    assert loadgen.main(["--url", served.grpc_url, "--model", DIRECT, "--concurrency", "2", "--num-requests", "4",
                         "--input-len", "20", "--output-len", "4", "--out", str(tmp_path), "--no-progress"]) == 0
    [level] = json.loads((tmp_path / "results.json").read_text())["levels"]
    assert (level["errors"], level["output_tokens"]) == (0, 16)
    assert _postprocessing_requests(served) == requests_before      # nothing went through the ensemble


def _postprocessing_requests(served) -> int:
    url = f"http://127.0.0.1:{served.ports.http}/v2/models/postprocessing/stats"
    return json.load(urllib.request.urlopen(url, timeout=10))["model_stats"][0]["inference_stats"]["success"]["count"]


def test_text_to_dsa_llm_asking_for_two_outputs_gets_them_with_the_offline_llms_text(served, offline_llm):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(DIRECT, build_inputs(PROMPTS["english"], 6, stream=True, temperature=0.0,
                                                       exclude_input_in_output=True),
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in ("text_output", "finish_reason")])
        texts, final = [], False
        while not final:
            result, error = responses.get(timeout=60)
            assert error is None, error
            outputs = {o.name for o in result.get_response().outputs}
            assert outputs == {"text_output", "finish_reason"}, outputs
            texts.append(result.as_numpy("text_output")[0][0].decode())
            final = result.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()
        client.close()
    [offline] = offline_llm.generate(PROMPTS["english"], SamplingParams(max_tokens=6, temperature=0))
    assert "".join(texts) == offline.text


def test_n_samples_of_text_to_dsa_llm_are_the_ensembles(served):
    kwargs = dict(temperature=0.8, seed=3, num_return_sequences=3, timeout_s=120)
    through_ensemble = generate_samples(served.grpc_url, PROMPTS["english"], 8, **kwargs)
    direct = generate_samples(served.grpc_url, PROMPTS["english"], 8, model=DIRECT, **kwargs)
    assert len(direct) == 3 and [fields(c) for c in direct] == [fields(c) for c in through_ensemble]


def test_a_cancelled_text_stream_to_dsa_llm_frees_its_pages(served, metric):
    def in_flight():
        return metric("dsa_requests_running") + metric("dsa_requests_waiting")

    assert settle(in_flight, 0) == 0
    idle = metric("dsa_kv_pages_free", pool="mla")
    aborted_before = metric("dsa_requests_total", finish_reason="abort") or 0
    generated_before = metric("dsa_generation_tokens_total")
    [c] = generate_samples(served.grpc_url, PROMPTS["english"], 400, temperature=0.0, cancel_after=3,
                           timeout_s=120, model=DIRECT)
    assert len(c.times) == 3 and not c.final
    assert settle(in_flight, 0) == 0
    assert settle(lambda: metric("dsa_kv_pages_free", pool="mla"), idle, timeout_s=10) == idle
    assert settle(lambda: (metric("dsa_requests_total", finish_reason="abort") or 0) - aborted_before, 1) == 1
    time.sleep(0.5)
    assert metric("dsa_generation_tokens_total") - generated_before < 100


def _tensor(name, dtype, array):
    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


BAD_INPUTS = {
    "text and token ids": ("not both", build_inputs("hi", 4) + [_tensor("input_ids", "INT32", np.array([[5, 6]], np.int32))]),
    "bad words with token ids": ("bad_words_ids", [
        _tensor("input_ids", "INT32", np.array([[5, 6]], np.int32)), _tensor("max_tokens", "INT32", np.array([[4]], np.int32)),
        _tensor("bad_words", "BYTES", np.array([[b"the"]], dtype=object))]),
    "empty text": ("text_input is empty", build_inputs("", 4)),
    "invalid UTF-8": ("text_input is not valid UTF-8", build_inputs(b"ok \xff\xfe", 4)),
    "bad chat JSON": ("messages is not valid JSON", build_inputs("", 4, messages="[{")),
    "no prompt": ("a prompt is required", build_inputs("", 4)[1:]),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_text_to_dsa_llm_gets_an_error_naming_it_and_the_next_request_succeeds(served, case):
    words, inputs = BAD_INPUTS[case]
    c = generate(served.grpc_url, "", None, inputs=inputs, timeout_s=60, model=DIRECT)
    assert c.error is not None and words in c.error, c.error
    assert generate(served.grpc_url, "hello", 2, timeout_s=60, model=DIRECT).num_output_tokens == 2
