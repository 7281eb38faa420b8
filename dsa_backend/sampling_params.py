"""Per-request sampling parameters, with vLLM's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsa_backend.guided import Guide

MAX_SAMPLES = 256   # n: a bound on how many requests one request may become
MAX_TOP_LOGPROBS = 20   # OpenAI's bound


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled and when it stops.

    temperature 0 means greedy. top_k 0 and top_p 1 disable those filters. Every field is checked
    here, where it enters, and a bad value raises ValueError naming the field and its range.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    # (token id, bias) pairs added to those tokens' logits (OpenAI's and vLLM's logit_bias, a
    # {token id: bias} dict is taken too); -100 all but bans a token, 100 all but forces it
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    # the most likely tokens at each output position, with their logprobs (OpenAI's top_logprobs,
    # vLLM's logprobs count), 0 to MAX_TOP_LOGPROBS
    top_logprobs: int = 0
    prompt_logprobs: bool = False           # each prompt token's logprob under the raw logits (scoring)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    guided_decoding: Guide | None = None    # structured output (guided.py); vLLM's dict is taken too
    n: int = 1                              # samples of the prompt, each a request of its own (samples())

    def __post_init__(self) -> None:
        # Accept lists from callers (JSON, tritonclient) but keep the dataclass hashable-ish.
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value or ()))
        object.__setattr__(self, "bad_words_ids", tuple(tuple(w) for w in self.bad_words_ids or ()))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.guided_decoding is not None and not isinstance(self.guided_decoding, Guide):
            object.__setattr__(self, "guided_decoding", Guide.from_vllm(self.guided_decoding))
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1,
               f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(isinstance(self.top_k, int) and self.top_k >= 0,
               f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        _check(self.repetition_penalty > 0,
               f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check(-2 <= self.presence_penalty <= 2,
               f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        _check(-2 <= self.frequency_penalty <= 2,
               f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        _check(isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
               f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        _check(isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
               f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs!r}")
        _check(isinstance(self.n, int) and 1 <= self.n <= MAX_SAMPLES,
               f"n (num_return_sequences) must be an integer in [1, {MAX_SAMPLES}], got {self.n!r}")
        _check(self.seed is None or isinstance(self.seed, int),
               f"seed must be an integer, got {self.seed!r}")
        _check(all(isinstance(s, str) and s for s in self.stop),
               "stop must be a list of non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids must be non-negative integers")
        # the grammar's end admits only stop tokens, which these would ban or ignore
        _check(self.guided_decoding is None or (self.min_tokens == 0 and not self.ignore_eos),
               "min_tokens and ignore_eos cannot be combined with guided decoding: the guide decides "
               "where the output ends")

    def samples(self) -> list[SamplingParams]:
        """The parameters of each of the n samples, n = 1 each. They run as requests of their own,
        and the scheduler has them compute the prompt once (scheduler.py). A seeded request's
        sample i draws from seed + i, so that the samples differ and each can be reproduced."""
        # The prompt's logprobs are the same for every sample: the first one computes them.
        return [replace(self, n=1, seed=None if self.seed is None else self.seed + i,
                        prompt_logprobs=self.prompt_logprobs and i == 0) for i in range(self.n)]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def matches_output_on_host(self) -> bool:
        """Whether sampling compares the output's last tokens with something on the host: a bad
        word of several tokens bans its last one where the output ends with the rest."""
        return any(len(word) > 1 for word in self.bad_words_ids)

    @property
    def reads_output(self) -> bool:
        """Whether sampling looks at the output so far: min_tokens, bad words or a penalty."""
        return (self.min_tokens > 0 or bool(self.bad_words_ids) or self.repetition_penalty != 1
                or self.frequency_penalty != 0 or self.presence_penalty != 0)


def _bias_pairs(bias) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs; JSON's string keys ("123") are token ids too."""
    items = bias.items() if isinstance(bias, dict) else bias or ()
    try:
        pairs = tuple(sorted((int(token), float(value)) for token, value in items))
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
    _check(all(-100 <= value <= 100 for _, value in pairs), "logit_bias values must be in [-100, 100]")
    _check(len({token for token, _ in pairs}) == len(pairs), "logit_bias names a token id twice")
    return pairs


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
