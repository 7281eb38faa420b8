"""Batched next-token sampler: bans, penalties, then greedy or filtered random sampling.

Each row goes through these stages in order, every stage seeing what the previous one left:
  0. a guided request's grammar (guided.py): every token it does not allow next -> -inf.
  0b. logit_bias: each listed token's bias added to its logit.
  1. bans -> -inf: each one-token bad word; the last token of a longer bad word when the context
     (prompt + output) ends with the rest of it; and, while fewer than min_tokens outputs exist,
     the tokens that would stop the request (stop_token_ids, and eos unless ignore_eos).
  2. repetition_penalty over prompt + output tokens: positive logits divided, the rest multiplied.
  3. frequency and presence penalties over output tokens: logit -= f * count + p * (count > 0).
  The result is the *processed* logits. Greedy rows (temperature 0) take their argmax, lowest
  index on ties. Logprobs are log_softmax(processed)[chosen token], and top_logprobs that row's
  largest entries: after bans and penalties, before temperature and truncation, so greedy and
  sampled rows report the same quantity.
  4. sampled rows: divide by temperature; keep the top_k largest (ties by lowest index), then the
     smallest prefix whose probability reaches top_p (on the top-k renormalized distribution),
     then the tokens whose probability is >= min_p times the largest; draw one.

Drawing is an exponential race, argmax(probs / q) with q ~ Exp(1), where a seeded row's q comes
from its own generator alone: its tokens do not depend on the rest of the batch or its order.
Nothing here waits for the device; the engine reads SamplerOutput once per step.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from dsa_backend.guided import allowed_tokens
from dsa_backend.sampling_params import SamplingParams
from dsa_backend.token_counts import TokenCounts
from dsa_backend.transfer import to_device

# Logits divided by less can overflow float32 to inf and softmax to NaN; sampling that cold is
# argmax anyway (vLLM's sampler uses the same floor).
_MIN_TEMPERATURE = 1e-5


class SamplingRow(NamedTuple):
    """One request's state for this step, as the engine holds it (token ids: lists or arrays).

    With overlap scheduling the output may end with tokens sampled but not read back yet, each
    named -1 - i: entry i of the `pending` tensor given to SamplingBatch.build. They count towards
    min_tokens and penalties; a bad word of several tokens cannot be matched against them.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    # make_generator(params.seed, device), kept for the request's lifetime; None: the engine's.
    generator: torch.Generator | None = None
    # The request, for counts kept across steps (TokenCounts); rows of one request share them.
    key: Hashable | None = None


class TokenLogprobs(NamedTuple):
    """Logprobs of a step's rows under their processed logits, on the device."""

    chosen: torch.Tensor                # [rows] float32, each row's chosen token's
    top_values: torch.Tensor | None     # [rows, k] float32, the k most likely tokens', most likely first
    top_ids: torch.Tensor | None        # [rows, k] int64; both None when no row asks (k 0)


class SamplerOutput(NamedTuple):
    token_ids: torch.Tensor  # [batch] int64, on the logits' device
    logprobs: TokenLogprobs | None  # None when no row asked for logprobs or top_logprobs


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A request's own generator, seeded from `seed`; None for unseeded requests."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def check_vocab(params: SamplingParams, vocab_size: int) -> None:
    """Raise ValueError if a token id in `params` is outside [0, vocab_size); call it on submit."""
    for word in params.bad_words_ids:
        if not word or not all(0 <= t < vocab_size for t in word):
            raise ValueError(f"bad_words_ids entries must be non-empty lists of token ids in "
                             f"[0, {vocab_size}), got {list(word)}")
    for t in params.stop_token_ids:
        if t >= vocab_size:
            raise ValueError(f"stop_token_ids must be in [0, {vocab_size}), got {t}")
    for t, _ in params.logit_bias:
        if not 0 <= t < vocab_size:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab_size}), got {t}")


