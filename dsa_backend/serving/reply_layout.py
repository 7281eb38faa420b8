"""One dsa_llm reply: its fields (ReplyFields), and the four tensors they travel in to
postprocessing, not one a field.

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

A request that sent dsa_llm text never takes this detour: its reply's fields are rendered as text
in place (dsa_backend.serving.reply_text).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsa_backend.detokenizer import TextWindow

INTS = ("text_start", "text_end", "num_input_tokens", "num_output_tokens", "num_cached_tokens",
        "total_accepted_draft_tokens", "total_draft_tokens", "skip_special_tokens", "sequence_index",
        "num_prompt_log_probs", "num_top_log_probs")
COUNTS = INTS[2:-2]              # the ints a reply carries besides its window and its lists' lengths
FLOATS = ("cum_log_probs", "acceptance_rate")
STRINGS = ("finish_reason", "request_id")


@dataclass(frozen=True)
class ReplyFields:
    window: TextWindow
    counts: dict[str, int]                  # by the names of COUNTS (skip_special_tokens as 0 / 1)
    floats: dict[str, float]                # by the names of FLOATS
    finish_reason: str                      # "" until the last reply
    request_id: str                         # dsa_llm's, for postprocessing to ask it to abort
    log_probs: list[float] = ()             # of this reply's tokens (when the request asked)
    prompt_log_probs: list[float] = ()      # on the reply with the first tokens
    top_log_probs: list[tuple[int, float]] = ()   # (token id, log prob) pairs, token by token


def pack(reply: ReplyFields) -> dict[str, np.ndarray]:
    window = reply.window
    ints = [window.text_start, window.text_end, *(reply.counts[k] for k in COUNTS),
            len(reply.prompt_log_probs), len(reply.top_log_probs)]
    floats = [reply.floats[k] for k in FLOATS]
    floats += reply.prompt_log_probs
    floats += reply.log_probs
    floats += [x for pair in reply.top_log_probs for x in pair]
    return {"token_window": np.array(window.token_ids, dtype=np.int32),
            "reply_ints": np.array(ints, dtype=np.int32),
            "reply_floats": np.array(floats, dtype=np.float32),
            "reply_strings": np.array([reply.finish_reason.encode(), reply.request_id.encode()], dtype=np.object_)}


def unpack(tensors: dict[str, np.ndarray]) -> ReplyFields:
    ints, floats, strings = tensors["reply_ints"], tensors["reply_floats"], tensors["reply_strings"]
    if ints.shape != (len(INTS),) or floats.shape[0] < len(FLOATS) or strings.shape != (len(STRINGS),):
        raise ValueError(f"a reply holds {len(INTS)} ints, at least {len(FLOATS)} floats and {len(STRINGS)} "
                         f"strings; got {list(ints.shape)}, {list(floats.shape)}, {list(strings.shape)}")
    ints, floats = ints.tolist(), floats.tolist()
    prompt_end = len(FLOATS) + ints[-2]
    top_start = len(floats) - 2 * ints[-1]
    if not len(FLOATS) <= prompt_end <= top_start:
        raise ValueError(f"a reply's log prob counts ({ints[-2:]}) do not fit its {len(floats)} floats")
    top = floats[top_start:]
    return ReplyFields(
        TextWindow(tensors["token_window"].tolist(), ints[0], ints[1]),
        counts=dict(zip(COUNTS, ints[2:-2])), floats=dict(zip(FLOATS, floats)),
        finish_reason=_text(strings[0]), request_id=_text(strings[1]),
        log_probs=floats[prompt_end:top_start], prompt_log_probs=floats[len(FLOATS):prompt_end],
        top_log_probs=list(zip([int(t) for t in top[::2]], top[1::2])))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
