"""The penalties' view of each request, kept on the device across steps.

A request with a penalty owns a slot: its prompt tokens as a set (repetition_penalty) and its
output tokens as counts (frequency and presence; repetition too). Each step a slot catches up
with the tokens its request gained since the last one, usually one, so a step's cost no longer
grows with the prompt and output: rebuilding both from the host's lists every step took 3.4-7.4
ms of host time at batch 32 with 2K-token prompts, 0.6 ms now (docs/PERFORMANCE.md, "Penalty
counts kept across steps").

Slot 0 stays empty for rows without penalties. Other slots go to requests least recently used
first; a request whose slot was taken is rebuilt from its lists the next time it is sampled, so
dropping a slot is never wrong, only slower.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from dsa_backend.sequence import with_pending_tokens
from dsa_backend.transfer import fields_to_device


@dataclass
class _Slot:
    index: int
    num_counted: int  # output tokens already in the slot's counts


@dataclass(frozen=True)
class RowCounts:
    """What the penalties read for a step's rows, [rows, vocab] each."""

    in_prompt: torch.Tensor  # bool
    output_counts: torch.Tensor  # float32; exact below 2**24 occurrences


class TokenCounts:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device | str):
        self.num_slots = num_slots
        self.in_prompt = torch.zeros(num_slots + 1, vocab_size, dtype=torch.bool, device=device)
        self.output_counts = torch.zeros(num_slots + 1, vocab_size, dtype=torch.float32, device=device)
        self._slots: OrderedDict[Hashable, _Slot] = OrderedDict()  # least recently used first
        self._free = list(range(num_slots, 0, -1))

    def rows(self, keys: Sequence[Hashable | None], prompts: Sequence[Sequence[int]],
             outputs: Sequence[Sequence[int]], pending: torch.Tensor | None = None) -> RowCounts:
        """Counts for rows named by request keys (None: a row without penalties).

        Rows of one key see that request's prompt and their own output. A request's slot takes
        the output all its rows share (the shortest); a row's tokens past it (a draft tree node's
        path) are added to that row's copy alone. Output tokens may be unread placeholders,
        -1 - i for pending[i] (sequence.with_pending_tokens).
        """
        shared: dict[Hashable, int] = {}
        for key, output in zip(keys, outputs):
            if key is not None:
                shared[key] = min(shared.get(key, len(output)), len(output))
        if len(shared) > self.num_slots:
            raise RuntimeError(f"{len(shared)} requests with penalties in one step; the sampler keeps "
                               f"counts for {self.num_slots} (max_running_requests)")
        first_row = {}
        for i, key in enumerate(keys):
            first_row.setdefault(key, i)
        resets, prompt_at, prompt_tokens, new_at, new_tokens = [], [], [], [], []
        for key, length in shared.items():
            i = first_row[key]
            slot = self._slots.pop(key, None)
            if slot is None or slot.num_counted > length:
                slot = _Slot(slot.index if slot else self._take_slot(shared), 0)
                resets.append(slot.index)
                prompt_at += [slot.index] * len(prompts[i])
                prompt_tokens += prompts[i]
            self._slots[key] = slot  # now the most recently used
            fresh = outputs[i][slot.num_counted:length]
            new_at += [slot.index] * len(fresh)
            new_tokens += fresh
            slot.num_counted = length
        row_slots = [0 if key is None else self._slots[key].index for key in keys]
        extra_at, extra_tokens = [], []
        for i, (key, output) in enumerate(zip(keys, outputs)):
            if key is not None:
                extra = output[shared[key]:]
                extra_at += [i] * len(extra)
                extra_tokens += extra
        (resets, prompt_at, prompt_tokens, new_at, new_tokens, row_slots, extra_at,
         extra_tokens) = fields_to_device([resets, prompt_at, prompt_tokens, new_at, new_tokens, row_slots, extra_at,
                                           extra_tokens], torch.long, self.in_prompt.device)
        if len(resets):
            self.in_prompt[resets] = False
            self.output_counts[resets] = 0
        if len(prompt_at):
            self.in_prompt[prompt_at, prompt_tokens] = True
        if len(new_at):
            _count(self.output_counts, new_at, new_tokens, pending)
        counts = self.output_counts[row_slots]
        if len(extra_at):
            _count(counts, extra_at, extra_tokens, pending)
        return RowCounts(self.in_prompt[row_slots], counts)

    def _take_slot(self, wanted: dict[Hashable, int]) -> int:
        """A free slot, else the least recently used one of a request not in this step."""
        if self._free:
            return self._free.pop()
        victim = next(key for key in self._slots if key not in wanted)
        return self._slots.pop(victim).index


def _count(counts: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor,
           pending: torch.Tensor | None) -> None:
    """counts[rows[i], tokens[i]] += 1 for each i, placeholders resolved from `pending`."""
    if pending is not None:
        tokens = with_pending_tokens(tokens, pending)
    # Adding ones is exact below 2**24, so the atomic adds' order cannot change the result.
    counts.view(-1).index_add_(0, rows * counts.shape[1] + tokens,
                               torch.ones(tokens.shape, dtype=counts.dtype, device=counts.device))

