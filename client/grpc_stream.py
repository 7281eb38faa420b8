"""One generation request over a Triton gRPC stream, with the arrival time of every response.

The `dsa` ensemble is decoupled, so even a non-streamed completion goes over a bidirectional
stream; it arrives as one response. The last response carries Triton's final flag, so no empty
final response is asked for. A request for n samples (num_return_sequences) streams them
interleaved, each response naming its sample by sequence_index (generate_samples).
"""

from __future__ import annotations

import queue
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import tritonclient.grpc as grpcclient

MODEL = "dsa"
# name -> Triton dtype of the ensemble's optional scalar inputs
_SCALAR_TYPES = {
    "temperature": "FP32", "top_k": "INT32", "top_p": "FP32", "min_p": "FP32",
    "repetition_penalty": "FP32", "presence_penalty": "FP32", "frequency_penalty": "FP32",
    "min_tokens": "INT32", "min_length": "INT32", "seed": "UINT64", "random_seed": "UINT64",
    "end_id": "INT32", "pad_id": "INT32", "beam_width": "INT32", "num_return_sequences": "INT32", "priority": "INT32",
    "stream": "BOOL", "exclude_input_in_output": "BOOL", "return_log_probs": "BOOL",
    "return_prompt_log_probs": "BOOL", "num_top_log_probs": "INT32",
    "sampling_parameters": "BYTES", "messages": "BYTES",
    "guided_decoding_guide_type": "BYTES", "guided_decoding_guide": "BYTES",
}
_LIST_TYPES = {"stop_words": "BYTES", "bad_words": "BYTES"}
# The outputs a Completion reads, the log probs' only when asked for: a server builds fewer
# tensors a response (dsa_llm, for text sent to it, builds only those asked for).
_OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens", "num_cached_tokens",
            "cum_log_probs", "total_draft_tokens", "total_accepted_draft_tokens", "sequence_index")
_LOG_PROB_OUTPUTS = ("output_log_probs", "prompt_log_probs", "top_token_ids", "top_log_probs", "top_tokens")
_LOG_PROB_INPUTS = ("return_log_probs", "return_prompt_log_probs", "num_top_log_probs", "sampling_parameters")
_NP = {"FP32": np.float32, "INT32": np.int32, "UINT64": np.uint64, "BOOL": np.bool_, "BYTES": np.object_}


@dataclass
class Completion:
    """What came back for one request: text deltas with their arrival times, and the totals."""

    deltas: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)     # seconds since the request was sent
    finish_reason: str | None = None
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0         # prompt tokens the server found in its prefix cache
    cum_log_prob: float | None = None
    output_log_probs: list[float] = field(default_factory=list)
    prompt_log_probs: list[float] = field(default_factory=list)   # of prompt tokens 1 .. n-1, when asked
    # num_top_log_probs N: N entries a token, most likely first
    top_token_ids: list[int] = field(default_factory=list)
    top_log_probs: list[float] = field(default_factory=list)
    top_tokens: list[str] = field(default_factory=list)
    draft_tokens: int = 0              # speculative decoding, cumulative (0 when the server does not draft)
    accepted_draft_tokens: int = 0
    error: str | None = None
    final: bool = False

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    @property
    def ttft_s(self) -> float | None:
        """Time to the first response with text."""
        return next((t for d, t in zip(self.deltas, self.times) if d), None)

    @property
    def e2e_s(self) -> float | None:
        return self.times[-1] if self.times else None


def build_inputs(prompt: str, max_tokens: int | None, **params: Any) -> list[grpcclient.InferInput]:
    """The ensemble's input tensors, each with batch dimension 1; None values are left out."""
    tensors = [("text_input", "BYTES", [prompt.encode("utf-8") if isinstance(prompt, str) else prompt])]
    if max_tokens is not None:
        tensors.append(("max_tokens", "INT32", [max_tokens]))
    for name, value in params.items():
        if value is None:
            continue
        if name in _LIST_TYPES:
            tensors.append((name, _LIST_TYPES[name], [v.encode("utf-8") for v in value]))
        elif name in _SCALAR_TYPES:
            dtype = _SCALAR_TYPES[name]
            tensors.append((name, dtype, [value.encode("utf-8") if isinstance(value, str) else value]))
        else:
            raise ValueError(f"unknown input {name!r}; known: {sorted({**_SCALAR_TYPES, **_LIST_TYPES})}")
    inputs = []
    for name, dtype, values in tensors:
        array = np.array([values], dtype=_NP[dtype])
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def generate(url: str, prompt: str, max_tokens: int | None, **kwargs: Any) -> Completion:
    """Send one request and collect its responses until the final one (or an error); the
    arguments are generate_samples'."""
    completions = generate_samples(url, prompt, max_tokens, **kwargs)
    if len(completions) != 1:
        raise ValueError(f"the request returned {len(completions)} samples; use generate_samples")
    return completions[0]