@dataclass(frozen=True)
class Penalties:
    """Penalty inputs; rows without penalties see no tokens."""

    repetition: torch.Tensor  # [batch, 1] float32, 1 = off
    frequency: torch.Tensor  # [batch, 1] float32
    presence: torch.Tensor  # [batch, 1] float32
    in_prompt: torch.Tensor  # [batch, vocab] bool
    output_counts: torch.Tensor  # [batch, vocab] float32


@dataclass(frozen=True)
class SamplingBatch:
    """Per-row sampling state on the logits' device, built by the engine once per step.

    Row i describes logits row i. The bool flags are host-side so that `sample` skips unused
    stages without reading the device.
    """

    vocab_size: int
    temperature: torch.Tensor  # [batch] float32, 0 = greedy
    top_k: torch.Tensor  # [batch] int64, vocab_size when off
    top_p: torch.Tensor  # [batch] float32, inf when off so float rounding never cuts the tail
    log_min_p: torch.Tensor  # [batch] float32, log(min_p); -inf when off
    allowed: torch.Tensor | None  # [batch, vocab] bool, the tokens guides allow; None when no row is guided
    ban_rows: torch.Tensor | None  # [bans] int64, with ban_tokens: the (row, token) set to -inf
    ban_tokens: torch.Tensor | None  # [bans] int64
    bias_rows: torch.Tensor | None  # [biases] int64, with bias_tokens and bias_values: logit_bias
    bias_tokens: torch.Tensor | None  # [biases] int64
    bias_values: torch.Tensor | None  # [biases] float32
    penalties: Penalties | None  # None when no row has a penalty
    seeded: tuple[tuple[int, torch.Generator], ...]  # (row, generator) of seeded sampled rows
    all_greedy: bool
    any_greedy: bool
    any_unseeded_sampled: bool
    use_sorted_filters: bool  # a sampled row has top_k or top_p
    use_min_p: bool  # a sampled row has min_p
    return_logprobs: bool     # a row asked for logprobs or top_logprobs
    top_logprobs: int         # the rows' largest top_logprobs

    @property
    def size(self) -> int:
        return self.temperature.shape[0]

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int, eos_token_ids: Collection[int],
              device: torch.device | str, pending: torch.Tensor | None = None,
              counts: TokenCounts | None = None, token_bitmask: torch.Tensor | None = None) -> SamplingBatch:
        """Gather `rows` (one per logits row) into tensors on `device`; `pending` [n] on `device`:
        the output tokens the rows name -1 - i (SamplingRow). `counts`: the penalties' counts
        kept across steps, for rows with keys; None counts these rows afresh. `token_bitmask`:
        Grammars.token_bitmask's [rows, words] on the host, or None."""
        device = torch.device(device)
        params = [row.params for row in rows]
        sampled = [not p.greedy for p in params]
        ban_rows: list[int] = []
        ban_tokens: list[int] = []
        for i, row in enumerate(rows):
            check_vocab(row.params, vocab_size)
            if row.generator is not None and row.generator.device.type != device.type:
                raise ValueError(f"row {i}: generator is on {row.generator.device}, "
                                 f"logits on {device}")
            banned = _banned_tokens(row, eos_token_ids)
            ban_rows += [i] * len(banned)
            ban_tokens += sorted(banned)

        def put(values: list, dtype: torch.dtype) -> torch.Tensor:
            return to_device(torch.tensor(values, dtype=dtype), device)

        has_bans = bool(ban_tokens)
        biases = [(i, token, value) for i, p in enumerate(params) for token, value in p.logit_bias]
        bias_rows, bias_tokens, bias_values = zip(*biases) if biases else ((), (), ())
        return cls(
            vocab_size=vocab_size,
            temperature=put([0.0 if p.greedy else max(p.temperature, _MIN_TEMPERATURE)
                             for p in params], torch.float32),
            top_k=put([p.top_k or vocab_size for p in params], torch.int64),
            top_p=put([p.top_p if p.top_p < 1 else math.inf for p in params], torch.float32),
            log_min_p=put([math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params],
                          torch.float32),
            allowed=(allowed_tokens(to_device(token_bitmask, device), vocab_size)
                     if token_bitmask is not None else None),
            ban_rows=put(ban_rows, torch.int64) if has_bans else None,
            ban_tokens=put(ban_tokens, torch.int64) if has_bans else None,
            bias_rows=put(bias_rows, torch.int64) if biases else None,
            bias_tokens=put(bias_tokens, torch.int64) if biases else None,
            bias_values=put(bias_values, torch.float32) if biases else None,
            penalties=_penalties(rows, vocab_size, device, pending, counts),
            seeded=tuple((i, row.generator) for i, row in enumerate(rows)
                         if sampled[i] and row.generator is not None),
            all_greedy=not any(sampled),
            any_greedy=not all(sampled),
            any_unseeded_sampled=any(s and row.generator is None for s, row in zip(sampled, rows)),
            use_sorted_filters=any(s and (0 < p.top_k < vocab_size or p.top_p < 1)
                                   for s, p in zip(sampled, params)),
            use_min_p=any(s and p.min_p > 0 for s, p in zip(sampled, params)),
            return_logprobs=any(p.logprobs or p.top_logprobs for p in params),
            top_logprobs=max((p.top_logprobs for p in params), default=0),
        )


