"""dsa_backend.serving.response_stream: engine outputs -> dsa_llm replies."""

from __future__ import annotations

import numpy as np
import pytest

from dsa_backend.detokenizer import window_text
from dsa_backend.engine import RequestOutput
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.serving import reply_layout
from dsa_backend.serving.reply_text import client_outputs
from dsa_backend.serving.request_params import LLMRequest
from dsa_backend.serving.response_stream import ResponseStream


def outputs(tokenizer, text, prompt_len=3, reason="length"):
    ids = tokenizer.encode(text)
    return [RequestOutput("r", [t], None, None, i == len(ids) - 1, reason if i == len(ids) - 1 else None,
                          prompt_len, i + 1) for i, t in enumerate(ids)]


def fields(reply):
    """What the client reads out of a reply, by the ensemble's output names."""
    return client_outputs(None, reply.fields, wanted=set(reply_layout.COUNTS) | {
        *reply_layout.FLOATS, "finish_reason", "prompt_log_probs", "output_log_probs", "top_token_ids", "top_log_probs"})


def reply_text(tokenizer, reply):
    return window_text(tokenizer, reply.fields.window)


def run(tokenizer, request, outs):
    stream = ResponseStream("r", request, tokenizer, arrival=0.0)
    return [r for i, out in enumerate(outs) if (r := stream.on_output([out], now=0.1 * (i + 1)))]


def test_streaming_sends_one_reply_per_step_and_the_last_is_final(tokenizer):
    text = "Hello 世界 🎉"
    request = LLMRequest([5, 6, 7], SamplingParams(max_tokens=16), stream=True)
    replies = run(tokenizer, request, outputs(tokenizer, text))
    assert "".join(reply_text(tokenizer, r) for r in replies) == text
    assert [r.final for r in replies] == [False] * (len(replies) - 1) + [True]
    assert fields(replies[-1])["finish_reason"][0] == b"length"
    assert replies[-1].fields.request_id == "r"
    assert replies[0].ttft_s == 0.1 and replies[1].itl_s == 0.1


def test_non_streaming_sends_one_reply_with_the_prompt_unless_excluded(tokenizer):
    prompt = tokenizer.encode("Question:")
    for exclude, expected in ((True, " answer 世界"), (False, "Question: answer 世界")):
        request = LLMRequest(prompt, SamplingParams(max_tokens=16), exclude_input_in_output=exclude)
        replies = [r for r in run(tokenizer, request, outputs(tokenizer, " answer 世界")) if r.fields]
        assert len(replies) == 1 and replies[0].final
        assert reply_text(tokenizer, replies[0]) == expected


def test_a_stop_string_ends_the_reply_early(tokenizer):
    request = LLMRequest([5], SamplingParams(max_tokens=16, stop=("STOP",)), stream=True)
    stream = ResponseStream("r", request, tokenizer, arrival=0.0)
    replies = [stream.on_output([out], 1.0) for out in outputs(tokenizer, "go go STOP more words")]
    final = [i for i, r in enumerate(replies) if r and r.final][0]
    assert stream.stopped_by_string
    assert all(r is None for r in replies[final + 1:])
    assert fields(replies[final])["finish_reason"][0] == b"stop"
    assert "".join(reply_text(tokenizer, r) for r in replies[:final + 1]) == "go go "


def test_an_engine_error_becomes_a_final_error_reply(tokenizer):
    stream = ResponseStream("r", LLMRequest([5], SamplingParams(max_tokens=4)), tokenizer, arrival=0.0)
    reply = stream.on_output([RequestOutput("r", [], None, None, True, "error", 1, 0, error="boom")], 1.0)
    assert reply.final and reply.error == "boom" and reply.fields is None


def test_log_probs_are_sent_only_when_asked(tokenizer):
    request = LLMRequest([5], SamplingParams(max_tokens=2, logprobs=True), stream=True)
    out = RequestOutput("r", [100], [-0.5], -0.5, True, "length", 1, 1)
    reply = ResponseStream("r", request, tokenizer, arrival=0.0).on_output([out], 1.0)
    assert np.allclose(fields(reply)["output_log_probs"], [-0.5])
    assert np.allclose(fields(reply)["cum_log_probs"], [-0.5])


