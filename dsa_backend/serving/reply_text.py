"""A dsa_llm reply as the client reads it: the text delta its window stands for and its fields
under the `dsa` ensemble's output names. postprocessing does this for the ensemble (after
unpacking the reply's tensors); dsa_llm does it itself for a request that sent it text
(docs/SERVING.md, "Text straight to dsa_llm")."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from dsa_backend.detokenizer import window_text
from dsa_backend.serving.reply_layout import ReplyFields
from dsa_backend.tokenizer import Tokenizer


def strings(values: list[str]) -> np.ndarray:
    """A BYTES array of UTF-8 encoded strings."""
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def client_outputs(tokenizer: Tokenizer, reply: ReplyFields,
                   wanted: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The outputs by the ensemble's names, only those in `wanted` when given: every output is a
    tensor to build and copy, and Triton drops those a client did not ask for anyway."""
    def want(name: str) -> bool:
        return wanted is None or name in wanted

    outputs = {name: np.array([value], dtype=np.int32) for name, value in reply.counts.items()
               if name != "skip_special_tokens" and want(name)}
    outputs |= {name: np.array([value], dtype=np.float32) for name, value in reply.floats.items() if want(name)}
    log_probs = {"prompt_log_probs": reply.prompt_log_probs, "output_log_probs": reply.log_probs,
                 "top_log_probs": [log_prob for _, log_prob in reply.top_log_probs]}
    outputs |= {name: np.array(values, dtype=np.float32) for name, values in log_probs.items() if want(name)}
    top_ids = [token for token, _ in reply.top_log_probs]
    if want("top_token_ids"):
        outputs["top_token_ids"] = np.array(top_ids, dtype=np.int32)
    if want("top_tokens"):
        outputs["top_tokens"] = strings([tokenizer.decode([t], skip_special_tokens=False) for t in top_ids])
    if want("finish_reason"):
        outputs["finish_reason"] = strings([reply.finish_reason])
    if want("text_output"):
        skip_special_tokens = bool(reply.counts["skip_special_tokens"])
        outputs["text_output"] = strings([window_text(tokenizer, reply.window, skip_special_tokens)])
    return outputs
