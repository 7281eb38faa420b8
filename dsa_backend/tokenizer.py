"""The checkpoint's tokenizer: tokenizer.json through `tokenizers`, plus tokenizer_config.json.

transformers' AutoTokenizer mis-encodes the DeepSeek files (it returns one id for
'Hello 世界 🎉'), so the fast tokenizer is loaded directly and the few things the config adds
(bos/eos tokens, add_bos_token, the chat template) are read here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from tokenizers import Tokenizer as _FastTokenizer


class Tokenizer:
    """Encode and decode text for one checkpoint directory."""

    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the checkpoint directory needs its tokenizer.json")
        self._tok = _FastTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.add_bos_token = bool(config.get("add_bos_token", False))
        self.chat_template: str | None = config.get("chat_template")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`, with the BOS token first when `add_bos` and the config ask for it."""
        ids = self._ids(text)
        if add_bos and self.add_bos_token and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; incomplete UTF-8 decodes to U+FFFD, ids outside the vocabulary to nothing."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def fast_tokenizer(self) -> _FastTokenizer:
        """The `tokenizers` object itself (guided decoding indexes its vocabulary)."""
        return self._tok

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role": ..., "content": ...}, ...]) with the checkpoint's template.

        The rendered text already holds the BOS token, so encode it with `encode_chat`.
        """
        if not self.chat_template:
            raise ValueError("messages: this checkpoint's tokenizer_config.json has no chat_template")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages) or not messages:
            raise ValueError('messages must be a non-empty JSON list of {"role": str, "content": str} objects')
        return _compile(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a rendered chat; special tokens in the template become their ids."""
        return self._ids(self.apply_chat_template(messages, add_generation_prompt))

    def _ids(self, text: str) -> list[int]:
        # encode_batch lets go of the GIL while it encodes, and encode does not: a server's other
        # threads (dsa_llm's sender, its other tokenizing threads) run meanwhile.
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids


def _token_content(token: Any) -> str | None:
    # tokenizer_config.json holds either "…" or {"__type": "AddedToken", "content": "…", ...}
    if isinstance(token, dict):
        return token.get("content")
    return token


_TEMPLATES: dict[str, Any] = {}


def _compile(source: str):
    # Compiling a chat template costs milliseconds; the preprocessing model renders one per request.
    if source not in _TEMPLATES:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        _TEMPLATES[source] = env.from_string(source)
    return _TEMPLATES[source]