def test_acceptance_counts_are_cumulative_and_an_error_output_does_not_reset_them(tokenizer):
    request = LLMRequest([5, 6, 7], SamplingParams(max_tokens=16), stream=True)
    stream = ResponseStream("r", request, tokenizer, arrival=0.0)
    # (new tokens, drafted so far, accepted so far)
    steps = [([10], 0, 0), ([11, 12], 2, 1), ([13], 4, 1), ([14, 15, 16], 6, 3)]
    replies = [stream.on_output([RequestOutput("r", ids, None, None, i == 3, "length" if i == 3 else None, 3, 0,
                                               num_draft_tokens=d, num_accepted_draft_tokens=a)], now=0.1 * (i + 1))
               for i, (ids, d, a) in enumerate(steps)]
    assert [int(fields(r)["total_draft_tokens"][0]) for r in replies] == [0, 2, 4, 6]
    assert [int(fields(r)["total_accepted_draft_tokens"][0]) for r in replies] == [0, 1, 1, 3]
    assert [float(fields(r)["acceptance_rate"][0]) for r in replies] == [0.0, 0.5, 0.25, 0.5]
    assert [(r.new_draft_tokens, r.new_accepted_draft_tokens) for r in replies] == [(0, 0), (2, 1), (2, 0), (2, 2)]
    assert [r.accept_lengths for r in replies] == [(), (2,), (1,), (3,)]
    assert stream.acceptance_rate == 0.5


def test_without_speculation_the_acceptance_outputs_are_zero(tokenizer):
    request = LLMRequest([5, 6, 7], SamplingParams(max_tokens=16), stream=False)
    [reply] = run(tokenizer, request, outputs(tokenizer, "Hello"))
    o = fields(reply)
    assert (o["acceptance_rate"][0], o["total_accepted_draft_tokens"][0], o["total_draft_tokens"][0]) == (0, 0, 0)
    assert o["acceptance_rate"].dtype == "float32" and o["total_draft_tokens"].dtype == "int32"


def test_one_reply_for_several_steps_carries_what_one_reply_a_step_would(tokenizer):
    """The sender merges the steps it fell behind on: the text, counts and log probs are the same."""
    text = "Hello 世界 🎉 and more words"
    request = LLMRequest([5, 6, 7], SamplingParams(max_tokens=32, logprobs=True), stream=True)
    ids = tokenizer.encode(text)
    steps = [RequestOutput("r", [t], [-0.1 * (i + 1)], -0.1 * sum(range(1, i + 2)), i == len(ids) - 1,
                           "length" if i == len(ids) - 1 else None, 3, i + 1,
                           num_draft_tokens=2 * (i + 1), num_accepted_draft_tokens=i + 1 - i % 2)
             for i, t in enumerate(ids)]
    stream = ResponseStream("r", request, tokenizer, arrival=0.0)
    groups = [steps[:1], steps[1:4], steps[4:5], steps[5:]]
    replies = [stream.on_output(group, now=float(i + 1)) for i, group in enumerate(groups)]
    assert "".join(reply_text(tokenizer, r) for r in replies) == text
    assert [r.new_tokens for r in replies] == [len(g) for g in groups]
    assert [r.final for r in replies] == [False, False, False, True]
    assert np.allclose(np.concatenate([fields(r)["output_log_probs"] for r in replies]),
                       [-0.1 * (i + 1) for i in range(len(ids))])
    assert np.isclose(fields(replies[-1])["cum_log_probs"][0], steps[-1].cumulative_logprob)
    assert int(fields(replies[-1])["num_output_tokens"][0]) == len(ids)
    # each verify step keeps its own accept length inside a merged reply
    accepted = [0] + [s.num_accepted_draft_tokens for s in steps]
    assert [length for r in replies for length in r.accept_lengths] == [
        b - a + 1 for a, b in zip(accepted, accepted[1:])]
    assert sum(r.new_draft_tokens for r in replies) == 2 * len(ids)
    assert sum(r.new_accepted_draft_tokens for r in replies) == steps[-1].num_accepted_draft_tokens
    # TTFT at the first reply, ITL per token since the previous reply
    assert replies[0].ttft_s == 1.0 and replies[1].itl_s == 1.0 / 3


