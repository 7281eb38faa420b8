"""A request's text inputs as token ids: text_input or chat messages -> prompt token ids, bad words ->
token ids. preprocessing does this for the ensemble; dsa_llm for text sent straight to it."""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from dsa_backend.tokenizer import Tokenizer


def decode_utf8(value: bytes | str, name: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} is not valid UTF-8 (byte {e.start}: {value[e.start:e.start + 4]!r})") from None


def prompt_token_ids(tokenizer: Tokenizer, text_input: np.ndarray | None,
                     messages: np.ndarray | None = None) -> list[int]:
    """Token ids of the prompt: the chat template over `messages` when given, else `text_input`."""
    if messages is not None and messages.size:
        if messages.size != 1:
            raise ValueError(f"messages must be one JSON string, got {messages.size}")
        raw = decode_utf8(messages.reshape(-1)[0], "messages")
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"messages is not valid JSON: {e}") from None
        return tokenizer.encode_chat(parsed)
    if text_input is None or text_input.size == 0:
        raise ValueError("text_input is required")
    if text_input.size != 1:
        raise ValueError(f"text_input must hold one string, got shape {list(text_input.shape)}")
    text = decode_utf8(text_input.reshape(-1)[0], "text_input")
    if not text:
        raise ValueError("text_input is empty")
    return tokenizer.encode(text)


def bad_words_ids(tokenizer: Tokenizer, words: np.ndarray | None) -> np.ndarray:
    """tensorrtllm_backend's [2, N] int32 layout: ids of all words, then each word's end offset.

    An empty list gives shape [2, 0].
    """
    ids: list[int] = []
    ends: list[int] = []
    for word in [] if words is None else words.reshape(-1):
        text = decode_utf8(word, "bad_words")
        if text:
            ids += tokenizer.encode(text, add_bos=False)
            ends.append(len(ids))
    ends += [-1] * (len(ids) - len(ends))
    return np.array([ids, ends], dtype=np.int32).reshape(2, len(ids))


def tokenized(tokenizer: Tokenizer, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A request's text inputs as dsa_llm's token inputs: the prompt (text_input, or chat
    messages) as input_ids, bad_words as bad_words_ids."""
    ids = prompt_token_ids(tokenizer, inputs.get("text_input"), inputs.get("messages"))
    return {"input_ids": np.array(ids, dtype=np.int32), "bad_words_ids": bad_words_ids(tokenizer, inputs.get("bad_words"))}
