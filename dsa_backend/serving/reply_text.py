"""A dsa_llm reply as the client reads it: the text delta its window stands for and its fields
under the `dsa` ensemble's output names. postprocessing does this for the ensemble; dsa_llm does
it itself for a request that sent it text (docs/SERVING.md, "Text straight to dsa_llm")."""

from __future__ import annotations

import numpy as np

from dsa_backend.detokenizer import window_text
from dsa_backend.serving import reply_layout
from dsa_backend.tokenizer import Tokenizer


def strings(values: list[str]) -> np.ndarray:
    """A BYTES array of UTF-8 encoded strings."""
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def client_outputs(tokenizer: Tokenizer, reply: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    """-> (the outputs by the ensemble's names, dsa_llm's id for the request)."""
    window, fields, request_id = reply_layout.unpack(reply)
    skip = bool(fields.pop("skip_special_tokens")[0])
    top_tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in fields["top_token_ids"].tolist()]
    return {"text_output": strings([window_text(tokenizer, window, skip)]), "top_tokens": strings(top_tokens),
            **fields}, request_id
