"""Synthetic requests: prompts of a fixed or sampled length, and output lengths.

Prompts are made of common English words, each one token in the DeepSeek vocabulary, so a prompt
of N words is about N tokens; the server reports the exact count (num_input_tokens).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be "
         "or has had not but one all new more first two after who they have their been also its time "
         "other into only over some most many year city when part during about them than up world "
         "under may later while where most well such state each made people would since between").split()


@dataclass(frozen=True)
class Request:
    prompt: str
    max_tokens: int
    # A conversation's later turns: each one's prompt is the turn before it, that turn's reply and
    # this text, as a chat client resends its history (which the prefix cache can serve).
    follow_ups: tuple[str, ...] = ()


def sample_length(rng: random.Random, mean: int, std: float) -> int:
    return mean if std <= 0 else max(1, round(rng.gauss(mean, std)))


def make_requests(n: int, input_len: int, output_len: int, input_std: float = 0, output_std: float = 0,
                  seed: int = 0, shared_prefix_len: int = 0, turns: int = 1) -> list[Request]:
    """`n` requests with input/output lengths drawn from normal distributions (fixed when std is 0),
    each prompt after the same shared_prefix_len words (a system prompt, for the prefix cache);
    with turns > 1, each is a conversation whose every later turn adds input_len words more."""
    if turns < 1:
        raise ValueError(f"turns must be 1 or more, got {turns}")
    rng = random.Random(seed)
    prefix = [rng.choice(WORDS) for _ in range(shared_prefix_len)]

    def words() -> list[str]:
        return [rng.choice(WORDS) for _ in range(sample_length(rng, input_len, input_std))]

    requests = []
    for _ in range(n):
        prompt, max_tokens = " ".join(prefix + words()), sample_length(rng, output_len, output_std)
        requests.append(Request(prompt, max_tokens, tuple(" ".join(words()) for _ in range(turns - 1))))
    return requests