def generate_samples(url: str, prompt: str, max_tokens: int | None, *, stream: bool = True,
                     timeout_s: float = 600, on_delta: Callable[[str], None] | None = None,
                     cancel_after: int | None = None, inputs: list[grpcclient.InferInput] | None = None,
                     model: str = MODEL, all_outputs: bool = False, **params: Any) -> list[Completion]:
    """Send one request and collect its responses until the final one (or an error): a
    Completion a sample, by sequence_index (one unless num_return_sequences asks for more).

    `cancel_after` closes the stream, cancelling the request, after that many responses.
    `inputs` replaces the tensors built from prompt/max_tokens/params (to send malformed ones).
    Only the outputs a Completion reads are asked for, unless `all_outputs` (or `inputs`).
    on_delta hears sample 0's text.
    """
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    samples: dict[int, Completion] = {}
    start = time.perf_counter()
    client.start_stream(callback=lambda result, error: responses.put((result, error, time.perf_counter())))
    try:
        client.async_stream_infer(model, inputs or build_inputs(prompt, max_tokens, stream=stream, **params),
                                  outputs=None if all_outputs or inputs else requested_outputs(params),
                                  request_id=uuid.uuid4().hex[:16])
        deadline = start + timeout_s
        received, final = 0, False
        while not final:
            try:
                result, error, at = responses.get(timeout=max(deadline - time.perf_counter(), 0.001))
            except queue.Empty:
                raise TimeoutError(f"no final response within {timeout_s} s") from None
            received += 1
            if error is not None:       # the request failed: every sample says so
                for completion in samples.values() or [samples.setdefault(0, Completion())]:
                    completion.error, completion.final = str(error), True
                    completion.times.append(at - start)
                    completion.deltas.append("")
                break
            index = result.as_numpy("sequence_index")
            completion = samples.setdefault(int(index.reshape(-1)[0]) if index is not None else 0, Completion())
            completion.times.append(at - start)
            _add_response(completion, result)
            final = result.get_response().parameters["triton_final_response"].bool_param
            if on_delta and completion is samples.get(0) and completion.deltas[-1]:
                on_delta(completion.deltas[-1])
            if cancel_after is not None and received >= cancel_after and not final:
                client.stop_stream(cancel_requests=True)
                break
        for completion in samples.values():
            completion.final = final or completion.final
    finally:
        client.stop_stream()
        client.close()
    return [samples[i] for i in sorted(samples)]


def requested_outputs(params: dict[str, Any]) -> list[grpcclient.InferRequestedOutput]:
    """The outputs a request with these inputs needs: the log probs' only where they are asked for."""
    log_probs = any(params.get(name) for name in _LOG_PROB_INPUTS)
    return [grpcclient.InferRequestedOutput(name) for name in _OUTPUTS + (_LOG_PROB_OUTPUTS if log_probs else ())]


def _add_response(completion: Completion, result) -> None:
    text = result.as_numpy("text_output")
    completion.deltas.append(b"".join(text.reshape(-1)).decode("utf-8") if text is not None else "")
    reason = result.as_numpy("finish_reason")
    if reason is not None and reason.reshape(-1)[0]:
        completion.finish_reason = reason.reshape(-1)[0].decode()
    for output, name in (("num_input_tokens", "num_input_tokens"), ("num_output_tokens", "num_output_tokens"),
                         ("num_cached_tokens", "num_cached_tokens"), ("total_draft_tokens", "draft_tokens"),
                         ("total_accepted_draft_tokens", "accepted_draft_tokens")):
        value = result.as_numpy(output)
        if value is not None:
            setattr(completion, name, int(value.reshape(-1)[0]))
    cum = result.as_numpy("cum_log_probs")
    if cum is not None:
        completion.cum_log_prob = float(cum.reshape(-1)[0])
    for output in ("output_log_probs", "prompt_log_probs", "top_token_ids", "top_log_probs"):
        values = result.as_numpy(output)
        if values is not None:
            getattr(completion, output).extend(values.reshape(-1).tolist())
    tokens = result.as_numpy("top_tokens")
    if tokens is not None:
        completion.top_tokens += [t.decode("utf-8", errors="replace") for t in tokens.reshape(-1)]
