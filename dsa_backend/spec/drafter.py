"""MTP drafting: catch the draft layer up on verified tokens, then chain num_steps drafts.

DRAFT_EXTEND runs the MTP layer over the positions the target just verified (or prefilled): at
position i it sees the target's hidden state h_i and the token at i + 1, writing its own KV. Its
last row predicts the first draft; each further step feeds the previous draft and the MTP layer's
own hidden state (EAGLE-style) one position on. Every MTP KV row a draft step writes is rewritten
by a later DRAFT_EXTEND before it is read as verified history.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsa_backend.batch import ForwardBatch, ForwardMode
from dsa_backend.cache import KVCache
from dsa_backend.models import DsaForCausalLM
from dsa_backend.sequence import Sequence
from dsa_backend.spec.config import SpecConfig


@dataclass(frozen=True)
class DraftInput:
    """One request's verified span: MTP positions start.., the tokens one position ahead, and
    the target's hidden [n, hidden] and last-layer top-k [n, index_topk] at those positions."""

    seq: Sequence
    start: int
    tokens: list[int]
    hidden: torch.Tensor
    topk: torch.Tensor
    wants_drafts: bool


class MtpDrafter:
    def __init__(self, model: DsaForCausalLM, cache: KVCache, spec: SpecConfig, page_size: int,
                 device: torch.device):
        self.model, self.cache, self.spec = model, cache, spec
        self.page_size, self.device = page_size, device

    def draft(self, items: list[DraftInput]) -> None:
        """Run DRAFT_EXTEND for every item; set seq.draft_ids of those that want drafts."""
        if not items:
            return
        batch = ForwardBatch.build(ForwardMode.DRAFT_EXTEND, [it.tokens for it in items],
                                   [it.start for it in items], [it.seq.pages for it in items],
                                   self.page_size, self.device)
        # Reusing the target's top-k is valid here: same positions, same causal history.
        topk = torch.cat([it.topk for it in items]) if self.spec.reuse_topk else None
        out = self.model.forward_mtp(batch, self.cache, torch.cat([it.hidden for it in items]), topk)
        wanted = [i for i, it in enumerate(items) if it.wants_drafts]
        if not wanted:
            return
        last_rows = batch.logits_rows[wanted]
        drafts = [[t] for t in out.logits[wanted].argmax(dim=-1).tolist()]
        hidden, topk = out.hidden[last_rows], out.topk[last_rows]
        seqs = [items[i].seq for i in wanted]
        positions = [items[i].start + len(items[i].tokens) for i in wanted]
        for step in range(1, self.spec.num_steps):
            batch = ForwardBatch.build(ForwardMode.DECODE, [[d[-1]] for d in drafts],
                                       [p + step - 1 for p in positions], [s.pages for s in seqs],
                                       self.page_size, self.device)
            # Chain only: each row continues the previous one, so its top-k is a valid (older) selection.
            out = self.model.forward_mtp(batch, self.cache, hidden, topk if self.spec.reuse_topk else None)
            for d, t in zip(drafts, out.logits.argmax(dim=-1).tolist()):
                d.append(t)
            hidden, topk = out.hidden, out.topk
        for seq, d in zip(seqs, drafts):
            seq.draft_ids = d