def test_the_reply_layout_round_trips_every_field(tokenizer):
    request = LLMRequest([5, 6], SamplingParams(max_tokens=4, logprobs=True, top_logprobs=1, skip_special_tokens=False),
                         stream=True)
    # values exact in float32, so that the round trip compares equal
    out = RequestOutput("r-9", [100, 101], [-0.25, -0.5], -0.75, True, "length", 2, 2, num_draft_tokens=4,
                        num_accepted_draft_tokens=2, num_cached_tokens=1, prompt_logprobs=[None, -1.5],
                        new_top_logprobs=[((100, -0.25),), ((7, -0.125),)])
    reply = ResponseStream("r-9", request, tokenizer, arrival=0.0, index=2).on_output([out], 1.0).fields
    tensors = reply_layout.pack(reply)
    assert sorted(tensors) == ["reply_floats", "reply_ints", "reply_strings", "token_window"]
    assert [tensors[k].dtype for k in sorted(tensors)] == [np.float32, np.int32, object, np.int32]
    assert reply_layout.unpack(tensors) == reply
    assert reply.request_id == "r-9" and reply.window.token_ids[-2:] == [100, 101]
    assert reply.counts == {"num_input_tokens": 2, "num_output_tokens": 2, "num_cached_tokens": 1,
                            "total_accepted_draft_tokens": 2, "total_draft_tokens": 4, "skip_special_tokens": 0,
                            "sequence_index": 2}
    assert reply.floats == {"cum_log_probs": -0.75, "acceptance_rate": 0.5} and reply.finish_reason == "length"


def test_client_outputs_have_the_dtypes_of_the_ensemble_outputs(tokenizer):
    request = LLMRequest([5, 6], SamplingParams(max_tokens=4, logprobs=True), stream=True)
    out = RequestOutput("r", [100, 101], [-0.25, -0.5], -0.75, True, "length", 2, 2, num_draft_tokens=3,
                        num_accepted_draft_tokens=1)
    o = client_outputs(tokenizer, ResponseStream("r", request, tokenizer, arrival=0.0).on_output([out], 1.0).fields)
    assert o["num_cached_tokens"].dtype == "int32" and o["sequence_index"].tolist() == [0]
    assert np.allclose(o["output_log_probs"], [-0.25, -0.5]) and np.isclose(o["cum_log_probs"][0], -0.75)
    assert np.isclose(o["acceptance_rate"][0], 1 / 3) and o["acceptance_rate"].dtype == "float32"
    assert o["prompt_log_probs"].shape == (0,) and o["prompt_log_probs"].dtype == "float32"
    assert o["top_token_ids"].shape == (0,) and o["top_token_ids"].dtype == "int32"
    assert o["top_log_probs"].shape == (0,) and o["finish_reason"].tolist() == [b"length"]
    assert "skip_special_tokens" not in o


def test_top_log_probs_travel_token_by_token_beside_the_output_log_probs(tokenizer):
    request = LLMRequest([5, 6], SamplingParams(max_tokens=4, logprobs=True, top_logprobs=2), stream=True)
    out = RequestOutput("r", [100, 101], [-0.25, -0.5], -0.75, False, None, 2, 2,
                        new_top_logprobs=[((100, -0.25), (7, -2.0)), ((129279, -0.5), (101, -0.75))])
    o = fields(ResponseStream("r", request, tokenizer, arrival=0.0).on_output([out], 1.0))
    assert o["top_token_ids"].tolist() == [100, 7, 129279, 101] and o["top_token_ids"].dtype == "int32"
    assert np.allclose(o["top_log_probs"], [-0.25, -2.0, -0.5, -0.75])
    assert np.allclose(o["output_log_probs"], [-0.25, -0.5])


