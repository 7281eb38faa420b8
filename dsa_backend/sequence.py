"""One request's state as the engine sees it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from dsa_backend.sampling_params import SamplingParams
from dsa_backend.spec.tree import DraftTree
from dsa_backend.transfer import HostCopy


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


def with_pending_tokens(ids: torch.Tensor, pending: torch.Tensor) -> torch.Tensor:
    """ids with each token not read back yet, named -1 - row (Sequence.token_ids), replaced by
    pending[row]: the last step's sampled tokens, on the device, so that nothing waits for them."""
    return torch.where(ids >= 0, ids, pending[(-1 - ids).clamp_min(0)])


@dataclass(eq=False)
class Sequence:
    """Prompt and output ids, the KV pages holding them, and how many tokens those pages hold.

    num_computed counts tokens whose KV is in the cache; the rest (the prompt on admission, the
    last sampled token in decode, everything after a retraction) is computed by the next steps.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int
    priority: int = 0               # a lower number is served first (scheduler.py)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    # prompt_logprobs: the logprobs of prompt tokens 1 .. num_prompt_logprobs, one part a chunk,
    # on their way to the host until the request's first output reads them
    prompt_logprob_parts: list[HostCopy] = field(default_factory=list)
    num_prompt_logprobs: int = 0
    pages: list[int] = field(default_factory=list)
    num_held_pages: int = 0         # leading pages held through the prefix cache (shared, read-only)
    page_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its whole pages so far
    num_computed: int = 0
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache at its first admission
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    draft: DraftTree | None = None                       # speculative tokens to verify next step
    num_draft_tokens: int = 0                            # drafted so far (for acceptance stats)
    num_accepted_draft_tokens: int = 0
    matcher: Any = None             # guided decoding: xgrammar's GrammarMatcher at the output's end (guided.py)
    error: str | None = None        # why the request ended with finish_reason "error"
    # Overlap scheduling: output tokens sampled but not yet read back, each named by its row in
    # the sampled tokens of the step that made it (on the GPU, where the next step reads it).
    pending_rows: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) + len(self.pending_rows)

    @property
    def output_is_complete(self) -> bool:
        """max_tokens tokens are sampled, so nothing is left to compute: the request ends once
        the last of them is read back."""
        return len(self.output_ids) + len(self.pending_rows) >= self.params.max_tokens

    @property
    def prompt_logprobs_left(self) -> bool:
        return self.params.prompt_logprobs and self.num_prompt_logprobs < len(self.prompt_ids) - 1

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids in [start, end) of prompt followed by output. A pending token reads
        -1 - row: the step that consumes it takes it from the GPU, at that row."""
        prompt_len = len(self.prompt_ids)
        if end <= prompt_len:
            return self.prompt_ids[start:end]
        # slice each part: a decode step asks for one token of a long context, every step
        ids = self.prompt_ids[start:] + self.output_ids[max(0, start - prompt_len):end - prompt_len]
        known = prompt_len + len(self.output_ids)
        if end > known:
            ids += [-1 - row for row in self.pending_rows[max(0, start - known):end - known]]
        return ids

    def output_so_far(self, extra: list[int] | tuple[int, ...] = ()) -> OutputSoFar:
        """The output as the sampler reads it (penalties, min_tokens, bad words), without a copy."""
        return OutputSoFar(self, extra)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


class OutputSoFar:
    """A request's output as the sampler reads it: the tokens read back, the ones still on the
    GPU (named -1 - row, as Sequence.token_ids names them), then `extra` (a draft node's path).
    A view, not a copy: the sampler asks for its length and its newest tokens only (the penalty
    counts catch up with what they have not seen, a bad word looks at the tail), and copying a
    long output for every penalized request every step would cost the host O(output) a step."""

    def __init__(self, seq: Sequence, extra: list[int] | tuple[int, ...] = ()):
        self.seq, self.extra = seq, extra

    def __len__(self) -> int:
        return len(self.seq.output_ids) + len(self.seq.pending_rows) + len(self.extra)

    def __getitem__(self, index: slice) -> list[int]:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("an output view is sliced in order")
        base = len(self.seq.prompt_ids)
        own = self.seq.num_tokens - base   # the request's own output, read back or not
        head = self.seq.token_ids(base + start, base + min(stop, own)) if start < own else []
        return head + list(self.extra[max(0, start - own):max(0, stop - own)])