def sample(logits: torch.Tensor, batch: SamplingBatch,
           generator: torch.Generator | None = None) -> SamplerOutput:
    """Pick one token per row of logits [batch, vocab]; `generator` serves unseeded rows."""
    if logits.shape != (batch.size, batch.vocab_size):
        raise ValueError(f"logits must be [{batch.size}, {batch.vocab_size}] to match the "
                         f"sampling batch, got {list(logits.shape)}")
    processed = process_logits(logits.float(), batch)
    if batch.all_greedy:
        token_ids = processed.argmax(dim=-1)
    else:
        token_ids = _draw(processed, batch, generator)
        if batch.any_greedy:
            token_ids = torch.where(batch.temperature == 0, processed.argmax(dim=-1), token_ids)
    logprobs = token_logprobs(processed, token_ids, batch.top_logprobs) if batch.return_logprobs else None
    return SamplerOutput(token_ids, logprobs)


def token_logprobs(processed: torch.Tensor, token_ids: torch.Tensor, top: int) -> TokenLogprobs:
    """log_softmax of processed logits [rows, vocab] at token_ids [rows], and each row's `top`
    largest entries."""
    log_probs = processed.log_softmax(dim=-1)
    chosen = log_probs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    if not top:
        return TokenLogprobs(chosen, None, None)
    return TokenLogprobs(chosen, *log_probs.topk(top, dim=-1))


def process_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Stages 0-3 (guides, logit_bias, bans, repetition, frequency/presence) on [batch, vocab]
    float32, out of place."""
    if batch.allowed is not None:
        logits = logits.masked_fill(~batch.allowed, -math.inf)
    if batch.bias_rows is not None:
        logits = logits.index_put((batch.bias_rows, batch.bias_tokens), batch.bias_values, accumulate=True)
    if batch.ban_rows is not None:
        logits = logits.index_put((batch.ban_rows, batch.ban_tokens),
                                  logits.new_full((), -math.inf))
    pen = batch.penalties
    if pen is None:
        return logits
    in_output = pen.output_counts > 0
    repeated = torch.where(logits > 0, logits / pen.repetition, logits * pen.repetition)
    logits = torch.where(in_output | pen.in_prompt, repeated, logits)
    return logits - pen.frequency * pen.output_counts - pen.presence * in_output


def truncate_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Stage 4's filters: -inf outside each row's top_k, then top_p, then min_p support."""
    if batch.use_sorted_filters:
        # Stable sort: among equal logits the lowest token id ranks first, so top_k is exact.
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
        rank = torch.arange(batch.vocab_size, device=logits.device)
        keep = rank < batch.top_k.unsqueeze(1)
        probs = sorted_logits.masked_fill(~keep, -math.inf).softmax(dim=-1)
        mass_before = F.pad(probs.cumsum(dim=-1)[:, :-1], (1, 0))
        keep &= mass_before < batch.top_p.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(~keep, -math.inf)
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    if batch.use_min_p:
        # p_i >= min_p * p_max  <=>  logit_i - logit_max >= log(min_p); no softmax needed.
        gap = logits - logits.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(gap < batch.log_min_p.unsqueeze(1), -math.inf)
    return logits