@pytest.mark.parametrize("stream", [True, False])
def test_prompt_log_probs_come_once_on_the_reply_with_the_first_tokens(tokenizer, stream):
    request = LLMRequest([5, 6, 7], SamplingParams(max_tokens=4, logprobs=True, prompt_logprobs=True), stream=stream)
    first = RequestOutput("r", [100], [-0.5], -0.5, False, None, 3, 1, prompt_logprobs=[None, -1.5, -2.5])
    last = RequestOutput("r", [101], [-0.25], -0.75, True, "length", 3, 2)
    stream_ = ResponseStream("r", request, tokenizer, arrival=0.0)
    replies = [stream_.on_output([first], 1.0), stream_.on_output([last], 2.0)]
    sent = [fields(r) for r in replies if r.fields is not None]
    assert len(sent) == (2 if stream else 1)
    assert np.allclose(sent[0]["prompt_log_probs"], [-1.5, -2.5])
    assert np.allclose(np.concatenate([f["output_log_probs"] for f in sent]), [-0.5, -0.25])
    assert all(f["prompt_log_probs"].shape == (0,) for f in sent[1:])


def test_a_reply_with_missing_fields_is_refused_by_name():
    tensors = {"token_window": np.array([1], dtype=np.int32), "reply_ints": np.zeros(3, dtype=np.int32),
               "reply_floats": np.zeros(2, dtype=np.float32), "reply_strings": np.array([b"", b"r"], dtype=object)}
    with pytest.raises(ValueError, match="11 ints"):
        reply_layout.unpack(tensors)


def test_a_reply_whose_log_prob_counts_overrun_its_floats_is_refused():
    ints = np.zeros(len(reply_layout.INTS), dtype=np.int32)
    ints[-2] = 3                                     # three prompt log probs, in a reply of two floats
    tensors = {"token_window": np.array([1], dtype=np.int32), "reply_ints": ints,
               "reply_floats": np.zeros(2, dtype=np.float32), "reply_strings": np.array([b"", b"r"], dtype=object)}
    with pytest.raises(ValueError, match="do not fit its 2 floats"):
        reply_layout.unpack(tensors)


def test_a_reply_as_client_outputs_holds_the_delta_and_every_field_or_only_those_wanted(tokenizer):
    request = LLMRequest([5, 6], SamplingParams(max_tokens=4, logprobs=True, top_logprobs=2), stream=True)
    out = RequestOutput("r", [100], [-0.25], -0.25, False, None, 2, 1, new_top_logprobs=[((11, -0.5), (12, -1.5))])
    [reply] = run(tokenizer, request, [out])
    every = client_outputs(tokenizer, reply.fields)
    assert every["text_output"].tolist() == [reply_text(tokenizer, reply).encode()]
    assert set(every) == {"text_output", "top_tokens", *fields(reply)}
    assert every["top_tokens"].tolist() == [tokenizer.decode([t], skip_special_tokens=False).encode() for t in (11, 12)]
    some = client_outputs(tokenizer, reply.fields, wanted={"text_output", "num_output_tokens", "token_window"})
    assert set(some) == {"text_output", "num_output_tokens"}
    assert some["num_output_tokens"].tolist() == every["num_output_tokens"].tolist() == [1]


def test_postprocessing_reads_what_the_direct_path_renders(tokenizer):
    """The ensemble's reply takes the tensors' detour; a direct one is rendered in place: same outputs."""
    request = LLMRequest([5, 6], SamplingParams(max_tokens=8, logprobs=True, top_logprobs=1, prompt_logprobs=True),
                         stream=True)
    steps = [RequestOutput("r", [100], [-0.25], -0.25, False, None, 2, 1, prompt_logprobs=[None, -3.0],
                           new_top_logprobs=[((100, -0.25),)]),
             RequestOutput("r", [101, 102], [-0.5, -1.0], -1.75, True, "length", 2, 3,
                           new_top_logprobs=[((101, -0.5),), ((9, -0.75),)])]
    for reply in run(tokenizer, request, steps):
        direct = client_outputs(tokenizer, reply.fields)
        detour = client_outputs(tokenizer, reply_layout.unpack(reply_layout.pack(reply.fields)))
        assert direct.keys() == detour.keys()
        for name in direct:
            assert direct[name].dtype == detour[name].dtype and direct[name].tolist() == detour[name].tolist(), name
