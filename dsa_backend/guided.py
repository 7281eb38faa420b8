"""Structured output: a request's guide (a JSON schema, any JSON, a regex, an EBNF grammar or a
choice of strings) limits each step's tokens to those its grammar allows next.

xgrammar compiles a guide against the checkpoint's vocabulary (its compiler caches what it
compiled) and a GrammarMatcher per request follows the output through the grammar. Each step the
matcher fills one bitmask row of the tokens allowed next, and the sampler sets every other logit to
-inf before bans, penalties and sampling (sampling.process_logits). The grammar's end admits only
the request's stop tokens, so a guided request stops when its output is complete.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

# tensorrtllm_backend's guide types (guided_decoding_guide_type), plus vLLM's choice
GUIDE_KINDS = ("json", "json_schema", "regex", "ebnf_grammar", "choice")
# vLLM's guided_decoding / structured_outputs keys -> our kinds
_VLLM_KEYS = {"json": "json_schema", "json_object": "json", "regex": "regex", "grammar": "ebnf_grammar",
              "choice": "choice"}


@dataclass(frozen=True)
class Guide:
    """What a request's output must match. `spec`: the JSON schema (text), regex or EBNF grammar
    (root rule `root`); for "choice", a JSON list of the allowed strings; unused for "json" (any
    JSON value). any_whitespace False puts JSON in one fixed layout (", " and ": "), which keeps a
    model from spinning in whitespace."""

    kind: str
    spec: str = ""
    any_whitespace: bool = True

    def __post_init__(self) -> None:
        if self.kind not in GUIDE_KINDS:
            raise ValueError(f"guided decoding: the guide type must be one of {', '.join(GUIDE_KINDS)}; "
                             f"got {self.kind!r}")
        if not isinstance(self.spec, str) or (self.kind != "json" and not self.spec):
            raise ValueError(f"guided decoding: a {self.kind} guide needs its {self.kind} as a non-empty string")
        if self.kind in ("json_schema", "choice"):
            try:
                value = json.loads(self.spec)
            except json.JSONDecodeError as e:
                raise ValueError(f"guided decoding: the {self.kind} is not valid JSON: {e}") from None
            if self.kind == "choice" and not (isinstance(value, list) and value
                                              and all(isinstance(s, str) and s for s in value)):
                raise ValueError("guided decoding: choice must be a non-empty list of non-empty strings")

    @classmethod
    def from_vllm(cls, fields: Any) -> Guide:
        """vLLM's guided_decoding (structured_outputs) object: exactly one of json (a schema, object
        or text), json_object, regex, grammar, choice; and disable_any_whitespace."""
        if not isinstance(fields, dict):
            raise ValueError("guided_decoding must be a JSON object such as {\"json\": {...schema...}}")
        unknown = sorted(set(fields) - set(_VLLM_KEYS) - {"disable_any_whitespace", "backend"})
        given = [k for k in _VLLM_KEYS if fields.get(k) not in (None, False)]
        if unknown or len(given) != 1:
            raise ValueError(f"guided_decoding must hold exactly one of {', '.join(_VLLM_KEYS)} "
                             f"(and optionally disable_any_whitespace); got keys {sorted(fields)}")
        key = given[0]
        value = fields[key]
        if key == "json_object":
            spec = ""
        elif key in ("json", "choice"):
            spec = value if isinstance(value, str) and key == "json" else json.dumps(value)
        else:
            spec = value
        return cls(_VLLM_KEYS[key], spec, any_whitespace=not fields.get("disable_any_whitespace", False))


class Grammars:
    """Compiles guides for one checkpoint's vocabulary and makes each request's matcher, on a thread
    of its own. The tokenizer's vocabulary is read and indexed on the first guide, not at start."""

    def __init__(self, model_dir: str, vocab_size: int):
        self.model_dir, self.vocab_size = model_dir, vocab_size

    @functools.cached_property
    def _compiler(self):
        return _xgrammar().GrammarCompiler(self._info, max_threads=1)

    @functools.cached_property
    def _info(self):
        return _tokenizer_info(self.model_dir, self.vocab_size)

    @functools.cached_property
    def _special(self) -> frozenset[int]:
        """Ids no grammar takes but as a stop token: special tokens and the model's padding ids."""
        return frozenset(self._info.special_token_ids)

    def compile(self, guide: Guide, stop_token_ids: Collection[int]) -> Future:
        """matcher() on the compile thread. A new guide's compile (30-90 ms on the H200 machine's
        host) and the first guide's import and vocabulary index (4-6 s there) would hold every
        request's steps if the engine's thread did them."""
        return self._thread.submit(self.matcher, guide, stop_token_ids)

    @functools.cached_property
    def _thread(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(1, thread_name_prefix="dsa-grammar")

    def matcher(self, guide: Guide, stop_token_ids: Collection[int]):
        """A matcher at the start of `guide`'s grammar, whose end admits `stop_token_ids`;
        ValueError naming the problem when the guide does not compile."""
        xgr = _xgrammar()
        try:
            compiled = self._compile(guide)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"guided decoding: the {guide.kind} does not compile: {e}") from None
        return xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_token_ids))

    def _compile(self, guide: Guide):
        compiler = self._compiler
        if guide.kind == "json":
            return compiler.compile_builtin_json_grammar()
        if guide.kind == "json_schema":
            return compiler.compile_json_schema(guide.spec, any_whitespace=guide.any_whitespace)
        if guide.kind == "regex":
            return compiler.compile_regex(guide.spec)
        if guide.kind == "choice":
            # json.dumps writes each string as an EBNF literal: quoted, with \" \\ \n escaped
            choices = json.loads(guide.spec)
            return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c, ensure_ascii=False)
                                                                    for c in choices))
        return compiler.compile_grammar(guide.spec)

    def token_bitmask(self, rows: Sequence[tuple[Any, Sequence[int]] | None]) -> torch.Tensor | None:
        """The tokens each row may take, as xgrammar's bitmask [rows, ceil(vocab / 32)] int32 (bit
        t % 32 of word t // 32); None when no row is guided. A row is (matcher, path): the tokens
        allowed after the matcher's output followed by `path` (a draft node's tokens). An unguided
        row (None), or one whose path the grammar refuses (a node never accepted), allows every token."""
        if all(row is None for row in rows):
            return None
        # One row at a time: xgrammar's BatchGrammarMatcher on 4 or 8 threads made an H200 host's
        # decode steps slower, not faster (docs/PERFORMANCE.md, "Guided decoding").
        bitmask = _xgrammar().allocate_token_bitmask(len(rows), self.vocab_size)  # every bit set
        for i, row in enumerate(rows):
            if row is None:
                continue
            matcher, path = row
            taken = 0
            for token in path:
                # a draft may be any id; xgrammar logs a warning for each special one it refuses
                if token in self._special and token not in matcher.stop_token_ids or not matcher.accept_token(token):
                    break
                taken += 1
            if taken == len(path) and not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, i)
            if taken:
                matcher.rollback(taken)
        return bitmask


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The bitmask unpacked to [rows, vocab_size] bool, on the bitmask's device. Unpacked by bytes:
    little-endian (x86, CUDA), byte b of word w holds tokens 32w + 8b .. 32w + 8b + 7, and the
    intermediate is one byte a token, not the four of shifting whole words."""
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmask.device)
    bits = (bitmask.view(torch.uint8).unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


@functools.lru_cache(maxsize=4)
def _tokenizer_info(model_dir: str, vocab_size: int):
    """xgrammar's view of the checkpoint's tokenizer, padded to the model's vocabulary (the ids past
    the tokenizer's are never allowed). Cached: engines of one checkpoint in a process share it."""
    from transformers import PreTrainedTokenizerFast

    from dsa_backend.tokenizer import Tokenizer

    tokenizer = Tokenizer(model_dir)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer.fast_tokenizer)
    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
    return _xgrammar().TokenizerInfo.from_huggingface(wrapped, vocab_size=vocab_size, stop_token_ids=stop)


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("guided decoding needs the xgrammar package (pip install xgrammar)") from None
    return xgrammar
