"""A dsa_llm reply as the client reads it: the text delta its window stands for and its fields
under the `dsa` ensemble's output names. postprocessing does this for the ensemble; dsa_llm does
it itself for a request that sent it text (docs/SERVING.md, "Text straight to dsa_llm")."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from dsa_backend.detokenizer import window_text
from dsa_backend.serving import reply_layout
from dsa_backend.tokenizer import Tokenizer


def strings(values: list[str]) -> np.ndarray:
    """A BYTES array of UTF-8 encoded strings."""
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def client_outputs(tokenizer: Tokenizer, reply: dict[str, np.ndarray],
                   wanted: Collection[str] | None = None) -> tuple[dict[str, np.ndarray], str]:
    """-> (the outputs by the ensemble's names, only those in `wanted` when given; dsa_llm's id
    for the request). Every output is a tensor to build and copy, and Triton drops those a client
    did not ask for anyway."""
    window, fields, request_id = reply_layout.unpack(reply)
    skip = bool(fields.pop("skip_special_tokens")[0])
    outputs = {name: value for name, value in fields.items() if wanted is None or name in wanted}
    if wanted is None or "text_output" in wanted:
        outputs["text_output"] = strings([window_text(tokenizer, window, skip)])
    if wanted is None or "top_tokens" in wanted:
        outputs["top_tokens"] = strings([tokenizer.decode([t], skip_special_tokens=False)
                                         for t in fields["top_token_ids"].tolist()])
    return outputs, request_id
