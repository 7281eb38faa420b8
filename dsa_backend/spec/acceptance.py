"""Accepting draft tokens against the target distribution, losslessly.

Drafts are the MTP layer's argmax, so the draft distribution q is one-hot at each draft token.
Speculative sampling then accepts draft d with probability min(1, p(d) / q(d)) = p(d) and, on
rejection, samples from normalize(max(p - q, 0)) = p with d removed; the emitted tokens follow p
exactly. Greedy rows have a one-hot p, which makes this the plain "longest matching prefix" rule.
"""

from __future__ import annotations

import torch


def accept_drafts(probs: torch.Tensor, drafts: list[int], generator: torch.Generator | None) -> list[int]:
    """probs [len(drafts) + 1, vocab] (target distribution at each verified position) ->
    the accepted drafts followed by one token from the target (a correction or the bonus)."""
    out: list[int] = []
    for i, draft in enumerate(drafts):
        u = torch.rand((), generator=generator, device=probs.device)
        if u < probs[i, draft]:
            out.append(draft)
            continue
        residual = probs[i].clone()
        residual[draft] = 0
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out