def sampling_probs(processed: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution stage 4 draws from, [batch, vocab]; greedy rows get a one-hot at the argmax.

    Speculative decoding accepts draft tokens against exactly this distribution.
    """
    temperature = torch.where(batch.temperature > 0, batch.temperature, 1.0).unsqueeze(1)
    probs = truncate_logits(processed / temperature, batch).softmax(dim=-1)
    if batch.any_greedy:
        one_hot = F.one_hot(processed.argmax(dim=-1), batch.vocab_size).to(probs.dtype)
        probs = torch.where((batch.temperature == 0).unsqueeze(1), one_hot, probs)
    return probs


def _draw(processed: torch.Tensor, batch: SamplingBatch,
          generator: torch.Generator | None) -> torch.Tensor:
    """Stage 4 for every row ([batch] int64); greedy rows' results are discarded by the caller."""
    temperature = torch.where(batch.temperature > 0, batch.temperature, 1.0).unsqueeze(1)
    probs = truncate_logits(processed / temperature, batch).softmax(dim=-1)
    q = torch.empty_like(probs)
    if batch.any_unseeded_sampled:
        q.exponential_(generator=generator)
    else:
        q.fill_(1.0)
    for row, row_generator in batch.seeded:
        q[row].exponential_(generator=row_generator)
    # A zero draw would turn a filtered-out token's 0 / 0 into NaN, which argmax picks.
    return (probs / q.clamp_min_(torch.finfo(q.dtype).tiny)).argmax(dim=-1)


def _banned_tokens(row: SamplingRow, eos_token_ids: Collection[int]) -> set[int]:
    """Token ids stage 1 sets to -inf for this row."""
    params = row.params
    banned = {word[-1] for word in params.bad_words_ids
              if _context_ends_with(row.prompt_token_ids, row.output_token_ids, word[:-1])}
    if len(row.output_token_ids) < params.min_tokens:
        banned.update(params.stop_token_ids)
        if not params.ignore_eos:
            banned.update(eos_token_ids)
    return banned


def _context_ends_with(prompt: Sequence[int], output: Sequence[int],
                       suffix: Sequence[int]) -> bool:
    """Whether prompt + output ends with `suffix`, without concatenating a long prompt."""
    n = len(suffix)
    if n > len(prompt) + len(output):
        return False
    from_output = min(n, len(output))
    tail = list(prompt[len(prompt) - (n - from_output):]) + list(output[len(output) - from_output:])
    if any(t < 0 for t in tail):
        raise RuntimeError("a bad word of several tokens is matched against output tokens not read back yet")
    return tail == list(suffix)


def _penalties(rows: Sequence[SamplingRow], vocab_size: int, device: torch.device,
               pending: torch.Tensor | None, counts: TokenCounts | None) -> Penalties | None:
    params = [row.params for row in rows]
    any_penalty = [p.repetition_penalty != 1 or p.frequency_penalty != 0 or p.presence_penalty != 0
                   for p in params]
    if not any(any_penalty):
        return None
    if counts is None:
        counts = TokenCounts(len(rows), vocab_size, device)
        keys = [i if a else None for i, a in enumerate(any_penalty)]
    else:
        keys = [row.key if a else None for row, a in zip(rows, any_penalty)]
        if None in [key for key, a in zip(keys, any_penalty) if a]:
            raise ValueError("rows with penalties need a key to keep their counts across steps")

    factors = to_device(torch.tensor([[p.repetition_penalty, p.frequency_penalty, p.presence_penalty]
                                      for p in params], dtype=torch.float32), device)
    seen = counts.rows(keys, [row.prompt_token_ids for row in rows], [row.output_token_ids for row in rows],
                       pending)
    return Penalties(repetition=factors[:, 0:1], frequency=factors[:, 1:2], presence=factors[:, 2:3],
                     in_prompt=seen.in_prompt, output_counts=seen.output_counts)
