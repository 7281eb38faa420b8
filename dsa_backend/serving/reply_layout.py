"""The tensors of one dsa_llm reply, as postprocessing reads them: four, not one a field.

Every tensor of a response costs the python backend a copy and its bookkeeping on both sides of
each stub, and dsa_llm's sender builds them holding the GIL that the engine thread needs. So the
scalar fields travel in one tensor a dtype (docs/PERFORMANCE.md, "Serving: the engine against the
served engine"):

- token_window   INT32 [n]       the detokenizer window (dsa_backend.detokenizer.TextWindow)
- reply_ints     INT32 [11]      INTS, in order
- reply_floats   FP32  [2 + p + k + 2t]  FLOATS, the p prompt log probs (num_prompt_log_probs; on
                                 the reply with the first tokens), the k log probs of this reply's
                                 tokens, then t (token id, log prob) pairs of their most likely
                                 tokens (num_top_log_probs; ids below 2^24 are exact in float32)
- reply_strings  BYTES [2]       STRINGS
"""

from __future__ import annotations

import numpy as np

from dsa_backend.detokenizer import TextWindow

INTS = ("text_start", "text_end", "num_input_tokens", "num_output_tokens", "num_cached_tokens",
        "total_accepted_draft_tokens", "total_draft_tokens", "skip_special_tokens", "sequence_index",
        "num_prompt_log_probs", "num_top_log_probs")
FLOATS = ("cum_log_probs", "acceptance_rate")
STRINGS = ("finish_reason", "request_id")


def pack(window: TextWindow, ints: dict[str, int], floats: dict[str, float], log_probs: list[float],
         strings: dict[str, str], prompt_log_probs: list[float] = (),
         top_log_probs: list[tuple[int, float]] = ()) -> dict[str, np.ndarray]:
    """ints / floats / strings: every name of INTS but the window's two and the log probs' counts,
    of FLOATS, of STRINGS. top_log_probs: (token id, log prob) pairs, token by token."""
    ints = {"text_start": window.text_start, "text_end": window.text_end, **ints,
            "num_prompt_log_probs": len(prompt_log_probs), "num_top_log_probs": len(top_log_probs)}
    return {"token_window": np.array(window.token_ids, dtype=np.int32),
            "reply_ints": np.array([ints[k] for k in INTS], dtype=np.int32),
            "reply_floats": np.array([floats[k] for k in FLOATS] + list(prompt_log_probs) + list(log_probs)
                                     + [x for pair in top_log_probs for x in pair], dtype=np.float32),
            "reply_strings": np.array([strings[k].encode() for k in STRINGS], dtype=np.object_)}


def unpack(tensors: dict[str, np.ndarray]) -> tuple[TextWindow, dict[str, np.ndarray], str]:
    """-> (the window, the ensemble's outputs other than text_output by name (skip_special_tokens
    among them, as a bool), the request id)."""
    ints, floats, strings = tensors["reply_ints"], tensors["reply_floats"], tensors["reply_strings"]
    if ints.shape != (len(INTS),) or floats.shape[0] < len(FLOATS) or strings.shape != (len(STRINGS),):
        raise ValueError(f"a reply holds {len(INTS)} ints, at least {len(FLOATS)} floats and {len(STRINGS)} "
                         f"strings; got {list(ints.shape)}, {list(floats.shape)}, {list(strings.shape)}")
    window = TextWindow(tensors["token_window"].tolist(), int(ints[0]), int(ints[1]))
    fields = {name: ints[i:i + 1] for i, name in enumerate(INTS) if i >= 2}
    fields["skip_special_tokens"] = fields["skip_special_tokens"].astype(bool)
    fields |= {name: floats[i:i + 1] for i, name in enumerate(FLOATS)}
    prompt_end = len(FLOATS) + int(fields.pop("num_prompt_log_probs")[0])
    top_start = floats.shape[0] - 2 * int(fields.pop("num_top_log_probs")[0])
    if not len(FLOATS) <= prompt_end <= top_start:
        raise ValueError(f"a reply's log prob counts ({list(ints[-2:])}) do not fit its {floats.shape[0]} floats")
    fields["prompt_log_probs"] = floats[len(FLOATS):prompt_end]
    fields["output_log_probs"] = floats[prompt_end:top_start]
    fields["top_token_ids"] = floats[top_start::2].astype(np.int32)
    fields["top_log_probs"] = floats[top_start + 1::2]
    fields["finish_reason"] = strings[:1]
    request_id = strings[1]
    return window, fields, request_id.decode() if isinstance(request_id, bytes) else str(request_id)
