"""A dsa_llm request's input tensors -> prompt ids, SamplingParams and response options.

The tensor names are tensorrtllm_backend's (plus vllm_backend's `sampling_parameters` JSON), so
existing clients work unchanged. Every bad value raises ValueError naming the input and what is
allowed; the model turns that into an error response.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from dsa_backend.guided import Guide
from dsa_backend.sampling_params import MAX_TOP_LOGPROBS, SamplingParams

_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
# Input tensor -> (SamplingParams field, numpy kinds accepted). Aliases follow tensorrtllm_backend.
_SCALARS = {
    "max_tokens": ("max_tokens", "iu"),
    "temperature": ("temperature", "fiu"),
    "top_k": ("top_k", "iu"),
    "top_p": ("top_p", "fiu"),
    "min_p": ("min_p", "fiu"),
    "repetition_penalty": ("repetition_penalty", "fiu"),
    "presence_penalty": ("presence_penalty", "fiu"),
    "frequency_penalty": ("frequency_penalty", "fiu"),
    "min_tokens": ("min_tokens", "iu"),
    "min_length": ("min_tokens", "iu"),
    "seed": ("seed", "iu"),
    "random_seed": ("seed", "iu"),
    "num_return_sequences": ("n", "iu"),
    "num_top_log_probs": ("top_logprobs", "iu"),
}
_FLAGS = ("stream", "exclude_input_in_output", "return_log_probs", "return_prompt_log_probs")
# vllm_backend options that are not sampling parameters, and what this server supports of them.
_VLLM_SINGLE = {"best_of": 1, "use_beam_search": False}


@dataclass(frozen=True)
class LLMRequest:
    """What dsa_llm needs to serve one request."""

    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool = False
    exclude_input_in_output: bool = False
    priority: int = 0               # a lower number is served first (dsa_backend/scheduler.py)


def parse_request(inputs: Mapping[str, np.ndarray]) -> LLMRequest:
    """Build an LLMRequest from input arrays (batch dimension already removed)."""
    if "input_ids" not in inputs:
        raise ValueError("a prompt is required: text_input (or messages), or input_ids")
    prompt = _token_ids(inputs["input_ids"], "input_ids")
    if not prompt:
        raise ValueError("input_ids must hold at least one token id (is text_input empty?)")
    beam_width = _scalar(inputs, "beam_width", "iu")
    if beam_width is not None and beam_width != 1:
        raise ValueError(f"beam_width must be 1 (beam search is not supported), got {beam_width}")
    fields = _sampling_parameters(inputs.get("sampling_parameters"))
    priority = _scalar(inputs, "priority", "iu")
    if priority is not None and not -2**31 <= priority < 2**31:
        raise ValueError(f"priority must be a 32-bit integer, got {priority}")
    for name, (field, kinds) in _SCALARS.items():
        value = _scalar(inputs, name, kinds)
        if value is not None:
            fields[field] = value
    if "max_tokens" not in fields:
        raise ValueError("max_tokens is required (a positive integer)")
    flags = {name: bool(_scalar(inputs, name, "b")) for name in _FLAGS}
    stop = list(fields.pop("stop", ()) or ())
    if isinstance(stop, str):
        stop = [stop]
    stop += _strings(inputs.get("stop_words"), "stop_words")
    stop_ids = list(fields.pop("stop_token_ids", ()) or ())
    end_id = _scalar(inputs, "end_id", "iu")
    if end_id is not None:
        stop_ids.append(end_id)
    bad = list(fields.pop("bad_words_ids", ()) or ()) + _bad_words(inputs.get("bad_words_ids"))
    guide = _guide(inputs)
    if guide is not None:
        fields["guided_decoding"] = guide
    if flags["return_log_probs"]:
        fields["logprobs"] = True
    if flags["return_prompt_log_probs"]:
        fields["prompt_logprobs"] = True
    try:
        params = SamplingParams(**fields, stop=tuple(stop), stop_token_ids=tuple(stop_ids),
                                bad_words_ids=tuple(tuple(w) for w in bad))
    except TypeError as e:
        # A JSON value of the wrong type (a string temperature, say) fails inside the checks.
        raise ValueError(f"sampling_parameters has a value of the wrong type: {e}") from None
    return LLMRequest(prompt, params, stream=flags["stream"],
                      exclude_input_in_output=flags["exclude_input_in_output"], priority=priority or 0)


def _sampling_parameters(array: np.ndarray | None) -> dict[str, Any]:
    if array is None:
        return {}
    text = _strings(array, "sampling_parameters")
    if len(text) != 1:
        raise ValueError(f"sampling_parameters must be one JSON string, got {len(text)}")
    try:
        fields = json.loads(text[0])
    except json.JSONDecodeError as e:
        raise ValueError(f"sampling_parameters is not valid JSON: {e}") from None
    if not isinstance(fields, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    if "structured_outputs" in fields:   # vLLM's newer name for guided_decoding
        fields["guided_decoding"] = fields.pop("structured_outputs")
    for key, single in _VLLM_SINGLE.items():
        if key in fields and fields.pop(key) not in (single, None):
            raise ValueError(f"sampling_parameters.{key} must be {single}: samples are not ranked (n gives n of them)")
    unknown = sorted(set(fields) - _PARAM_FIELDS)
    if unknown:
        raise ValueError(f"sampling_parameters has unknown keys {unknown}; known: {sorted(_PARAM_FIELDS)}")
    if "logprobs" in fields:      # vLLM's count: the token's own log prob and that many alternatives
        count = _logprobs_count("logprobs", fields["logprobs"], MAX_TOP_LOGPROBS)
        fields["logprobs"] = count is not None
        if count:
            fields["top_logprobs"] = count
    if "prompt_logprobs" in fields:
        fields["prompt_logprobs"] = _logprobs_count("prompt_logprobs", fields["prompt_logprobs"], 0) is not None
    for key in ("max_tokens", "top_k", "min_tokens", "seed", "n"):
        # JSON numbers like 16.0 are fine; 16.5 is not an integer.
        if isinstance(fields.get(key), float) and fields[key].is_integer():
            fields[key] = int(fields[key])
    return fields


def _logprobs_count(key: str, value: Any, most: int) -> int | None:
    """vLLM's logprobs / prompt_logprobs: how many of the most likely tokens to return beside
    each token's own log prob (0: just its own), or null for none; true / false are taken too.
    None: no log probs."""
    if value is None or value is False:
        return None
    if value is True:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"sampling_parameters.{key} must be null, true, false or an integer in [0, {most}] "
                         f"(the most likely alternatives returned beside each token's own log prob), got {value!r}")
    return value


def _guide(inputs: Mapping[str, np.ndarray]) -> Guide | None:
    """tensorrtllm_backend's guided_decoding_guide_type (json, json_schema, regex, ebnf_grammar;
    and choice, a JSON list of strings) with its guided_decoding_guide."""
    kind = _strings(inputs.get("guided_decoding_guide_type"), "guided_decoding_guide_type")
    spec = _strings(inputs.get("guided_decoding_guide"), "guided_decoding_guide")
    if not kind:
        if spec:
            raise ValueError("guided_decoding_guide needs guided_decoding_guide_type (json_schema, regex, ...)")
        return None
    if len(kind) != 1 or len(spec) > 1:
        raise ValueError("guided_decoding_guide_type and guided_decoding_guide must hold one string each")
    return Guide(kind[0], spec[0] if spec else "")


def _scalar(inputs: Mapping[str, np.ndarray], name: str, kinds: str) -> Any:
    array = inputs.get(name)
    if array is None:
        return None
    if array.dtype.kind not in kinds:
        raise ValueError(f"{name} has dtype {array.dtype}; expected {_kind_names(kinds)}")
    if array.size != 1:
        raise ValueError(f"{name} must hold exactly one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0].item()


def _token_ids(array: np.ndarray, name: str) -> list[int]:
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} has dtype {array.dtype}; expected integers")
    if array.ndim > 1:
        raise ValueError(f"{name} must be one list of token ids, got shape {list(array.shape)}")
    return [int(t) for t in array.reshape(-1)]


def _strings(array: np.ndarray | None, name: str) -> list[str]:
    if array is None:
        return []
    if array.dtype.kind not in "OSU":
        raise ValueError(f"{name} has dtype {array.dtype}; expected strings (BYTES)")
    out = []
    for item in array.reshape(-1):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{name} is not valid UTF-8") from None
        out.append(str(item))
    return [s for s in out if s]


def _bad_words(array: np.ndarray | None) -> list[list[int]]:
    """tensorrtllm_backend's [2, N] layout: row 0 the ids of all words, row 1 each word's end offset."""
    if array is None or array.size == 0:
        return []
    if array.dtype.kind not in "iu" or array.ndim != 2 or array.shape[0] != 2:
        raise ValueError(f"bad_words_ids must be an integer array of shape [2, N], got {array.dtype} "
                         f"{list(array.shape)}")
    ids, ends = array[0].tolist(), [e for e in array[1].tolist() if e >= 0]
    starts = [0, *ends[:-1]]
    return [ids[s:e] for s, e in zip(starts, ends) if e > s]


def _kind_names(kinds: str) -> str:
    names = {"i": "int", "u": "uint", "f": "float", "b": "bool"}
    return " or ".join(names[k] for k in kinds)
